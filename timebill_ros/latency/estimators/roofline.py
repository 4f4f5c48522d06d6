"""Roofline predictor: analytic FLOPs and bytes of a Llama-style decoder over PK and BW.

T = max(FLOPs / PK, bytes / BW) per phase (Imai et al., 2024, as SimFLi's baseline), with
FLOPs and bytes in closed form from the model config and the lengths. It measures nothing
but the machine's peaks (:mod:`timebill_ros.latency.hardware`), so its fit ignores the
probes. Counted (the server's engine computes logits of the last position only):

* prefill of s tokens: 2 s P_layers FLOP for the linear layers, 4 L h d_head s(s + 1)/2 for
  causal attention, 2 d V for the LM head; bytes: weights once plus the KV cache written;
* decoding step with n cached tokens: 2 (P_layers + d V) + 4 L h d_head (n + 1) FLOP; bytes:
  weights plus the KV cache read.
"""

import dataclasses
import json
import os

import numpy as np

from timebill_ros.latency.estimators.base import LatencyModel, LatencyPredictor


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Decoder shape: d hidden, L layers, h heads, h_kv KV heads, d_head, f FFN, V vocab.

    bytes_per_value: bytes of one weight / cache value (4 for float32).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    bytes_per_value: int = 4

    @classmethod
    def from_config_file(cls, path, bytes_per_value=4):
        """Read a Hugging Face ``config.json`` of a Llama-style model."""
        with open(path, encoding='utf-8') as stream:
            cfg = json.load(stream)
        heads = cfg['num_attention_heads']
        return cls(hidden=cfg['hidden_size'], layers=cfg['num_hidden_layers'], heads=heads,
                   kv_heads=cfg.get('num_key_value_heads', heads),
                   head_dim=cfg.get('head_dim') or cfg['hidden_size'] // heads,
                   ffn=cfg['intermediate_size'], vocab=cfg['vocab_size'],
                   bytes_per_value=bytes_per_value)

    @classmethod
    def from_model_dir(cls, model_dir, bytes_per_value=4):
        """Read ``<model_dir>/config.json``."""
        return cls.from_config_file(os.path.join(model_dir, 'config.json'), bytes_per_value)

    @property
    def layer_params(self):
        """Weights of all decoder layers' linear maps (attention and MLP), values."""
        d, kv = self.hidden, self.kv_heads * self.head_dim
        attention = d * self.heads * self.head_dim * 2 + d * kv * 2
        return self.layers * (attention + 3 * d * self.ffn)

    def kv_values(self, n_tokens):
        """Values in the KV cache of ``n_tokens`` tokens (keys and values, all layers)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * np.asarray(n_tokens, float)

    def prefill_flops(self, s):
        """Return the FLOPs of the prefill of ``s`` tokens."""
        s = np.asarray(s, dtype=float)
        attention = 4.0 * self.layers * self.heads * self.head_dim * s * (s + 1) / 2
        return 2.0 * s * self.layer_params + attention + 2.0 * self.hidden * self.vocab

    def prefill_bytes(self, s):
        """Return the bytes moved by the prefill of ``s`` tokens (weights once, cache written)."""
        weights = self.layer_params + self.hidden * self.vocab
        return self.bytes_per_value * (weights + self.kv_values(s))

    def step_flops(self, n_kv):
        """Return the FLOPs of one decoding step with ``n_kv`` tokens cached."""
        n_kv = np.asarray(n_kv, dtype=float)
        attention = 4.0 * self.layers * self.heads * self.head_dim * (n_kv + 1)
        return 2.0 * (self.layer_params + self.hidden * self.vocab) + attention

    def step_bytes(self, n_kv):
        """Return the bytes moved by one decoding step (weights and the cache read)."""
        weights = self.layer_params + self.hidden * self.vocab
        return self.bytes_per_value * (weights + self.kv_values(n_kv))


def roofline_seconds(arch, hardware):
    """Return (prefill(s), step(n_kv)) callables of roofline seconds."""
    def prefill(s):
        return np.maximum(arch.prefill_flops(s) / hardware.peak_flops,
                          arch.prefill_bytes(s) / hardware.bandwidth_bps)

    def step(n_kv):
        return np.maximum(arch.step_flops(n_kv) / hardware.peak_flops,
                          arch.step_bytes(n_kv) / hardware.bandwidth_bps)
    return prefill, step


class Roofline(LatencyPredictor):
    """The analytic roofline time itself; probes are not used."""

    name = 'roofline'
    min_probes = 0

    def __init__(self, arch, hardware):
        """arch: :class:`Architecture`. hardware: measured :class:`Hardware`."""
        self.arch = arch
        self.hardware = hardware

    def fit(self, probes):
        """Return the roofline model (``probes`` is ignored)."""
        prefill, step = roofline_seconds(self.arch, self.hardware)
        return LatencyModel(prefill=prefill, step=step)
