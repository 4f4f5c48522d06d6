"""The prefill readout: N^ read from the target model's own prefill (a probe of all its layers).

The RLP of TimeBill runs a small copy of the target model's first L layers beside the prefill.
The prefill itself computes every layer's hidden states anyway: this model is the RLP's
norm + head (rlp.py) on those states, pooled as the RLP pools its own (the last token's and
the mean over tokens, after an RMSNorm), for the middle and the last layer by default. The
engine pools them during every prefill (engine.forward.HiddenPool: unit-RMS rows, [last,
mean], (1, 2 x layers x hidden)); the head learns per-channel weights and the MLP. On the
family-held-out split (docs/predictor.md) it is the only predictor beating every baseline on
MAE and R^2; reading it from the server's prefill costs no separate t_Predict, at the price
of predicting after the prefill (the admission-time u_J keeps the L = 4 RLP, which runs
before it).
"""

from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn

from timebill_ros.training.heads.rlp import make_head, ordinal_log_probs, RlpModel


def default_pool_layers(n_layers: int) -> tuple:
    """Return the layers the readout pools by default: the middle one and the last (1-based).

    bench/studies/readout_layers.py (family view, 3 seeds): the last layer alone MAE 193.9
    (sd 9.4), layers 15 + 30 of 30 172.8 (3.9), 8 + 15 + 22 + 30 174.3 (5.1).
    """
    return (max(1, n_layers // 2), n_layers)


class ReadoutNet(nn.Module):
    """Per-channel weights + head; input the pooled unit-RMS states (1, 2 W) -> (1, C).

    weight: (W,), W = layers x hidden: the starting per-channel weights (the final norm's for
    the last layer, ones for the others); they learn with the head.
    """

    def __init__(self, weight: torch.Tensor, n_outputs: int, ordinal: bool = False):
        """Start from ``weight`` (W,); a fresh head with ``n_outputs`` outputs."""
        super().__init__()
        self.norm_weight = nn.Parameter(weight.detach().clone().float())
        self.head = make_head(self.norm_weight.shape[0], n_outputs)
        self.ordinal = ordinal

    def raw(self, pooled: torch.Tensor) -> torch.Tensor:
        """Return the head's raw output (1, C) for pooled states (1, 2 W)."""
        return self.head(pooled * torch.cat([self.norm_weight, self.norm_weight]))

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """Return logits (1, C), or the ordinal head's bucket log-probabilities (1, C)."""
        raw = self.raw(pooled)
        return ordinal_log_probs(raw) if self.ordinal else raw


class PrefillReadoutModel(RlpModel):
    """Trains a :class:`ReadoutNet` on pooled prefill states (training.prefill_features).

    Args:
        final_norm: the target model's final norm multiplier (hidden,), as its forward applies
            it (training.target.final_norm_weight): the last layer's starting weights.
        n_layers: the target model's decoder layers.
        features: prompt id -> pooled states (1, 2 x layers x hidden), from the engine's
            prefill with ``pool_layers``.
        pool_layers: the decoder layers pooled, 1-based (default_pool_layers when None).
        bucket_tokens / n_model / epochs / seed / readout / head / log: as RlpModel (the
            defaults are those of the best family-view probe: B = 64, ordinal, median).

    """

    def __init__(self, final_norm: torch.Tensor, n_layers: int,
                 features: Dict[str, torch.Tensor],
                 bucket_tokens: Optional[int] = 64, n_model: int = 1024, epochs: int = 6,
                 seed: int = 0, readout: str = 'median', head: str = 'ordinal',
                 log: Callable[[str], None] = print,
                 pool_layers: Optional[Sequence[int]] = None):
        pool_layers = tuple(pool_layers or default_pool_layers(n_layers))
        if not pool_layers or any(not 1 <= n <= n_layers for n in pool_layers):
            raise ValueError(f'pool_layers must be in 1..{n_layers}, got {pool_layers!r}')
        self.pool_layers = pool_layers
        super().__init__(final_norm, encode=None, bucket_tokens=bucket_tokens,
                         n_model=n_model, n_layers=n_layers, n_trainable_layers=0,
                         epochs=epochs, seed=seed, feature_cache=features, log=log,
                         readout=readout, head=head)

    @property
    def name(self) -> str:
        """Return e.g. ``prefill readout 15+30 B=64 ordinal median`` (layers pooled first).

        Only the last layer pooled: no layers named (``prefill readout B=64 ...``).
        """
        layers = ('' if self.pool_layers == (self.n_layers,)
                  else ' ' + '+'.join(map(str, self.pool_layers)))
        if self.bucket_tokens is None:
            return f'prefill readout{layers} regression'
        head = ' ordinal' if self.head == 'ordinal' else ''
        return f'prefill readout{layers} B={self.bucket_tokens}{head} {self.readout}'

    def _build_net(self, final_norm) -> nn.Module:
        final = final_norm.detach().float()
        weight = torch.cat([final if n == self.n_layers else torch.ones_like(final)
                            for n in self.pool_layers])
        return ReadoutNet(weight, self.n_classes, self.head == 'ordinal')

    def _trainable(self) -> tuple:
        return [self.net.norm_weight], list(self.net.head.parameters())

    def _feature(self, example) -> torch.Tensor:
        try:
            return self.features[example.prompt_id]
        except KeyError:
            raise ValueError(f'no prefill features for prompt {example.prompt_id!r}: '
                             'run training.prefill_features over it first') from None

    def _raw(self, example) -> torch.Tensor:
        return self.net.raw(self._feature(example))

    def input_ids(self, prompt: str) -> list:
        """Refuse: the readout reads the prefill's pooled states, not token ids of its own."""
        raise TypeError('the prefill readout reads pooled prefill states, not token ids')
