"""Measurement harness: time the server's engine over a grid of prompt lengths.

The engine is used through one method (duck typing):
``engine.measure_probe(n_in: int, n_out: int) -> Probe`` (an LlmEngine's through
timing/probes.py's EngineProbes), which
runs the server's own prefill and decode loop with eviction off and EOS ignored.
"""

import random
import time
from typing import Callable, Optional, Sequence

from timebill_ros.latency.grid import GridRun, LatencyGrid
from timebill_ros.engine.probe import timed_probe
from timebill_ros.timing.probes import probes_of
from timebill_ros.checks import check_int, check_nonneg_real

WARM_UP_TOKENS = 8


def _check_lengths(name, values):
    """Return ``values`` as a sorted tuple of distinct ints >= 1 (tokens)."""
    lengths = tuple(sorted({check_int(f'{name}[{i}]', v, 1) for i, v in enumerate(values)}))
    if not lengths:
        raise ValueError(f'{name} must hold at least one length')
    return lengths


def measure_grid(engine, n_in_values: Sequence[int], n_out_max: int, *, repeats=3,
                 cooldown_s=2.0, seed=0, meta: Optional[dict] = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Optional[Callable[[str], None]] = None) -> LatencyGrid:
    """Record one probe per prompt length and repeat; return the :class:`LatencyGrid`.

    n_in_values: prompt lengths, tokens. n_out_max: answer length of every run, tokens.
    repeats: passes over the lengths, each in its own random order (seeded by ``seed``) so
        drift of the machine does not line up with length. cooldown_s: seconds slept before
        every run (thermal and scheduler settling). One unrecorded warm-up run at the longest
        prompt comes first. ``meta`` is stored with the grid, plus the settings and the wall
        seconds of the whole measurement (``wall_s``).
    """
    lengths = _check_lengths('n_in_values', n_in_values)
    n_out_max = check_int('n_out_max', n_out_max, 1)
    repeats = check_int('repeats', repeats, 1)
    cooldown_s = check_nonneg_real('cooldown_s', cooldown_s)
    say = progress or (lambda _msg: None)
    engine = probes_of(engine)
    start = clock()
    say(f'warm-up: n_in={lengths[-1]}, n_out={WARM_UP_TOKENS}')
    timed_probe(engine, lengths[-1], min(WARM_UP_TOKENS, n_out_max))
    rng = random.Random(seed)
    runs = []
    total = repeats * len(lengths)
    for repeat in range(repeats):
        order = list(lengths)
        rng.shuffle(order)
        for position, n_in in enumerate(order):
            sleep(cooldown_s)
            probe = timed_probe(engine, n_in, n_out_max)
            runs.append(GridRun(repeat, position, probe))
            say(f'[{len(runs)}/{total}] repeat {repeat} n_in={n_in}: ttft {probe.ttft_s:.3f} s, '
                f'{n_out_max} tokens in {probe.e2e_s:.2f} s')
    info = dict(meta or {})
    info.update(repeats=repeats, cooldown_s=cooldown_s, seed=seed, n_out_max=n_out_max,
                wall_s=round(clock() - start, 3))
    return LatencyGrid(tuple(runs), info)
