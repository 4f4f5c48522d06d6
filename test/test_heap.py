"""The freed heap goes back to the system (server/heap.py)."""

import platform

import psutil
import pytest
import torch

from timebill_ros.server.heap import HeapTrimmer, release_free_heap, resident_mb


class Clock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self):
        return self.now_s


def test_the_trimmer_releases_at_most_once_a_period():
    clock, calls = Clock(), []
    trimmer = HeapTrimmer(idle_period_s=1.0, busy_period_s=30.0, clock=clock,
                          release=lambda: calls.append(clock.now_s) or True)
    assert trimmer.maybe_release(idle=False)  # the first one runs
    clock.now_s = 0.5
    assert not trimmer.maybe_release(idle=True)
    clock.now_s = 1.0
    assert trimmer.maybe_release(idle=True)
    clock.now_s = 20.0
    assert not trimmer.maybe_release(idle=False)
    clock.now_s = 31.0
    assert trimmer.maybe_release(idle=False)
    assert calls == [0.0, 1.0, 31.0] and trimmer.n_released == 3


@pytest.mark.parametrize('bad', [-1.0, 'x', True])
def test_a_bad_period_is_refused_by_name(bad):
    with pytest.raises(ValueError, match='idle_period_s must be a number >= 0'):
        HeapTrimmer(idle_period_s=bad)


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='malloc_trim is glibc\'s')
def test_freed_tensors_leave_the_resident_set_after_a_release():
    """Freed heap chunks stay resident until trimmed (glibc's grown mmap threshold)."""
    process = psutil.Process()
    big = torch.ones(8 * 2 ** 20 // 4)  # an mmapped 8 MB chunk: freed, glibc's threshold
    del big  # grows to it
    chunks = [torch.ones(2 ** 20 // 4) for _ in range(192)]  # 192 MB of 1 MB heap chunks
    chunks.append(torch.ones(16))  # a live chunk above them: the heap's top cannot shrink
    before_free = process.memory_info().rss
    del chunks[:-1]
    freed = process.memory_info().rss
    assert release_free_heap()
    after = process.memory_info().rss
    assert before_free - freed < 64 * 2 ** 20, 'the chunks were given back without a trim'
    assert freed - after > 128 * 2 ** 20, 'the release gave back less than 128 MB'


def test_the_resident_memory_is_read():
    mb = resident_mb()
    assert mb is None or abs(mb - psutil.Process().memory_info().rss / 2 ** 20) < 64
