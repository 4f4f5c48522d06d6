"""What the decode readout trains on: the answer's own states at decoding checkpoints.

A goal decoding under timebill-online pools the last decoder layer's output of every step
(engine.PrefillState.answer_pool); at a checkpoint after k generated tokens that pool holds
k - 1 rows, the outputs that chose tokens 2..k. The same rows come from teacher forcing: the
collected answer's tokens fed after the prompt as one prefill chunk, the last layer's outputs
kept (:func:`answer_states`). One prefill of prompt + answer per collected prompt replaces
a decode; the features of every checkpoint k of that answer are slices of it.

A checkpoint's input (:func:`decode_input`): the prompt's pooled states ([last, mean] of the
readout's layers, (1, 2 x L x hidden)) and the answer's ([last, mean] of its unit-RMS rows,
(1, 2 x hidden)), laid out as one pool of L + 1 layers: [last_1..last_L, last_answer,
mean_1..mean_L, mean_answer].
"""

import dataclasses
import hashlib
import pathlib
import time
from typing import Callable, Dict, Sequence

import torch

from timebill_ros import paths
from timebill_ros.engine.forward import PassHooks, unit_rms
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.predictors.decode_readout import decode_input
from timebill_ros.training.collect import progress_bar

# Checkpoints trained on: tokens generated (k) where a goal checking every 16 tokens re-decides
# (k = 16 j + 1), spread from the first checkpoint to half of N_model.
TRAIN_CHECKPOINTS = (17, 33, 65, 129, 257, 513)
SAVE_EVERY = 50


def default_decode_features_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return the cache file of ``model_key``'s teacher-forced checkpoint features."""
    return pathlib.Path(paths.cache_root(cache_dir)) / 'rlp' / f'{model_key}__decode_features.pt'


class _LastLayerRows:
    """A pool stand-in that keeps the rows of one layer's output (what a prefill adds)."""

    def __init__(self, layer: int):
        self.layers = (layer,)
        self.rows = []

    def add(self, layer: int, hidden: torch.Tensor) -> None:
        if layer == self.layers[0]:
            self.rows.append(hidden[0].float())


def answer_states(engine, state, answer_ids: Sequence[int]) -> torch.Tensor:
    """Return the last layer's outputs of ``answer_ids`` fed after the prompt, unit-RMS.

    state: the prompt's PrefillState (its cache grows by the answer). Row j, (hidden,) fp32,
    is what decoding's answer pool adds at the step that feeds answer token j + 1 (scaled as
    engine.forward.HiddenPool scales it); shape (len(answer_ids), hidden).
    """
    rows = _LastLayerRows(engine.n_layers)
    with torch.inference_mode(), engine.forward.hooked(PassHooks(pool=rows)):
        engine.forward.run(list(answer_ids), state.n_x, state.cache, False)
    return unit_rms(torch.cat(rows.rows), engine.forward.norm_eps)


def answer_pooled(states: torch.Tensor, n_generated: int) -> torch.Tensor:
    """Return the answer pool's [last, mean] after ``n_generated`` tokens, (1, 2 x hidden).

    states: :func:`answer_states` rows; the pool then holds rows 0..n_generated - 2.
    """
    if not 2 <= n_generated <= states.shape[0] + 1:
        raise ValueError(f'n_generated must be in 2..{states.shape[0] + 1}, got {n_generated}')
    seen = states[:n_generated - 1]
    return torch.cat([seen[-1], seen.mean(0)]).unsqueeze(0)


def checkpoint_id(prompt_id: str, n_generated: int) -> str:
    """Return the id of one training row: a prompt at a checkpoint (``<id>@<k>``)."""
    return f'{prompt_id}@{n_generated}'


@dataclasses.dataclass(frozen=True)
class _Answer:
    prompt_id: str
    prompt: str
    answer_ids: tuple
    n_tokens: int


def checkpoints_of(n_tokens: int, n_answer_ids: int,
                   checkpoints: Sequence[int] = TRAIN_CHECKPOINTS) -> list:
    """Return the checkpoints k an answer trains: still decoding (k < n_tokens), states known.

    n_tokens: the answer's decoding steps (collect's length); n_answer_ids: its kept ids
    (teacher forcing feeds k - 1 of them).
    """
    return [k for k in checkpoints if k < n_tokens and k - 1 <= n_answer_ids]


def decode_features(engine, examples: Sequence, records: Dict[str, dict], path=None,
                    log: Callable[[str], None] = print,
                    checkpoints: Sequence[int] = TRAIN_CHECKPOINTS) -> Dict[str, torch.Tensor]:
    """Return ``<prompt id>@<k>`` -> :func:`decode_input` of every example's checkpoints.

    engine: an LlmEngine whose ``pool_layers`` are the readout's. examples: training.dataset
    Examples; records: the lengths file's records (their ``answer_ids``; examples collected
    without them are skipped). path: the cache file (None: no cache), keyed by prompt id and
    k beside a digest of each prompt and answer (an answer collected again is forced again),
    saved every SAVE_EVERY prompts so a stopped run resumes.
    """
    path = None if path is None else pathlib.Path(path)
    cache = torch.load(path, weights_only=True) if path is not None and path.is_file() else {}
    todo = []
    for example in examples:
        record = records.get(example.prompt_id, {})
        ids = record.get('answer_ids')
        if ids is None:
            continue
        wanted = checkpoints_of(example.n_tokens, len(ids), checkpoints)
        digest = _digest(example.prompt, ids)
        if wanted and (cache.get(_digest_key(example.prompt_id)) != digest or not all(
                checkpoint_id(example.prompt_id, k) in cache for k in wanted)):
            todo.append((_Answer(example.prompt_id, example.prompt, tuple(ids),
                                 example.n_tokens), wanted))
    if todo:
        log(f'decode features: {len(todo)} answers to teacher-force')
    start = time.perf_counter()
    for index, (answer, wanted) in enumerate(todo, 1):
        state = engine.prefill(engine.encode(answer.prompt), StopCriteria())
        states = answer_states(engine, state, answer.answer_ids[:max(wanted) - 1])
        for k in wanted:
            cache[checkpoint_id(answer.prompt_id, k)] = decode_input(
                state.pooled, answer_pooled(states, k))
        cache[_digest_key(answer.prompt_id)] = _digest(answer.prompt, answer.answer_ids)
        if path is not None and (index % SAVE_EVERY == 0 or index == len(todo)):
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(cache, path.with_suffix('.tmp'))
            path.with_suffix('.tmp').replace(path)
            log(f'decode features: {progress_bar(index, len(todo), time.perf_counter() - start)}')
    return {key: value for key, value in cache.items() if torch.is_tensor(value)}


def _digest_key(prompt_id: str) -> str:
    return f'{prompt_id}#answer'


def _digest(prompt: str, answer_ids) -> str:
    """Return a short hash of a prompt and its answer's ids."""
    text = prompt + '\0' + ' '.join(map(str, answer_ids))
    return hashlib.sha1(text.encode()).hexdigest()[:16]
