"""A prefill's chunk plan from the time model: each chunk's layer takes at most one step.

Cancel and the deadline are checked before every decoder layer of every chunk, so the
longest a stop waits is one layer of one chunk: the plan keeps that under the stop bound.
"""

import itertools

from timebill_ros.timing.online import EXPECTED

MIN_CHUNK_TOKENS = 16   # chunks never shrink below this (per-call overhead would dominate)


def planned(sizes, first=0):
    """Return a chunk plan (engine.prefill's ``chunk_plan``) following ``sizes``, tokens.

    first: the position of the first chunk (the tokens copied from the prefix store).
    """
    by_begin = dict(zip(itertools.accumulate([first] + sizes[:-1]), sizes))
    return lambda begin, n_tokens: by_begin.get(begin, MIN_CHUNK_TOKENS)


def chunk_sizes(model, engine_config, n_layers, n_x, n_cached=0):
    """Return a prefill's chunk sizes, tokens: one decoder layer takes at most the bound.

    model: the TimeModel; engine_config: the ``engine`` group; n_layers: decoder layers;
    n_x: prompt tokens, the first ``n_cached`` of them copied from the prefix store.
    The bound is ``engine.stop_bound_s`` or, when 0, one decoding step at this prompt's
    length; a cancel or deadline then lands within about one step (checks run before
    every layer). Chunk and step times are the time model's EXPECTED ones: both scale
    with the machine's speed, and a pessimistic chunk estimate would only shrink the
    chunks, which costs (each forward pass pays an overhead; see TimeModel.prefill_s).
    The largest such chunk up to ``engine.prefill_chunk_tokens`` is taken (binary
    search: the time grows with size).
    """
    allowed_s = (engine_config.stop_bound_s or model.step_s(n_x, EXPECTED)) * n_layers
    sizes, begin = [], n_cached
    while begin < n_x:
        low, high = MIN_CHUNK_TOKENS, max(MIN_CHUNK_TOKENS, engine_config.prefill_chunk_tokens)
        while low < high:
            mid = (low + high + 1) // 2
            if model.chunk_s(begin, mid, EXPECTED) <= allowed_s:
                low = mid
            else:
                high = mid - 1
        sizes.append(min(low, n_x - begin))
        begin += sizes[-1]
    return sizes
