"""Give the C heap's free pages back to the system (glibc's ``malloc_trim``).

Every goal allocates and frees tensors of its own sizes (KV caches, a prefill chunk's
dequantized matrices and activations). glibc serves them from its arenas and, once its
dynamic mmap threshold has grown, keeps what is freed there: under a mixed load a node held
~600 MB of free heap after 4 minutes (docs/reliability.md), reported as resident memory that
nothing uses. ``malloc_trim(0)`` returns the free pages of every arena. It is glibc's (no
maintained Python library wraps it); elsewhere (musl, macOS) :func:`release_free_heap` does
nothing and says so.
"""

import ctypes
import ctypes.util
import functools
import os
import threading
import time


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """Return libc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33), every field in bytes or counts."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]


@functools.lru_cache(maxsize=None)
def _mallinfo2():
    """Return libc's ``mallinfo2``, or None where the C library has none."""
    try:
        info = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6').mallinfo2
    except (OSError, AttributeError):
        return None
    info.argtypes, info.restype = [], _MallInfo2
    return info


def heap_mb():
    """Return the C heap's ``(in_use, free)`` MiB (glibc's mallinfo2), or None elsewhere.

    in_use: what is allocated now (arenas and mmapped chunks); free: what the arenas hold
    free, resident until :func:`release_free_heap` gives its pages back. Counts the main
    arena and the threads' arenas; torch's and onnxruntime's CPU buffers come from here.
    """
    info = _mallinfo2()
    if info is None:
        return None
    stats = info()
    return (stats.uordblks + stats.hblkhd) / 2 ** 20, stats.fordblks / 2 ** 20


def memory_text():
    """Return ``'N MB resident (heap: U MB in use, F MB free)'`` for a log line."""
    rss, heap = resident_mb(), heap_mb()
    text = 'resident memory unknown' if rss is None else f'{rss:.0f} MB resident'
    if heap is not None:
        text += f' (heap: {heap[0]:.0f} MB in use, {heap[1]:.0f} MB free)'
    return text


def resident_mb():
    """Return this process's resident memory, MiB, or None where /proc is missing."""
    try:
        with open('/proc/self/statm', encoding='ascii') as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


class HeapTrimmer:
    """Release the free heap after goals: when the server is idle, and now and then when not.

    idle_period_s / busy_period_s: the least seconds between two releases while idle / busy
    (a release on a busy server delays the next goal by its own time: a few ms, measured in
    docs/reliability.md). clock: seconds (injected in tests); release: the release function.
    """

    def __init__(self, idle_period_s: float = 1.0, busy_period_s: float = 30.0,
                 clock=time.monotonic, release=release_free_heap):
        for name, value in (('idle_period_s', idle_period_s), ('busy_period_s', busy_period_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f'{name} must be a number >= 0, got {value!r}')
        self.periods_s = {True: float(idle_period_s), False: float(busy_period_s)}
        self.clock, self.release = clock, release
        self._last_s = None
        self._lock = threading.Lock()
        self.n_released = 0

    def maybe_release(self, idle: bool) -> bool:
        """Release unless the last release is under the period of ``idle`` old; True if run."""
        with self._lock:
            now = self.clock()
            if self._last_s is not None and now - self._last_s < self.periods_s[bool(idle)]:
                return False
            self._last_s = now
        released = self.release()
        self.n_released += int(released)
        return released
