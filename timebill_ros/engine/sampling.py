"""Choosing each answer token from the logits: greedy, or sampled with a seed.

One :class:`Sampler` a goal (its own ``torch.Generator``), so goals decoding in one batch
each keep their own settings and the same seed gives the same answer whatever else runs.
The order is the one transformers' generation uses: repetition penalty (CTRL's: a seen
token's positive logit divided, a negative one multiplied), temperature, top-k, top-p.
Written here rather than through transformers' LogitsProcessor classes because those take a
(batch, vocab) tensor of one shared setting and the whole sequence of ids each step; this
works on one row's (vocab,) logits and keeps the seen tokens as a set. Never imports rclpy.
"""

import dataclasses
import math
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """One goal's sampling settings.

    temperature: 0 = greedy (the default); top_p in (0, 1]; top_k >= 0 (0 = off);
    repetition_penalty >= 1 (1 = off); seed: None = unseeded (a random seed).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None

    def __post_init__(self):
        """Check every field; ValueError names the bad one."""
        checks = (
            ('temperature', self.temperature, lambda v: 0 <= v <= 100, 'in [0, 100]'),
            ('top_p', self.top_p, lambda v: 0 < v <= 1, 'in (0, 1]'),
            ('repetition_penalty', self.repetition_penalty, lambda v: 1 <= v <= 10,
             'in [1, 10]'))
        for name, value, ok, where in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or not ok(value):
                raise ValueError(f'{name} must be a number {where}, got {value!r}')
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f'top_k must be an int >= 0, got {self.top_k!r}')
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2 ** 63):
            raise ValueError(f'seed must be an int in [0, 2^63), got {self.seed!r}')

    @property
    def greedy(self) -> bool:
        """True when every token is the argmax (after the repetition penalty)."""
        return self.temperature == 0


class Sampler:
    """Picks a goal's tokens from its logits; see the module docstring."""

    def __init__(self, config: SamplingConfig = SamplingConfig()):
        """Use ``config``; its seed (or a random one) seeds this goal's generator."""
        self.config = config
        self.seen = set()
        self.generator = None
        if not config.greedy:
            seed = config.seed if config.seed is not None else int(
                torch.randint(0, 2 ** 62, (1,)).item())
            self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """Return the next token id from ``logits`` (vocab,) and remember it."""
        cfg = self.config
        if cfg.greedy and cfg.repetition_penalty == 1:
            token = int(logits.argmax())
        else:
            token = self._pick(logits.detach().float().cpu())
        self.seen.add(token)
        return token

    def _pick(self, logits: torch.Tensor) -> int:
        cfg = self.config
        if cfg.repetition_penalty != 1 and self.seen:
            index = torch.tensor(sorted(self.seen), dtype=torch.long)
            values = logits[index]
            logits = logits.clone()
            logits[index] = torch.where(values > 0, values / cfg.repetition_penalty,
                                        values * cfg.repetition_penalty)
        if cfg.greedy:
            return int(logits.argmax())
        logits = logits / cfg.temperature
        if 0 < cfg.top_k < logits.numel():
            kth = torch.topk(logits, cfg.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float('-inf'))
        probs = torch.softmax(logits, dim=-1)
        if cfg.top_p < 1:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest head whose mass reaches top_p (the first token always).
            drop = sorted_probs.cumsum(0) - sorted_probs >= cfg.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self.generator))
