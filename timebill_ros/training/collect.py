"""Record the target LLM's own response lengths over the corpus (the RLP's labels).

Each prompt goes through the server's chat template (:meth:`LlmEngine.encode`), the
server's prefill and greedy decoding capped at N_model tokens, several answers decoding
together on the engine's batched decoding (each with its own cache: no padding). A batched
step multiplies B rows at once where a lone step multiplies one, which can round a near-tie
argmax differently, so a batched length may rarely differ from the unbatched server's;
``verify`` measures how often.

The output is JSONL, one line per prompt, appended as each answer ends, so a stopped run
resumes where it stopped. Response length ``n_tokens`` counts generated tokens *including*
the end-of-turn token, i.e. the decoding steps the server runs; ``capped`` marks answers that
hit N_model (their true length is >= N_model).

With a loop guard (the server's ``engine.loop_guard``), an answer that repeats a cycle ends
where the guard fires, as on the server: ``n_tokens`` is then the decoding steps run up to that
point (the server's time), ``finish`` says ``repetition``, and the answer is not capped.
"""

import hashlib
import json
import pathlib
import sys
import time
from typing import Callable, Dict, List, Optional

from timebill_ros.training.corpus import CorpusItem

N_MODEL = 1024  # most tokens collected per answer; the RLP's top bucket means ">= N_MODEL"
MAX_BATCH = 8  # answers decoding together (the aggregate token rate flattens past 8 here)


def progress_bar(done: int, total: int, elapsed_s: float, width: int = 24) -> str:
    """Return ``[#####-----] done/total 42 % 3.1 min, ETA 4.2 min`` (times in minutes)."""
    share = done / total if total else 1.0
    filled = round(width * share)
    eta_s = elapsed_s / done * (total - done) if done else float('nan')
    return (f'[{"#" * filled}{"-" * (width - filled)}] {done}/{total} {share:4.0%} '
            f'{elapsed_s / 60:.1f} min, ETA {eta_s / 60:.1f} min')


