"""Input checks shared by the baseline length models: examples to arrays (tokens)."""

from typing import Sequence, Tuple

import numpy as np


def _sequence(examples: Sequence, what: str) -> Sequence:
    if isinstance(examples, (str, bytes)) or not hasattr(examples, '__len__'):
        raise TypeError(f'{what} must be a sequence of Example, got {type(examples).__name__}')
    return examples


def input_arrays(examples: Sequence, what: str) -> Tuple[np.ndarray, np.ndarray]:
    """Return (n_prompt_tokens, n_model) of ``examples`` as float64 arrays, tokens (may be empty).

    ``what`` names the argument in error messages (e.g. ``'examples'``).

    Raises:
        TypeError: ``examples`` is a str or not a sequence of training.dataset.Example-like
            objects.
        ValueError: an example has n_model < 1 or n_prompt_tokens < 0.

    """
    rows = []
    for ex in _sequence(examples, what):
        try:
            n_prompt, n_model = int(ex.n_prompt_tokens), int(ex.n_model)
        except AttributeError as err:
            raise TypeError(f'{what} holds a {type(ex).__name__}, not an Example') from err
        if n_model < 1 or n_prompt < 0:
            raise ValueError(f'{what}: example {getattr(ex, "prompt_id", "?")!r} has '
                             f'n_prompt_tokens={n_prompt}, n_model={n_model}; need '
                             'n_prompt_tokens >= 0 and n_model >= 1')
        rows.append((n_prompt, n_model))
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def label_arrays(examples: Sequence, what: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (n_tokens, n_prompt_tokens, n_model) of non-empty ``examples``, float64, tokens.

    Raises:
        TypeError: as :func:`input_arrays`.
        ValueError: ``examples`` is empty, an input is invalid (:func:`input_arrays`), or an
            example's n_tokens is outside [1, n_model].

    """
    if len(_sequence(examples, what)) == 0:
        raise ValueError(f'{what} is empty (0 examples)')
    n_prompt, n_model = input_arrays(examples, what)
    n_tokens = np.asarray([int(ex.n_tokens) for ex in examples], dtype=np.float64)
    bad = np.flatnonzero((n_tokens < 1) | (n_tokens > n_model))
    if bad.size:
        ex = examples[int(bad[0])]
        raise ValueError(f'{what}: example {getattr(ex, "prompt_id", "?")!r} has '
                         f'n_tokens={ex.n_tokens}, outside [1, n_model={ex.n_model}]')
    return n_tokens, n_prompt, n_model
