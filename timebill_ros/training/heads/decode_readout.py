"""The decode readout: the answer's length read again at a checkpoint, from its own states.

The prefill readout (prefill_readout.py) reads the prompt's pooled states once, before the
first token. At a timebill-online checkpoint after k tokens the answer's states are there
too: decoding pools the last layer's output of every step (engine.PrefillState.answer_pool),
and this readout reads the prompt's pool and the answer's as one pool of L + 1 layers
(training/decode_features.py). It predicts the answer's whole length N, as the prefill
readout does; trained only on answers still decoding at k, its distribution is already one
of answers longer than k, and the server conditions it on N > k once more
(predictors.length_distribution.OutputFormat.rest_bounds) to bound the rest.
"""

import dataclasses
from typing import Callable, Dict, Optional, Sequence

import torch

from timebill_ros.training.decode_features import checkpoint_id, TRAIN_CHECKPOINTS
from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel, ReadoutNet


def checkpoint_examples(examples: Sequence, features: Dict[str, torch.Tensor]) -> list:
    """Return one example per (prompt, checkpoint) with features: ``<prompt id>@<k>``.

    Its ``n_tokens`` (the target) stays the answer's whole length.
    """
    out = []
    for example in examples:
        for k in TRAIN_CHECKPOINTS:
            key = checkpoint_id(example.prompt_id, k)
            if key in features:
                out.append(dataclasses.replace(example, prompt_id=key))
    return out


def n_generated_of(example) -> int:
    """Return k of a checkpoint example (``<prompt id>@<k>``)."""
    return int(example.prompt_id.rsplit('@', 1)[1])


class DecodeReadoutModel(PrefillReadoutModel):
    """Trains a :class:`ReadoutNet` on (prompt pool, answer pool) at decoding checkpoints.

    As PrefillReadoutModel (``pool_layers``: the prompt's layers), with ``features``: the
    checkpoint id -> (1, 2 (L + 1) hidden) of training.decode_features.decode_features; its
    examples are :func:`checkpoint_examples`'.
    """

    def __init__(self, final_norm: torch.Tensor, n_layers: int,
                 features: Dict[str, torch.Tensor], bucket_tokens: Optional[int] = 64,
                 n_model: int = 1024, epochs: int = 6, seed: int = 0, readout: str = 'median',
                 head: str = 'ordinal', log: Callable[[str], None] = print,
                 pool_layers: Optional[Sequence[int]] = None):
        super().__init__(final_norm, n_layers, features, bucket_tokens=bucket_tokens,
                         n_model=n_model, epochs=epochs, seed=seed, readout=readout,
                         head=head, log=log, pool_layers=pool_layers)
        self.extra_metadata = {'answer_pool': '1',
                               'checkpoints': ','.join(map(str, TRAIN_CHECKPOINTS))}

    @property
    def name(self) -> str:
        """Return e.g. ``decode readout 15+30+answer B=64 ordinal median``."""
        layers = '+'.join(map(str, self.pool_layers)) + '+answer'
        if self.bucket_tokens is None:
            return f'decode readout {layers} regression'
        head = ' ordinal' if self.head == 'ordinal' else ''
        return f'decode readout {layers} B={self.bucket_tokens}{head} {self.readout}'

    def _build_net(self, final_norm) -> torch.nn.Module:
        final = final_norm.detach().float()
        weight = torch.cat([final if n == self.n_layers else torch.ones_like(final)
                            for n in self.pool_layers] + [final])  # the answer: last layer
        return ReadoutNet(weight, self.n_classes, self.head == 'ordinal')
