"""RT-LM's lightweight predictor: an MLP on the six rule scores plus the prompt length.

RT-LM (Sec. III-B) scores each input with six linguistic-uncertainty rules (``rlp.rules``) and
trains a small MLP on those scores to predict the output length with an MSE loss. RT-LM uses
the input length as the score of an input in which no rule fires; here the prompt length
(n_prompt_tokens, tokens of the chat-formatted prompt) is instead always the seventh feature,
so the MLP sees it whether or not a rule fires. Features are standardised with the train
mean and standard deviation. The target is n_tokens / n_model (a share of the answer budget);
predictions are scaled back to tokens and clipped to [1, n_model].
"""

import math
from typing import Sequence

import numpy as np
import torch

from timebill_ros.training.heads.base import LengthModel
from timebill_ros.training.heads.checks import input_arrays, label_arrays
from timebill_ros.training.rules import RULE_NAMES, rule_scores

FEATURE_NAMES = RULE_NAMES + ('n_prompt_tokens',)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f'{name} must be an int, got {type(value).__name__} {value!r}')
    if value < 1:
        raise ValueError(f'{name} must be >= 1, got {value!r}')
    return int(value)


class RtlmMlpModel(LengthModel):
    """Rule scores + prompt length -> MLP (7 -> hidden -> hidden -> 1, ReLU) -> tokens.

    Args:
        hidden: width of the two hidden layers.
        lr: Adam learning rate.
        max_epochs: bound on the training epochs.
        patience: stop after this many epochs without a lower validation MAE (tokens).
        batch_size: examples per Adam step.
        seed: seeds the weight init and the shuffling; equal seeds give equal models.

    """

    name = 'rt-lm rules+mlp'

    def __init__(self, hidden: int = 32, lr: float = 1e-3, max_epochs: int = 300,
                 patience: int = 30, batch_size: int = 64, seed: int = 0):
        self.hidden = _positive_int('hidden', hidden)
        self.max_epochs = _positive_int('max_epochs', max_epochs)
        self.patience = _positive_int('patience', patience)
        self.batch_size = _positive_int('batch_size', batch_size)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            raise TypeError(f'lr must be a float, got {type(lr).__name__} {lr!r}')
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f'lr must be finite and > 0, got {lr!r}')
        self.lr = float(lr)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f'seed must be an int, got {type(seed).__name__} {seed!r}')
        if seed < 0:
            raise ValueError(f'seed must be >= 0, got {seed!r}')
        self.seed = int(seed)
        self.net = None
        self.mean = self.std = None  # feature standardisation, from train
        self.best_epoch = self.epochs_run = 0
        self.val_mae = math.nan  # tokens, of the kept weights

    @staticmethod
    def features(examples: Sequence) -> np.ndarray:
        """Return the (len(examples), 7) raw features: six rule scores, n_prompt_tokens."""
        n_prompt, _ = input_arrays(examples, 'examples')
        rules = np.asarray([rule_scores(ex.prompt) for ex in examples],
                           dtype=np.float64).reshape(-1, len(RULE_NAMES))
        return np.column_stack([rules, n_prompt])

    def _inputs(self, examples: Sequence) -> torch.Tensor:
        x = (self.features(examples) - self.mean) / self.std
        return torch.as_tensor(x, dtype=torch.float32)

    def _predict_share(self, x: torch.Tensor) -> np.ndarray:
        self.net.eval()
        with torch.no_grad():
            return self.net(x).squeeze(1).double().numpy()

    def fit(self, train: Sequence, val: Sequence = ()) -> None:
        """Train on ``train``; stop early on the MAE (tokens) of ``val`` (of train if empty).

        Raises:
            TypeError / ValueError: ``train`` or ``val`` is not a valid set of examples, or
                ``train`` is empty.

        """
        y_train, _, m_train = label_arrays(train, 'train')
        if val is None or len(val) == 0:
            val = train
        y_val, _, m_val = label_arrays(val, 'val')
        raw = self.features(train)
        self.mean = raw.mean(axis=0)
        std = raw.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)
        x_train = torch.as_tensor((raw - self.mean) / self.std, dtype=torch.float32)
        x_val = x_train if val is train else self._inputs(val)
        target = torch.as_tensor(y_train / m_train, dtype=torch.float32)

        with torch.random.fork_rng(devices=[]):  # seeded init, global RNG left as it was
            torch.manual_seed(self.seed)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(len(FEATURE_NAMES), self.hidden), torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, 1))
        gen = torch.Generator().manual_seed(self.seed)
        opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        best, best_state, stale = math.inf, None, 0
        for epoch in range(1, self.max_epochs + 1):
            self.net.train()
            order = torch.randperm(len(target), generator=gen)
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                loss = torch.nn.functional.mse_loss(self.net(x_train[idx]).squeeze(1),
                                                    target[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            pred = np.clip(self._predict_share(x_val) * m_val, 1.0, m_val)
            mae = float(np.abs(pred - y_val).mean())
            self.epochs_run = epoch
            if mae < best:
                best, stale, self.best_epoch = mae, 0, epoch
                best_state = {k: v.clone() for k, v in self.net.state_dict().items()}
            else:
                stale += 1
                if stale >= self.patience:
                    break
        self.net.load_state_dict(best_state)
        self.val_mae = best

    def predict_tokens(self, examples: Sequence) -> np.ndarray:
        """Return predicted lengths in tokens, clipped to [1, n_model], shape (len(examples),)."""
        if self.net is None:
            raise RuntimeError(f'{self.name}: call fit() before predict_tokens()')
        _, n_model = input_arrays(examples, 'examples')
        if n_model.size == 0:
            return np.zeros(0)
        return np.clip(self._predict_share(self._inputs(examples)) * n_model, 1.0, n_model)
