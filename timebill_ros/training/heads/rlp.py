"""The fine-grained response-length predictor (RLP, TimeBill Sec. 4.1, Fig. 3).

Embedding + the target LLM's own first L decoder layers (RMSNorm, causal attention, RMSNorm,
SwiGLU FFN, all transformers' ``LlamaDecoderLayer``) + the final RMSNorm + a classification
head over ceil(N_model / B) buckets; N^ = min(N_max, n^ B) (Eq. 2), n^ the argmax
bucket as in the paper or (default) the median of the bucket distribution
(predictors/length_distribution.py).
Labels are the target model's own response lengths (the paper's knowledge-distillation
set-up). ``bucket_tokens=None`` gives the regression variant of Table 1 (one output, the
length / N_model).

Training cost on a 2-core CPU decides one choice: the embedding and the first L - T layers are
frozen (T = ``n_trainable_layers``), so their output is computed once per prompt and cached;
only the last T layers, the norm and the head learn. Input is one prompt at a time (no padding)
because the server also predicts one prompt at a time; the head reads the hidden state of the
last token (the assistant header, where the target model decides how to answer) and the mean
over tokens.
"""

import copy
import random
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch
from torch import nn

from timebill_ros.predictors.compress import compress_ids
from timebill_ros.training.heads.base import LengthModel, bucket_length, bucket_of
from timebill_ros.predictors.length_distribution import quantile_bucket, read_bucket, READOUTS

HEAD_HIDDEN = 256
HEADS = ('softmax', 'ordinal')
LOG_FLOOR = 1e-9  # ordinal head: bucket probabilities are clamped here before the log


def ordinal_threshold_logits(raw: torch.Tensor) -> torch.Tensor:
    """Return z (1, C - 1), the logits of P(n > edge_j), from the ordinal head's raw output."""
    return raw[:, :1] - torch.cumsum(nn.functional.softplus(raw[:, 1:]), dim=-1)


def ordinal_log_probs(raw: torch.Tensor) -> torch.Tensor:
    """Map the ordinal head's raw output (1, C) to bucket log-probabilities (1, C).

    A cumulative-link (ordinal) model: z_j = raw_0 - sum_{i=1..j+1} softplus(raw_i) is the
    logit of P(n > edge_j) for the C - 1 bucket edges, decreasing in j by construction, so
    P(bucket j) = P(n > edge_{j-1}) - P(n > edge_j) >= 0 always. The log-probabilities are
    what the ONNX file outputs: the server's softmax readout recovers the probabilities, so
    it reads this head exactly as it reads the plain softmax head.
    """
    above = torch.sigmoid(ordinal_threshold_logits(raw))  # (1, C - 1): P(n > edge_j)
    ones = torch.ones_like(above[:, :1])
    upper = torch.cat([ones, above], dim=-1)
    lower = torch.cat([above, torch.zeros_like(ones)], dim=-1)
    return torch.log(torch.clamp(upper - lower, min=LOG_FLOOR))


def make_head(hidden: int, n_outputs: int) -> nn.Module:
    """Return the head: [last, mean] pooled states (1, 2 hidden) -> output (1, n_outputs)."""
    return nn.Sequential(nn.Linear(2 * hidden, HEAD_HIDDEN), nn.GELU(),
                         nn.Linear(HEAD_HIDDEN, n_outputs))


