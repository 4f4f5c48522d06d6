"""Pooled layer states of the engine's own prefill, per corpus prompt, cached on disk.

What the prefill readout (training/heads/prefill_readout.py) trains on: exactly what the server's
prefill hands it (engine.PrefillState.pooled), computed by the same engine over the whole
chat-formatted prompt. One prefill per prompt (~270 k prompt tokens for the corpus: about 15
min on 2 cores); the cache is keyed by a hash of the token ids, the forward and the layers
pooled, saved every SAVE_EVERY prompts, so a stopped run resumes.
"""

import hashlib
import pathlib
import time
from typing import Callable, Dict, Sequence

import torch

from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.training.collect import progress_bar
from timebill_ros import paths

SAVE_EVERY = 50


def default_features_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return the cache file of ``model_key``'s pooled prefill states."""
    root = pathlib.Path(paths.cache_root(cache_dir))
    return root / 'rlp' / f'{model_key}__prefill_features.pt'


def ids_key(input_ids: Sequence[int], forward_name: str, layers: Sequence[int]) -> str:
    """Return the cache key of one prompt's ids, the forward and the layers pooled."""
    digest = hashlib.sha1(' '.join(map(str, input_ids)).encode()).hexdigest()[:16]
    return f'{forward_name}:{",".join(map(str, layers))}:{digest}'


def prefill_features(engine, examples: Sequence, path=None,
                     log: Callable[[str], None] = print,
                     layers: Sequence[int] = ()) -> Dict[str, torch.Tensor]:
    """Return prompt id -> pooled states (1, 2 x layers x hidden) fp32 of each prefill.

    engine: an LlmEngine (its ``pool_layers`` are set to ``layers``; () keeps them).
    examples: training.dataset.Example. path: the cache file (None: no cache). Progress and an
    ETA are logged every SAVE_EVERY prompts.
    """
    if layers:
        engine.pool_layers = tuple(layers)
    layers = engine.pool_layers
    path = None if path is None else pathlib.Path(path)
    cache = torch.load(path, weights_only=True) if path is not None and path.is_file() else {}
    out, todo = {}, []
    for example in examples:
        ids = engine.encode(example.prompt)
        key = ids_key(ids, engine.forward.name, layers)
        if key in cache:
            out[example.prompt_id] = cache[key]
        else:
            todo.append((example.prompt_id, key, ids))
    if todo:
        log(f'prefill features: {len(out)} cached, {len(todo)} to prefill '
            f'({sum(len(ids) for _, _, ids in todo)} tokens)')
    start = time.perf_counter()
    for index, (prompt_id, key, ids) in enumerate(todo, 1):
        cache[key] = out[prompt_id] = engine.prefill(ids, StopCriteria()).pooled
        if index % SAVE_EVERY == 0 or index == len(todo):
            if path is not None:
                _save(cache, path)
            log(f'prefill features: {progress_bar(index, len(todo), time.perf_counter() - start)}')
    return out


class FeatureSink:
    """Keeps the pooled states of prefills run elsewhere (the length collection) in the cache.

    ``add(item, ids, state)`` is :func:`timebill_ros.training.collect.collect`'s
    ``on_prefill``: the states land under the key :func:`prefill_features` looks up, so the
    readout's features cost no second prefill of the corpus. Saved every SAVE_EVERY prompts
    and at :meth:`close`.
    """

    def __init__(self, engine, path):
        """Store into the cache file ``path`` of ``engine``'s pooled prefill states."""
        self.engine, self.path = engine, pathlib.Path(path)
        self.cache = (torch.load(self.path, weights_only=True) if self.path.is_file() else {})
        self.n_unsaved = 0

    def add(self, item, ids, state) -> None:
        """Keep ``state.pooled`` (1, 2 x layers x hidden) of the prompt ``ids``."""
        if state.pooled is None:
            return
        key = ids_key(ids, self.engine.forward.name, self.engine.pool_layers)
        self.cache[key] = state.pooled
        self.n_unsaved += 1
        if self.n_unsaved >= SAVE_EVERY:
            self.close()

    def close(self) -> None:
        """Write what was added since the last save."""
        if self.n_unsaved:
            _save(self.cache, self.path)
            self.n_unsaved = 0


def _save(cache, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix('.tmp')
    torch.save(cache, tmp)
    tmp.replace(path)
