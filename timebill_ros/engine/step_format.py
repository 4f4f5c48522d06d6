"""``engine.decode_weights: auto``: the faster faithful step-weight format, measured at start-up.

Which format decodes fastest depends on the machine, not the model: on an AVX2 CPU without
AVX-512 (PLATFORM.md's EPYC) FBGEMM's fp16 steps run ~2x faster than MKL's fp32 ones; on an
AVX-512 Xeon (some of this project's machines in 2026-11) the two are equally fast, and then fp32,
which is exact, is the better choice; on CUDA 16-bit wins. So ``auto`` times a few decoding
steps in each faithful format on the loaded model and keeps the faster, preferring the exact
format unless the other is at least ``MIN_GAIN`` faster. ``int8`` and ``bfloat16`` are never
chosen: their greedy answers drift from fp32's within a few tokens (docs/engine.md).
"""

import statistics
import time
from typing import Callable, Sequence

FAITHFUL_FORMATS = ('float32', 'float16')  # the exact one first
MIN_GAIN = 0.10  # the 16-bit copy must be this much faster (fraction of the fp32 step)
PROBE_KV = 100   # tokens cached while probing
PROBE_STEPS = 8  # decoding steps a round
PROBE_ROUNDS = 3


def choose_step_format(make_forward: Callable[[str], object],
                       measure_step_s: Callable[[object], float]) -> tuple:
    """Return ``(format, forward, step_s)``: the chosen format, its forward, s/step by format.

    make_forward(format) builds the forward of one format; measure_step_s(forward) returns
    the seconds of one decoding step on it. Rounds alternate between formats (so a drift of
    the machine's speed hits both); each format's time is its median round.
    """
    forwards = {name: make_forward(name) for name in FAITHFUL_FORMATS}
    rounds = {name: [] for name in FAITHFUL_FORMATS}
    for _ in range(PROBE_ROUNDS):
        for name, forward in forwards.items():
            rounds[name].append(measure_step_s(forward))
    step_s = {name: statistics.median(values) for name, values in rounds.items()}
    exact, other = FAITHFUL_FORMATS
    chosen = other if step_s[other] < (1.0 - MIN_GAIN) * step_s[exact] else exact
    return chosen, forwards[chosen], step_s


def forward_step_s(forward, token_ids: Sequence[int], steps: int = PROBE_STEPS) -> float:
    """Return the mean seconds of one decoding step of ``forward`` after ``token_ids``.

    The forward itself (a fresh cache, the prompt as one pass, then ``steps`` one-token steps),
    not the engine's decode loop: what differs between step formats is the forward.
    """
    cache = forward.new_cache()
    forward.run(list(token_ids), 0, cache, step=False)
    position, token = len(token_ids), int(token_ids[-1])
    start = time.perf_counter()
    for offset in range(steps):
        forward.run([token], position + offset, cache, step=True)
    return (time.perf_counter() - start) / steps