class RlpNet(nn.Module):
    """Embedding + L decoder layers + RMSNorm + head; input (1, n) ids -> output (1, C)."""

    def __init__(self, target_model, n_layers: int, n_outputs: int, ordinal: bool = False):
        """Copy the embedding, the first ``n_layers`` layers and the norm of ``target_model``.

        target_model: a transformers causal LM whose ``.model`` has ``embed_tokens``,
        ``layers``, ``norm``, ``rotary_emb`` (Llama, Qwen 2 / 3, Phi-3, Gemma 3; a GGUF file's
        via :func:`timebill_ros.training.target.load_target_model`). The copies are
        independent.
        ordinal: the output is :func:`ordinal_log_probs` of the head (classification only).
        """
        super().__init__()
        base = target_model.model
        if not 1 <= n_layers <= len(base.layers):
            raise ValueError(f'n_layers must be in 1..{len(base.layers)}, got {n_layers!r}')
        if n_outputs < 1:
            raise ValueError(f'n_outputs must be >= 1, got {n_outputs!r}')
        self.embed_tokens = copy.deepcopy(base.embed_tokens)
        self.layers = nn.ModuleList(copy.deepcopy(base.layers[i]) for i in range(n_layers))
        self.norm = copy.deepcopy(base.norm)
        self.rotary_emb = copy.deepcopy(base.rotary_emb)
        self.head = make_head(base.config.hidden_size, n_outputs)
        self.ordinal = ordinal

    def run_layers(self, hidden: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Run layers ``first`` .. ``last - 1`` on hidden states (1, n, hidden); causal.

        A layer with an ``attention_type`` (Gemma 3: ``sliding_attention`` /
        ``full_attention``, each with its own RoPE base) gets that type's rotary embedding.
        No mask is passed, so every layer attends causally over the whole input: a sliding
        layer's window is not applied (the predictor reads at most ``max_input_tokens``).
        """
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        by_type = {}
        for layer in self.layers[first:last]:
            layer_type = getattr(layer, 'attention_type', None)
            if layer_type not in by_type:
                by_type[layer_type] = (self.rotary_emb(hidden, positions) if layer_type is None
                                       else self.rotary_emb(hidden, positions, layer_type))
            hidden = layer(hidden, attention_mask=None, position_ids=positions,
                           position_embeddings=by_type[layer_type])
        return hidden

    def trunk(self, input_ids: torch.Tensor, n_frozen: int) -> torch.Tensor:
        """Return the output of the embedding and the first ``n_frozen`` layers, (1, n, hidden)."""
        return self.run_layers(self.embed_tokens(input_ids), 0, n_frozen)

    def raw_top(self, hidden: torch.Tensor, n_frozen: int) -> torch.Tensor:
        """Run the remaining layers, the norm and the head on trunk output; return (1, C)."""
        hidden = self.norm(self.run_layers(hidden, n_frozen, len(self.layers)))
        pooled = torch.cat([hidden[:, -1], hidden.mean(dim=1)], dim=-1)
        return self.head(pooled)

    def top(self, hidden: torch.Tensor, n_frozen: int) -> torch.Tensor:
        """Return the output (1, C): logits, or the ordinal head's bucket log-probabilities."""
        raw = self.raw_top(hidden, n_frozen)
        return ordinal_log_probs(raw) if self.ordinal else raw

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Return logits (1, C) (or the scaled length (1, 1)) for input ids (1, n), int64."""
        return self.top(self.trunk(input_ids, len(self.layers)), len(self.layers))


class RlpModel(LengthModel):
    """Trains and runs an :class:`RlpNet` in torch (the server runs its ONNX export).

    Args:
        target_model: the target LLM (weights are copied, never changed).
        encode: prompt text -> chat-formatted token ids, exactly as the server encodes.
        bucket_tokens: B in tokens (16, 32, 64, ...), or None for the regression variant.
        n_model: N_model, the largest collected response length, tokens.
        n_layers: L, decoder layers taken from the target model.
        n_trainable_layers: T, the last T of the L layers are trained (the rest frozen); 0 =
            only the final norm and the head learn (a probe of the frozen layers' output).
        max_input_tokens: N_p used in training (compress_ids), tokens.
        feature_cache: dict shared between models with the same L and T to reuse trunk outputs.
        head: ``softmax`` (cross-entropy over the buckets, the paper's) or ``ordinal`` (a
            cumulative-link model trained with one binary cross-entropy per bucket edge: every
            edge learns from every example, and the distribution is smooth over neighbouring
            buckets; see :func:`ordinal_log_probs`).

    """

    def __init__(self, target_model, encode: Callable[[str], list],
                 bucket_tokens: Optional[int] = 16, n_model: int = 256, n_layers: int = 4,
                 n_trainable_layers: int = 1, max_input_tokens: int = 512, epochs: int = 6,
                 lr: float = 2e-4, head_lr: float = 1e-3, accumulate: int = 8, seed: int = 0,
                 feature_cache: Optional[Dict] = None, log: Callable[[str], None] = print,
                 readout: str = 'median', head: str = 'softmax'):
        if head not in HEADS:
            raise ValueError(f'head must be one of {HEADS}, got {head!r}')
        if head == 'ordinal' and bucket_tokens is None:
            raise ValueError('head ordinal needs buckets (bucket_tokens), got None')
        if readout not in READOUTS:
            raise ValueError(f'readout must be one of {READOUTS}, got {readout!r}')
        if bucket_tokens is not None and (not isinstance(bucket_tokens, int)
                                          or bucket_tokens < 1):
            raise ValueError(f'bucket_tokens must be an int >= 1 or None, got {bucket_tokens!r}')
        if not 0 <= n_trainable_layers <= n_layers:
            raise ValueError(f'n_trainable_layers must be in 0..n_layers={n_layers}, '
                             f'got {n_trainable_layers!r}')
        for name, value in (('n_model', n_model), ('epochs', epochs), ('accumulate', accumulate),
                            ('max_input_tokens', max_input_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f'{name} must be an int >= 1, got {value!r}')
        self.bucket_tokens = bucket_tokens
        self.readout = readout
        self.head = head
        self.n_model = n_model
        self.n_classes = 1 if bucket_tokens is None else -(-n_model // bucket_tokens)
        self.n_frozen = n_layers - n_trainable_layers
        self.max_input_tokens = max_input_tokens
        self.epochs, self.lr, self.head_lr, self.accumulate = epochs, lr, head_lr, accumulate
        self.seed = seed
        self.encode = encode
        self.log = log
        self.features = {} if feature_cache is None else feature_cache
        self.n_layers = n_layers
        torch.manual_seed(seed)
        self.net = self._build_net(target_model)

    def _build_net(self, target_model) -> nn.Module:
        """Return the RlpNet to train, its embedding and first n_frozen layers frozen."""
        net = RlpNet(target_model, self.n_layers, self.n_classes, ordinal=self.head == 'ordinal')
        for module in (net.embed_tokens, *net.layers[:self.n_frozen]):
            module.requires_grad_(False)
        return net

    def _trainable(self) -> tuple:
        """Return (parameters learning at ``lr``, head parameters learning at ``head_lr``)."""
        net = self.net
        return ([p for m in net.layers[self.n_frozen:] for p in m.parameters()]
                + list(net.norm.parameters()), list(net.head.parameters()))

    def _raw(self, example) -> torch.Tensor:
        """Return the head's raw output (1, C) for one example."""
        return self.net.raw_top(self._feature(example), self.n_frozen)

    def _output(self, example) -> torch.Tensor:
        """Return the output (1, C): logits, or the ordinal head's bucket log-probabilities."""
        raw = self._raw(example)
        return ordinal_log_probs(raw) if self.head == 'ordinal' else raw

    @property
    def name(self) -> str:
        """Return e.g. ``RLP L=4 B=16 median`` (its readout) or ``RLP L=4 regression``.

        T is named when it is not 1 (``RLP L=30 T=0 ...``), an ordinal head as ``ordinal``.
        """
        n_trained = self.n_layers - self.n_frozen
        stem = f'RLP L={self.n_layers}' + ('' if n_trained == 1 else f' T={n_trained}')
        if self.bucket_tokens is None:
            return f'{stem} regression'
        head = ' ordinal' if self.head == 'ordinal' else ''
        return f'{stem} B={self.bucket_tokens}{head} {self.readout}'

    def input_ids(self, prompt: str) -> list:
        """Return the compressed chat-formatted ids the predictor reads for ``prompt``."""
        return compress_ids(self.encode(prompt), self.max_input_tokens)

    def _feature(self, example) -> torch.Tensor:
        key = (example.prompt_id, self.n_frozen, self.max_input_tokens)
        if key not in self.features:
            ids = torch.tensor([self.input_ids(example.prompt)])
            with torch.no_grad():  # not inference_mode: training backpropagates through it
                self.features[key] = self.net.trunk(ids, self.n_frozen)
        return self.features[key]

    def _loss(self, output: torch.Tensor, n_tokens: int) -> torch.Tensor:
        if self.bucket_tokens is None:
            target = torch.tensor([[min(n_tokens, self.n_model) / self.n_model]])
            return nn.functional.smooth_l1_loss(output, target, beta=0.05)
        label = min(bucket_of(n_tokens, self.bucket_tokens), self.n_classes - 1)
        if self.head == 'ordinal':
            above = (torch.arange(self.n_classes - 1) < label).float().unsqueeze(0)
            return nn.functional.binary_cross_entropy_with_logits(output, above)
        return nn.functional.cross_entropy(output, torch.tensor([label]))

    def output_tokens(self, output: torch.Tensor, q: Optional[float] = None) -> float:
        """Return tokens of one output: the readout, or the ``q`` quantile when given."""
        if self.bucket_tokens is None:
            return float(np.clip(output.item() * self.n_model, 1, self.n_model))
        logits = output.detach().numpy()
        bucket = read_bucket(logits, self.readout) if q is None else quantile_bucket(logits, q)
        return float(min(bucket_length(bucket, self.bucket_tokens), self.n_model))

    def _train_output(self, example) -> torch.Tensor:
        """Return what the loss reads: the output, or the ordinal edge logits (1, C - 1)."""
        if self.head == 'ordinal':
            return ordinal_threshold_logits(self._raw(example))
        return self._output(example)

    def fit(self, train: Sequence, val: Sequence) -> None:
        """Train on ``train``; keep the epoch with the best MAE on ``val``."""
        if not train:
            raise ValueError('train must hold at least one example, got none')
        self.n_train = len(train)  # stored in the export's metadata (train_prompts)
        rng = random.Random(self.seed)
        body, head = self._trainable()
        params = [{'params': body, 'lr': self.lr}, {'params': head, 'lr': self.head_lr}]
        optimizer = torch.optim.AdamW(params, weight_decay=0.01)
        best = (float('inf'), copy.deepcopy(self.net.state_dict()))
        order = list(train)
        for epoch in range(self.epochs):
            self.net.train()
            rng.shuffle(order)
            total = 0.0
            for step, example in enumerate(order, 1):
                loss = self._loss(self._train_output(example), example.n_tokens)
                (loss / self.accumulate).backward()
                total += float(loss.detach())
                if step % self.accumulate == 0 or step == len(order):
                    optimizer.step()
                    optimizer.zero_grad()
            val_mae = self.mae(val) if val else -epoch
            self.log(f'{self.name} epoch {epoch + 1}/{self.epochs}: train loss '
                     f'{total / len(order):.4f}, val MAE {val_mae:.1f} tokens')
            if val_mae < best[0]:
                best = (val_mae, copy.deepcopy(self.net.state_dict()))
        self.net.load_state_dict(best[1])
        self.net.eval()

    def quantile_tokens(self, examples: Sequence, levels: Sequence[float]) -> np.ndarray:
        """Return (len(levels), len(examples)) tokens: each example's level-quantile lengths.

        One forward pass per example, read at every level (classification only).
        """
        self.net.eval()
        with torch.inference_mode():
            outputs = [self._output(example) for example in examples]
        return np.array([[self.output_tokens(output, level) for output in outputs]
                         for level in levels], dtype=np.float64)

    def predict_tokens(self, examples: Sequence, q: Optional[float] = None) -> np.ndarray:
        """Return predicted lengths in tokens (bucket upper edge, or the regression value).

        q: read the q-quantile of the bucket distribution instead of the point readout
        (classification only; the regression variant has no distribution and ignores it).
        """
        self.net.eval()
        out = []
        with torch.inference_mode():
            for example in examples:
                output = self._output(example)
                out.append(self.output_tokens(output, q))
        return np.array(out, dtype=np.float64)
