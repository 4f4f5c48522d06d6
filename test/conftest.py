"""Shared pytest fixtures: a tiny random-weight Llama with the real SmolLM2 tokenizer.

The session's ROS 2 traffic stays in a DDS domain of its own (ROS_DOMAIN_ID 1-100 from the
process id, unless set): two test sessions on one machine (two clones, a long run beside
`make test`) otherwise see each other's action servers of the same name. A client's result
request then reached both, and the other session's server, which had not seen the goal,
answered first: STATUS_UNKNOWN (test_goal_sender.py failed so, 2026-11-29, only while two
sessions ran). The nodes a test starts inherit the variable.
"""

import os

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.model_source import resolve_model_dir

# Read by rclpy.init, which no import runs: every test's context is in this domain.
os.environ.setdefault('ROS_DOMAIN_ID', str(1 + os.getpid() % 100))

TINY_SEED = 1234


@pytest.fixture(scope='session')
def smollm2_tokenizer():
    """Return the real SmolLM2 tokenizer, from the converted embedded model (converted once)."""
    model_dir = resolve_model_dir(EngineConfig())
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(scope='session')
def tiny_model(smollm2_tokenizer):
    """Return a tiny random LlamaForCausalLM (2 layers, 4 heads, 2 KV heads), eval mode.

    It has no EOS in its config so that ``generate`` runs to max_new_tokens.
    """
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(smollm2_tokenizer), max_position_embeddings=2048,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(TINY_SEED)
    return LlamaForCausalLM(config).eval()


def quantized_copy(model, qtype=GGMLQuantizationType.Q4_1):
    """Return (model copy, {module name: (type id, blocks)}) holding the same weights.

    Every linear weight of the copy is replaced by its ``qtype`` dequantization, so that
    ``decode_weights: gguf`` steps on the blocks multiply by the copy's fp32 weights.
    """
    import copy

    from gguf.quants import dequantize, quantize
    model = copy.deepcopy(model)
    blocks = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            data = quantize(module.weight.detach().numpy().astype(np.float32), qtype)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(dequantize(data, qtype)))
            blocks[name] = (int(qtype), torch.from_numpy(data.copy()))
    return model, blocks


@pytest.fixture(scope='session')
def quantize_model():
    """Return :func:`quantized_copy` (model, qtype) -> (model copy, blocks)."""
    return quantized_copy


@pytest.fixture(scope='session')
def tiny_gguf(tiny_model):
    """Return the tiny model with Q4_1 weights and its blocks (``decode_weights: gguf``)."""
    return quantized_copy(tiny_model)


@pytest.fixture
def make_tiny_engine(tiny_model, tiny_gguf, smollm2_tokenizer):
    """Return a factory of LlmEngine on the tiny model (chunks of 16 tokens, window 8).

    decode_weights ``gguf``: the tiny model with Q4_1 weights, one-token steps on its blocks.
    prefix_cache: a PrefixCacheConfig (None: no prefix store).
    """
    def make(scorer='snapkv', window_size=8, prefill_chunk_tokens=16, forward='auto',
             decode_weights='float32', prefix_cache=None):
        model, blocks = tiny_gguf if decode_weights == 'gguf' else (tiny_model, None)
        return LlmEngine(EngineConfig(prefill_chunk_tokens=prefill_chunk_tokens,
                                      forward=forward, decode_weights=decode_weights),
                         EvictionConfig(scorer=scorer, window_size=window_size),
                         model=model, tokenizer=smollm2_tokenizer, step_blocks=blocks,
                         prefix_cache=prefix_cache or PrefixCacheConfig(enabled=False))
    return make


@pytest.fixture(scope='session')
def slow_model(smollm2_tokenizer):
    """Return a small random LlamaForCausalLM (4 layers of width 256, 4096 positions).

    Several ms per decoding step on CPU: a 3000-token answer is still decoding seconds later,
    so tests can act while the server decodes. Greedy decoding of these weights settles into
    a cycle without EOS (fixed seed; its config has no EOS either).
    """
    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(smollm2_tokenizer), max_position_embeddings=4096,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(7)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope='session')
def tiny_qwen2(smollm2_tokenizer):
    """Return a tiny random Qwen2 (biases on q, k, v)."""
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(smollm2_tokenizer), max_position_embeddings=2048,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random biases: zero ones would not test them
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


# Tame fp16 super-block scales (d, dmin) of random K-quant rows: weights of about +-0.07, centred.
_KQUANT_SCALES = {GGMLQuantizationType.Q4_K: (5e-5, 3.75e-4),
                  GGMLQuantizationType.Q5_K: (2.5e-5, 3.9e-4),
                  GGMLQuantizationType.Q6_K: (1.2e-5, 0.0)}


def _kquant_rows(qtype, n_rows, k, seed, wild=False):
    """Return (N, K / 256 * type bytes) uint8 random K-quant rows in gguf's byte layout.

    Codes and sub-block scales are random bytes; each super-block's fp16 d / dmin are near
    ``_KQUANT_SCALES``'s, or with ``wild`` any finite fp16 (negative, subnormal, up to 65504).
    """
    rng = np.random.default_rng(seed)
    type_size = GGML_QUANT_SIZES[qtype][1]
    n = n_rows * k // 256
    raw = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    if wild:
        halves = rng.integers(0, 0x10000, (n, 2)).astype(np.uint16)
        halves[(halves & 0x7c00) == 0x7c00] &= 0xbfff  # no inf / NaN: clear an exponent bit
    else:
        halves = (np.array(_KQUANT_SCALES[qtype]) * rng.uniform(0.5, 1.5, (n, 2)))
        halves = halves.astype(np.float16)
    halves = np.ascontiguousarray(halves).view(np.uint8).reshape(n, 4)
    if qtype == GGMLQuantizationType.Q6_K:
        raw[:, 208:210] = halves[:, :2]  # Q6_K: ql, qh, scales, then d
    else:
        raw[:, 0:4] = halves  # Q4_K / Q5_K: d, dmin, then scales, (qh,) qs
    return raw.reshape(n_rows, -1)


@pytest.fixture(scope='session')
def kquant_rows():
    """Return a factory of random K-quant rows: (qtype, n_rows, k, seed, wild=False) -> uint8."""
    return _kquant_rows


@pytest.fixture(scope='module')
def written(tmp_path_factory, kquant_rows):
    """Return a factory: (arch, types) -> (path, transformers model on the same weights).

    Tiny random-weight GGUF files (gguf_files.py), written once a module per (arch, types).
    """
    from gguf_files import tiny_model, write_model
    made = {}

    def make(arch, types):
        key = (arch, str(types))
        if key not in made:
            path = tmp_path_factory.mktemp('gguf') / f'{arch}.gguf'
            model = tiny_model(arch)
            write_model(path, arch, model, types, kquant_rows)
            made[key] = path, model
        return made[key]
    return make
