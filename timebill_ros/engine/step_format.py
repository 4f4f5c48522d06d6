"""``engine.decode_weights: auto``: the faster faithful step-weight format, measured at start-up.

Which format decodes fastest depends on the machine, not the model: on an AVX2 CPU without
AVX-512 (PLATFORM.md's EPYC) FBGEMM's fp16 steps run ~2x faster than MKL's fp32 ones and the
GGUF kernels ~2.5x; on an AVX-512 Xeon (some of this project's machines in 2026-11) fp32 and
fp16 are equally fast; on CUDA 16-bit wins. So ``auto`` times a few decoding steps in each
faithful format the engine can run (``gguf`` only for the embedded GGUF model on the CPU, with
the kernels built) and keeps the fastest *exact* one - ``float32`` and ``gguf`` both multiply
fp32 activations by the model's own fp32 weights - unless ``float16`` is at least ``MIN_GAIN``
faster than it. ``int8`` and ``bfloat16`` are never chosen: their greedy answers drift from
fp32's within a few tokens (docs/engine.md).
"""

import statistics
import time
from typing import Callable, Sequence

FAITHFUL_FORMATS = ('float32', 'float16', 'gguf')
EXACT_FORMATS = ('float32', 'gguf')  # fp32 arithmetic on the model's own weights
MIN_GAIN = 0.10  # the 16-bit copy must be this much faster (fraction of the exact step)
PROBE_KV = 100   # tokens cached while probing
PROBE_STEPS = 8  # decoding steps a round
PROBE_ROUNDS = 3


def choose_step_format(make_forward: Callable[[str], object],
                       measure_step_s: Callable[[object], float],
                       formats: Sequence[str] = ('float32', 'float16')) -> tuple:
    """Return ``(format, forward, step_s)``: the chosen format, its forward, s/step by format.

    formats: the candidates (of FAITHFUL_FORMATS; at least one exact). make_forward(format)
    builds the forward of one format; measure_step_s(forward) returns the seconds of one
    decoding step on it. Rounds alternate between formats (so a drift of the machine's speed
    hits all alike); each format's time is its median round.
    """
    unknown = [name for name in formats if name not in FAITHFUL_FORMATS]
    if unknown or not any(name in EXACT_FORMATS for name in formats):
        raise ValueError(f'formats must be faithful formats, one exact, got {formats!r}')
    forwards = {name: make_forward(name) for name in formats}
    rounds = {name: [] for name in formats}
    for _ in range(PROBE_ROUNDS):
        for name, forward in forwards.items():
            rounds[name].append(measure_step_s(forward))
    step_s = {name: statistics.median(values) for name, values in rounds.items()}
    chosen = min((name for name in formats if name in EXACT_FORMATS), key=step_s.get)
    if 'float16' in step_s and step_s['float16'] < (1.0 - MIN_GAIN) * step_s[chosen]:
        chosen = 'float16'
    return chosen, forwards[chosen], step_s


def forward_step_s(forward, token_ids: Sequence[int], steps: int = PROBE_STEPS) -> float:
    """Return the mean seconds of one decoding step of ``forward`` after ``token_ids``.

    The forward itself (a fresh cache, the prompt as one pass, then ``steps`` one-token steps),
    not the engine's decode loop: what differs between step formats is the forward.
    """
    cache = forward.new_cache()
    forward.run(list(token_ids), 0, cache, step=False)
    forward.synchronize()
    position, token = len(token_ids), int(token_ids[-1])
    start = time.perf_counter()
    for offset in range(steps):
        forward.run([token], position + offset, cache, step=True)
    forward.synchronize()  # a GPU's steps are queued: time their work, not their launches
    return (time.perf_counter() - start) / steps
