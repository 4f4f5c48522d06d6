"""Record the target LLM's own response lengths over the corpus (the RLP's labels).

Each prompt goes through the server's chat template (:meth:`LlmEngine.encode`) and greedy
decoding capped at N_model tokens. Prompts are batched by similar length (left padding),
which on this CPU is about five times the single-sequence token rate. Padding can flip a
near-tie argmax, so a batched length may rarely differ from the unbatched server's; ``verify``
measures how often.

The output is JSONL, one line per prompt, appended after every batch, so a stopped run
resumes where it stopped. Response length ``n_tokens`` counts generated tokens *including*
the end-of-turn token, i.e. the decoding steps the server runs; ``capped`` marks answers that
hit N_model (their true length is >= N_model).
"""

import hashlib
import json
import pathlib
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from timebill_ros.rlp.corpus import CorpusItem

N_MODEL = 128  # most tokens collected per answer; the RLP's top bucket means ">= N_MODEL"
MAX_BATCH = 16
MAX_BATCH_TOKENS = 12288  # batch size x padded prompt length, bounds prefill memory


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


def response_length(tokens: List[int], eos_ids, n_model: int) -> tuple:
    """Return (n_tokens, capped) for generated ``tokens``: up to and including the first EOS."""
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return index + 1, False
    return n_model, True


SHORT_ANSWER_HINTS = ('one word', 'yes or no', 'one sentence', 'under twenty words')


def _asks_short(prompt: str) -> bool:
    """Guess whether a prompt asks for a short answer (batching order only, never a label)."""
    lowered = prompt.lower()
    return any(hint in lowered for hint in SHORT_ANSWER_HINTS)


def make_batches(items: List[CorpusItem], lengths: Dict[str, int],
                 max_batch: int = MAX_BATCH, max_tokens: int = MAX_BATCH_TOKENS) -> list:
    """Group items of similar prompt length; each batch has <= max_batch items and tokens.

    A batch decodes until its longest answer ends, so prompts that ask for short answers are
    batched together first: their batches stop early. Labels do not depend on the order.
    """
    ordered = sorted(items, key=lambda it: (not _asks_short(it.prompt), lengths[it.prompt_id]))
    batches, current = [], []
    for item in ordered:
        longest = max([lengths[item.prompt_id]] + [lengths[it.prompt_id] for it in current])
        if current and (len(current) >= max_batch or (len(current) + 1) * longest > max_tokens):
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def generate_batch(engine, id_lists: List[List[int]], n_model: int) -> List[List[int]]:
    """Greedy-decode a batch of prompts (left padded); return each answer's token ids."""
    pad = engine.eos_token_ids[0]
    width = max(len(ids) for ids in id_lists)
    input_ids = torch.full((len(id_lists), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(id_lists):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    with torch.inference_mode():
        out = engine.model.generate(
            input_ids=input_ids.to(engine.device), attention_mask=mask.to(engine.device),
            max_new_tokens=n_model, do_sample=False, num_beams=1, repetition_penalty=1.0,
            eos_token_id=list(engine.eos_token_ids), pad_token_id=pad)
    return [row.tolist() for row in out[:, width:].cpu()]


def collect(engine, items: List[CorpusItem], out_path, n_model: int = N_MODEL,
            max_batch: int = MAX_BATCH, limit: Optional[int] = None,
            log: Callable[[str], None] = print, clock=time.monotonic) -> int:
    """Append the response length of every item not yet in ``out_path``; return how many.

    ``limit`` caps the prompts done in this call (for a quick run). A record whose prompt text
    changed since it was written is an error: delete the file to recollect.
    """
    out_path = pathlib.Path(out_path)
    done = load_records(out_path)
    by_id = {it.prompt_id: it for it in items}
    for prompt_id, record in done.items():
        item = by_id.get(prompt_id)
        if item is not None and record.get('prompt_sha') != prompt_sha(item.prompt):
            raise ValueError(f'{out_path}: prompt {prompt_id} changed since it was collected')
        if item is not None and record.get('n_model') != n_model:
            raise ValueError(f'{out_path}: {prompt_id} was collected with n_model='
                             f'{record.get("n_model")}, not {n_model}')
    pending = [it for it in items if it.prompt_id not in done][:limit]
    if not pending:
        log(f'all {len(items)} prompts already in {out_path}')
        return 0
    encoded = {it.prompt_id: engine.encode(it.prompt) for it in pending}
    lengths = {k: len(v) for k, v in encoded.items()}
    batches = make_batches(pending, lengths, max_batch)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start, n_done = clock(), 0
    eos = set(engine.eos_token_ids)
    with out_path.open('a') as out:
        for batch in batches:
            answers = generate_batch(engine, [encoded[it.prompt_id] for it in batch], n_model)
            for item, tokens in zip(batch, answers):
                n_tokens, capped = response_length(tokens, eos, n_model)
                out.write(json.dumps({
                    'prompt_id': item.prompt_id, 'category': item.category,
                    'split': item.split, 'n_prompt_tokens': lengths[item.prompt_id],
                    'n_tokens': n_tokens, 'capped': capped, 'n_model': n_model,
                    'prompt_sha': prompt_sha(item.prompt)}) + '\n')
            out.flush()
            n_done += len(batch)
            elapsed = clock() - start
            eta = elapsed / n_done * (len(pending) - n_done)
            log(f'{n_done}/{len(pending)} prompts, {elapsed:.0f} s, ETA {eta:.0f} s')
            sys.stdout.flush()
    return n_done


def verify(engine, items: List[CorpusItem], out_path, n_prompts: int,
           log: Callable[[str], None] = print) -> List[tuple]:
    """Re-measure ``n_prompts`` collected lengths through the server's own unbatched path.

    Uses :meth:`LlmEngine.prefill` + :meth:`LlmEngine.decode` (no eviction) with EOS and
    N_model as the only stops. Returns [(prompt_id, batched n_tokens, unbatched n_tokens)]
    for ``n_prompts`` collected items spread evenly over the corpus order.
    """
    from timebill_ros import stopping
    records = load_records(out_path)
    collected = [it for it in items if it.prompt_id in records]
    chosen = collected[::max(1, len(collected) // max(1, n_prompts))][:n_prompts]
    out = []
    for item in chosen:
        record = records[item.prompt_id]
        n_model = record['n_model']
        state = engine.prefill(engine.encode(item.prompt), stopping.StopCriteria([]))
        result = engine.decode(state, n_model, stopping.StopCriteria(
            [stopping.EosStop(engine.eos_token_ids)]))
        single = len(result.token_ids) + (1 if result.stop_reason == stopping.EOS else 0)
        out.append((item.prompt_id, record['n_tokens'], single))
        log(f'{item.prompt_id}: batched {record["n_tokens"]}, unbatched {single}')
    return out
