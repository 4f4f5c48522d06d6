"""The predictor data set: corpus prompts joined with the collected response lengths."""

import dataclasses
import pathlib
from typing import Dict, List

from timebill_ros.training.collect import load_records, prompt_sha
from timebill_ros.training.corpus import build_corpus, family_splits, SPLITS

# How prompts are split: ``prompt`` (a seeded hash of each prompt id; train and test share
# templates) or ``family`` (whole template families held out for val and test).
SPLIT_VIEWS = ('prompt', 'family')


@dataclasses.dataclass(frozen=True)
class Example:
    """One labelled prompt.

    prompt: the user message (no chat template). n_tokens: the target LLM's response length,
    tokens including end-of-turn, at most n_model. capped: the answer hit n_model.
    n_prompt_tokens: chat-formatted prompt length, tokens.
    """

    prompt_id: str
    category: str
    split: str
    prompt: str
    n_tokens: int
    capped: bool
    n_prompt_tokens: int
    n_model: int


def load_examples(lengths_path, view: str = 'prompt') -> Dict[str, List[Example]]:
    """Return {split: [Example]} for every corpus prompt that has a collected length.

    ``view`` picks the split of each prompt (SPLIT_VIEWS): ``prompt`` its own, ``family``
    its category's (:func:`~timebill_ros.training.corpus.family_splits`).

    Raises:
        FileNotFoundError: ``lengths_path`` does not exist (run ``timebill predictor collect``).
        ValueError: a record's prompt text no longer matches the corpus.

    """
    if view not in SPLIT_VIEWS:
        raise ValueError(f'view must be one of {SPLIT_VIEWS}, got {view!r}')
    families = family_splits()
    path = pathlib.Path(lengths_path)
    if not path.exists():
        raise FileNotFoundError(
            f'{path} not found: run `timebill predictor collect --out {path}` first')
    records = load_records(path)
    out = {split: [] for split in SPLITS}
    for item in build_corpus():
        record = records.get(item.prompt_id)
        if record is None:
            continue
        if record['prompt_sha'] != prompt_sha(item.prompt):
            raise ValueError(f'{path}: prompt {item.prompt_id} changed since it was collected')
        split = families[item.category] if view == 'family' else item.split
        out[split].append(Example(
            item.prompt_id, item.category, split, item.prompt, int(record['n_tokens']),
            bool(record['capped']), int(record['n_prompt_tokens']), int(record['n_model'])))
    return out
