"""RoPE rows looked up in a table (engine/models/rope_table.py) are the rows computed directly.

A decoding step on the blocks path reads its cos / sin from the table (no OpenMP region a
step); the answers may only stay the same if every row is the same bits as the direct
computation, at any position, for every RoPE base of the file (Gemma 3 has two).
"""

import threading

import pytest
import torch

from gguf_files import T
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.models import load_decoder
from timebill_ros.engine.models.rope_table import MIN_POSITIONS, RopeTable


def _direct(decoder, positions):
    rope = decoder.rope
    return {base: rope.angles(inv, positions) for base, inv in rope.inv_freq.items()}


@pytest.mark.parametrize('arch', ('qwen2', 'gemma3'))
def test_looked_up_rows_are_the_computed_rows(written, arch):
    """Single decoding positions past several growths, scattered batches and prefill runs."""
    decoder = load_decoder(GgufFile(written(arch, T.F32)[0]))
    assert decoder.rope.tables is not None  # the blocks path looks its rows up
    cases = [torch.tensor([p]) for p in (0, 1, MIN_POSITIONS - 1, MIN_POSITIONS, 3000, 70)]
    cases += [torch.tensor([9, 4000, 2, 511]), torch.arange(100, 613), torch.arange(0, 5)]
    for positions in cases:
        looked_up, direct = decoder.rope.at(positions), _direct(decoder, positions)
        assert looked_up.keys() == direct.keys()
        for base, (cos, sin) in direct.items():
            assert torch.equal(looked_up[base][0], cos), (arch, base, positions[:4])
            assert torch.equal(looked_up[base][1], sin), (arch, base, positions[:4])


def test_the_table_grows_by_doubling_and_keeps_its_rows():
    """Positions past the end grow the table to a power of two; the old rows stay."""
    calls = []

    def angles(positions):
        calls.append((int(positions[0]), int(positions[-1]) + 1))
        angle = positions.float()[:, None] * torch.ones(1, 4)
        return angle.cos(), angle.sin()

    table = RopeTable(angles)
    assert table.n_positions == 0
    first = table.rows(torch.tensor([3]))[0].clone()
    assert table.n_positions == MIN_POSITIONS and calls == [(0, MIN_POSITIONS)]
    table.rows(torch.tensor([MIN_POSITIONS * 3]))
    assert table.n_positions == MIN_POSITIONS * 4
    assert calls[-1] == (MIN_POSITIONS, MIN_POSITIONS * 4)  # only the new rows computed
    table.rows(torch.tensor([10, 20]))
    assert len(calls) == 2  # inside the table: looked up
    assert torch.equal(table.rows(torch.tensor([3]))[0], first)


def test_bad_positions_are_refused_by_value():
    """A negative position or none at all is a ValueError naming it."""
    table = RopeTable(lambda p: (p.float()[:, None], p.float()[:, None]))
    with pytest.raises(ValueError, match='-2'):
        table.rows(torch.tensor([4, -2]))
    with pytest.raises(ValueError, match='-7'):
        table.rows(torch.tensor([-7]))
    with pytest.raises(ValueError, match='no positions'):
        table.rows(torch.tensor([], dtype=torch.long))


def test_twin_decoders_share_a_table_across_threads():
    """Threads growing one table at once each get the rows they asked for."""
    def angles(positions):
        angle = positions.float()[:, None] * torch.ones(1, 2)
        return angle, -angle

    table, errors = RopeTable(angles), []

    def look_up(seed):
        generator = torch.Generator().manual_seed(seed)
        for _ in range(200):
            positions = torch.randint(0, 20000, (3,), generator=generator)
            cos, sin = table.rows(positions)
            if not (torch.equal(cos[:, 0], positions.float())
                    and torch.equal(sin[:, 0], -positions.float())):
                errors.append(positions)

    threads = [threading.Thread(target=look_up, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
