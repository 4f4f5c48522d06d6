"""Where a GGUF prefill's time goes: the weight matrices, the attention, the rest.

Times one prefill of the engine on a file with the calls of two parts wrapped in a wall
clock: every :class:`~timebill_ros.engine.models.weights.Matrix` product (the GEMM on the
file's blocks; their dequantization is fused into it, so it has no time of its own) and
every decoder layer's attention (``GgufDecoder._attend``: torch's SDPA over the chunk). The
rest (norms, RoPE, the KV cache's appends, activations, Python) is the total less both. The
wrapping adds one clock read a call (a few hundred calls a prefill): its cost is in "rest".
"""

import contextlib
import time

from timebill_ros.timing.probes import EngineProbes


PARTS = ('matrices', 'attention')


@contextlib.contextmanager
def timed_parts():
    """Yield {part: seconds} accumulating the wall time of each part's calls meanwhile."""
    from timebill_ros.engine.models import base, weights
    totals = dict.fromkeys(PARTS, 0.0)
    wrapped = ((weights.Matrix, '__call__', 'matrices'),
               (base.GgufDecoder, '_attend', 'attention'))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in wrapped]

    def timer(original, part):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[part] += time.perf_counter() - start
        return timed

    try:
        for (owner, name, part), (_, _, original) in zip(wrapped, originals):
            setattr(owner, name, timer(original, part))
        yield totals
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def prefill_parts_s(engine, n_x: int) -> dict:
    """Return {'total', 'matrices', 'attention', 'rest'} seconds of one prefill of ``n_x``.

    engine: an LlmEngine on a GGUF file (its lean GGUF forward); ``n_x`` random tokens from an
    empty cache, as :meth:`EngineProbes.measure_prefill_s` runs them.
    """
    if engine.gguf_file is None:
        raise ValueError(f'prefill parts need an engine on a GGUF file, not {engine.model_key}')
    with timed_parts() as totals:
        total = EngineProbes(engine).measure_prefill_s(n_x)
    parts = dict(totals, total=total)
    parts['rest'] = max(0.0, total - totals['matrices'] - totals['attention'])
    return parts
