"""Base class of KV-cache scorers, and the choice of the positions to keep.

Tensor shapes use B = batch, H = KV heads, N = prompt tokens, D = head dim, W = window tokens.
"""

from typing import Optional

import torch
from torch import nn


class EvictionScorer:
    """Ranks the prompt KV entries of one attention layer; higher score = keep.

    Subclasses override :meth:`score`. Scores are computed once, after the prefill, on the
    full prompt keys/values, so the eviction ratio can be chosen after the prefill.
    """

    name = 'base'

    @classmethod
    def from_config(cls, eviction_config):
        """Return the scorer for an EvictionConfig (make_scorer's one factory shape)."""
        return cls()

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor, kwargs: dict,
              n_keep: Optional[int] = None) -> torch.Tensor:
        """Return scores of shape (B, H, N), higher = keep.

        module: the layer's attention module (q_proj, config, head_dim).
        hidden_states: attention input of the last prompt positions, (B, >W, hidden).
        keys, values: the layer's prompt cache, (B, H, N, D).
        kwargs: forward kwargs captured for those positions, e.g. ``position_embeddings``
            (cos, sin), each (B, >W, D).
        n_keep: tokens the caller will keep; only scorers whose kvpress score depends on the
            compression ratio (StreamingLLM) use it. None = keep all.
        """
        raise NotImplementedError


def n_keep_for(n_x: int, alpha: float, window_size: int) -> int:
    """Return the prompt tokens kept for eviction ratio ``alpha``.

    N_x - round(alpha N_x), at least ``window_size`` (the observation window is always kept)
    and at most N_x. Units: tokens.
    """
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise TypeError(f'alpha must be a number, got {alpha!r}')
    if not 0 <= alpha < 1:
        raise ValueError(f'alpha must be in [0, 1), got {alpha!r}')
    return min(n_x, max(window_size, n_x - round(alpha * n_x)))


def keep_indices(scores: torch.Tensor, n_keep: int, window_size: int) -> torch.Tensor:
    """Return the positions to keep, shape (B, H, n_keep), ascending (original order).

    The last ``window_size`` positions (the observation window) are always kept: their
    scores are set to +inf before the top-``n_keep`` selection.
    """
    if scores.dim() != 3:
        raise ValueError(f'scores must have shape (B, H, N), got {tuple(scores.shape)}')
    n_x = scores.shape[-1]
    if not isinstance(n_keep, int) or not min(window_size, n_x) <= n_keep <= n_x:
        raise ValueError(f'n_keep must be an int in [{min(window_size, n_x)}, {n_x}], '
                         f'got {n_keep!r}')
    return windowed(scores, window_size).topk(n_keep, dim=-1).indices.sort(dim=-1).values


def windowed(scores: torch.Tensor, window_size: int) -> torch.Tensor:
    """Return a copy of ``scores`` (B, H, N) with the last ``window_size`` positions at +inf."""
    scores = scores.clone()
    if window_size > 0:
        scores[..., -window_size:] = float('inf')
    return scores


def gather_positions(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Return ``tensor`` (B, H, N, D) restricted to ``indices`` (B, H, K): (B, H, K, D)."""
    # Same gather as kvpress's ScorerPress.compress, which cannot be reused here because it
    # takes its own top-k without the forced observation window.
    index = indices.unsqueeze(-1).expand(-1, -1, -1, tensor.shape[-1])
    return tensor.gather(2, index).contiguous()