def prompt_sha(prompt: str) -> str:
    """Return a short hash of a prompt text, to detect a corpus that changed under a file."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:12]


def load_records(path) -> Dict[str, dict]:
    """Return {prompt_id: record} of a lengths JSONL file ({} if it does not exist)."""
    path = pathlib.Path(path)
    if not path.exists():
        return {}
    records = {}
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f'{path}:{line_no}: not JSON ({exc})') from exc
        records[record['prompt_id']] = record
    return records


def merge_answer_ids(records: Dict[str, dict], source: Dict[str, dict], where='') -> int:
    """Copy ``answer_ids`` from ``source`` into the matching ``records``; return how many.

    records / source: {prompt_id: record} of two lengths files (:func:`load_records`). A
    source record gives its ids only to the record of the same prompt collected the same way:
    the same prompt text (``prompt_sha``), ``n_model``, loop guard and length ``n_tokens``
    (a greedy answer of the same model repeats, so a different length means another model or
    engine). Any other difference is a ``ValueError`` naming the prompt and ``where``.
    """
    merged = 0
    for prompt_id, extra in source.items():
        record = records.get(prompt_id)
        if record is None or 'answer_ids' not in extra or 'answer_ids' in record:
            continue
        for key in ('prompt_sha', 'n_model', 'loop_guard', 'n_tokens'):
            if record.get(key) != extra.get(key):
                raise ValueError(f'{where}: {prompt_id} has {key}={extra.get(key)!r}, the '
                                 f'lengths file {record.get(key)!r}: not the same collection')
        record['answer_ids'] = extra['answer_ids']
        merged += 1
    return merged


def response_length(tokens: List[int], eos_ids, n_model: int) -> tuple:
    """Return (n_tokens, capped) for generated ``tokens``: up to and including the first EOS."""
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return index + 1, False
    return n_model, True


FINISH_EOS, FINISH_REPETITION, FINISH_LENGTH = 'eos', 'repetition', 'length'


def result_length(result, n_model: int, guard=None) -> tuple:
    """Return (n_tokens, capped) of a DecodeResult stopped by EOS, the loop guard or N_model.

    An EOS answer counts its tokens plus the EOS (the decoding steps the server runs); a
    guarded answer counts the steps run until ``guard`` (its LoopGuard) fired, the tail it
    cut included; any other stop means the answer reached N_model.
    """
    from timebill_ros.engine import stopping
    if result.stop_reason == stopping.EOS:
        return len(result.token_ids) + 1, False
    if result.stop_reason == stopping.REPETITION and guard is not None:
        return len(guard.tokens), False
    return n_model, True


def finish_of(result) -> str:
    """Return how a collected answer ended: ``eos``, ``repetition`` or ``length``."""
    from timebill_ros.engine import stopping
    return {stopping.EOS: FINISH_EOS,
            stopping.REPETITION: FINISH_REPETITION}.get(result.stop_reason, FINISH_LENGTH)


def _join(engine, batch, item, encoded, n_model, rows, loop_guard, on_prefill=None):
    """Prefill ``item`` and add it to ``batch``; ``rows`` maps its row id to (item, guard)."""
    from timebill_ros.engine import stopping
    state = engine.prefill(encoded[item.prompt_id], stopping.StopCriteria())
    if on_prefill is not None:
        on_prefill(item, encoded[item.prompt_id], state)
    criteria = [stopping.EosStop(engine.eos_token_ids)]
    guard = stopping.LoopGuard(*loop_guard) if loop_guard else None
    if guard is not None:
        criteria.append(guard)
    row_id = batch.join(state, n_model, stopping.StopCriteria(criteria))
    rows[row_id] = (item, guard)


def decode_lengths(engine, items: List[CorpusItem], encoded: Dict[str, List[int]],
                   n_model: int, max_batch: int, loop_guard: Optional[tuple] = None,
                   on_prefill: Optional[Callable] = None):
    """Yield ``(item, n_tokens, capped, finish, answer_ids)`` as each item's answer ends.

    The server's own path: :meth:`LlmEngine.prefill` (no eviction) and the engine's batched
    decoding (:meth:`LlmEngine.new_batch`), up to ``max_batch`` answers a step. An answer
    leaves the batch at its EOS, when ``loop_guard`` ((max_period, min_repeats, min_span) of
    a :class:`LoopGuard`, or None) fires, or at ``n_model`` tokens, and the next prompt joins,
    so no answer waits for a longer one (continuous batching; no padding). ``n_tokens``
    counts the decoding steps the server runs (the EOS included). ``on_prefill(item, ids,
    state)`` sees each prefill (its PrefillState: the pooled layer states the prefill readout
    trains on come with it at no extra pass). ``answer_ids``: the generated token ids, the
    EOS excluded (a remaining-length readout's teacher-forced training input).
    """
    batch, pending, rows = engine.new_batch(), list(items), {}
    while pending or len(batch):
        while pending and len(batch) < max_batch:
            _join(engine, batch, pending.pop(0), encoded, n_model, rows, loop_guard,
                  on_prefill)
        for row_id, result in batch.step():
            item, guard = rows.pop(row_id)
            yield (item, *result_length(result, n_model, guard), finish_of(result),
                   list(result.token_ids))


def _check_done(out_path, done, items, n_model, loop_guard):
    """Refuse to append to a file collected from other prompts or with other settings."""
    by_id = {it.prompt_id: it for it in items}
    guard = list(loop_guard) if loop_guard else None
    for prompt_id, record in done.items():
        item = by_id.get(prompt_id)
        if item is None:
            continue
        if record.get('prompt_sha') != prompt_sha(item.prompt):
            raise ValueError(f'{out_path}: prompt {prompt_id} changed since it was collected')
        if record.get('n_model') != n_model:
            raise ValueError(f'{out_path}: {prompt_id} was collected with n_model='
                             f'{record.get("n_model")}, not {n_model}')
        if record.get('loop_guard') != guard:
            raise ValueError(f'{out_path}: {prompt_id} was collected with loop_guard='
                             f'{record.get("loop_guard")}, not {guard}')


def collect(engine, items: List[CorpusItem], out_path, n_model: int = N_MODEL,
            max_batch: int = MAX_BATCH, limit: Optional[int] = None,
            log: Callable[[str], None] = print, clock=time.monotonic,
            loop_guard: Optional[tuple] = None, on_prefill: Optional[Callable] = None) -> int:
    """Append the response length of every item not yet in ``out_path``; return how many.

    ``limit`` caps the prompts done in this call (for a quick run). ``loop_guard``:
    (max_period, min_repeats, min_span) of the server's loop guard, or None to decode to EOS
    or N_model. A record whose prompt text or settings changed since it was written is an
    error: delete the file to recollect. Each record is
    written (and flushed) as its answer ends, so a stopped run resumes where it stopped;
    progress lines every ``max_batch`` answers give a bar, the rate and an ETA.
    ``on_prefill``: as :func:`decode_lengths`.
    """
    out_path = pathlib.Path(out_path)
    done = load_records(out_path)
    _check_done(out_path, done, items, n_model, loop_guard)
    pending = [it for it in items if it.prompt_id not in done][:limit]
    if not pending:
        log(f'all {len(items)} prompts already in {out_path}')
        return 0
    encoded = {it.prompt_id: engine.encode(it.prompt) for it in pending}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start, n_done, n_capped, n_loops, n_answer_tokens = clock(), 0, 0, 0, 0
    with out_path.open('a') as out:
        for item, n_tokens, capped, finish, answer_ids in decode_lengths(
                engine, pending, encoded, n_model, max_batch, loop_guard, on_prefill):
            record = {
                'prompt_id': item.prompt_id, 'category': item.category,
                'split': item.split, 'n_prompt_tokens': len(encoded[item.prompt_id]),
                'n_tokens': n_tokens, 'capped': capped, 'n_model': n_model,
                'prompt_sha': prompt_sha(item.prompt), 'answer_ids': answer_ids}
            if loop_guard:
                record.update(finish=finish, loop_guard=list(loop_guard))
            out.write(json.dumps(record) + '\n')
            out.flush()
            n_done, n_capped = n_done + 1, n_capped + capped
            n_loops += finish == FINISH_REPETITION
            n_answer_tokens += n_tokens
            if n_done % max_batch == 0 or n_done == len(pending):
                elapsed = clock() - start
                log(f'{progress_bar(n_done, len(pending), elapsed)} prompts '
                    f'({n_capped} reached N_model, {n_loops} ended by the loop guard, '
                    f'{n_answer_tokens / max(elapsed, 1e-9):.0f} answer tokens/s)')
                sys.stdout.flush()
    return n_done


def verify(engine, items: List[CorpusItem], out_path, n_prompts: int,
           log: Callable[[str], None] = print) -> List[tuple]:
    """Re-measure ``n_prompts`` collected lengths through the server's own unbatched path.

    Uses :meth:`LlmEngine.prefill` + :meth:`LlmEngine.decode` (no eviction) with EOS,
    N_model and the record's loop guard (if it was collected with one) as the only stops.
    Returns [(prompt_id, batched n_tokens, unbatched n_tokens)] for ``n_prompts`` collected
    items spread evenly over the corpus order.
    """
    from timebill_ros.engine import stopping
    records = load_records(out_path)
    collected = [it for it in items if it.prompt_id in records]
    chosen = collected[::max(1, len(collected) // max(1, n_prompts))][:n_prompts]
    out = []
    for item in chosen:
        record = records[item.prompt_id]
        n_model = record['n_model']
        state = engine.prefill(engine.encode(item.prompt), stopping.StopCriteria([]))
        criteria = [stopping.EosStop(engine.eos_token_ids)]
        guard = (stopping.LoopGuard(*record['loop_guard']) if record.get('loop_guard')
                 else None)
        criteria += [guard] if guard is not None else []
        result = engine.decode(state, n_model, stopping.StopCriteria(criteria))
        single, _ = result_length(result, n_model, guard)
        out.append((item.prompt_id, record['n_tokens'], single))
        log(f'{item.prompt_id}: batched {record["n_tokens"]}, unbatched {single}')
    return out
