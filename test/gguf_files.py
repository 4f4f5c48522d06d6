"""Tiny random-weight GGUF files of every supported architecture, written with gguf's writer.

``write_model`` takes a tiny transformers model, writes its weights in the chosen GGUF types
(llama.cpp's names and row order; Gemma's norms as ``1 + weight``, as llama.cpp's converter
writes them) and then loads the dequantized weights back into the transformers model, so that
both run exactly the same weights: transformers is the independent fp32 reference.
``write_tokenizer_*`` add a small vocabulary of either kind.
"""

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from timebill_ros.engine.models.base import rope_row_order

T = GGMLQuantizationType
KQUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 256, 512, 4, 2, 64, 320
# A mixed assignment like llama.cpp's Q4_K_M (gemma-3-270m's: Q5_0 q/k/gate/up, Q8_0 v,
# Q4_K output, Q6_K down, Q8_0 embeddings).
MIXED = {'attn_q': T.Q5_0, 'attn_k': T.Q5_0, 'attn_v': T.Q8_0, 'attn_output': T.Q4_K,
         'attn_qkv': T.Q5_0, 'ffn_gate': T.Q5_0, 'ffn_up': T.Q5_0, 'ffn_down': T.Q6_K,
         'token_embd': T.Q8_0, 'output': T.Q6_K}
_COMMON = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
               num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=512)


def tiny_model(arch: str, seed: int = 0):
    """Return a tiny random transformers model of ``arch`` (fp32, eval)."""
    torch.manual_seed(seed)
    if arch == 'llama':
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **_COMMON))
    elif arch == 'qwen2':
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, **_COMMON))
    elif arch == 'qwen3':
        model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=HEAD_DIM, **_COMMON))
    elif arch == 'gemma3':
        model = Gemma3ForCausalLM(Gemma3TextConfig(
            num_hidden_layers=6, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM,
            sliding_window=8, **_COMMON))
    elif arch == 'phi3':
        model = Phi3ForCausalLM(Phi3Config(num_hidden_layers=2, tie_word_embeddings=False,
                                           pad_token_id=0, **_COMMON))
    else:
        raise ValueError(arch)
    with torch.no_grad():  # random norms and biases: ones and zeros would test nothing
        for name, param in model.named_parameters():
            if 'norm' in name or name.endswith('bias'):
                param.copy_(torch.randn_like(param) * 0.3 + (0.0 if 'bias' in name else 1.0))
    return model.eval()


def _gguf_tensors(arch: str, model):
    """Yield (GGUF name, weight (N, K) or vector, HF parameter name, rows to permute)."""
    state = model.state_dict()
    embed = 'model.embed_tokens.weight'
    yield 'token_embd.weight', state[embed], embed, None
    yield 'output_norm.weight', state['model.norm.weight'], 'model.norm.weight', None
    if 'lm_head.weight' in state and not model.config.tie_word_embeddings:
        yield 'output.weight', state['lm_head.weight'], 'lm_head.weight', None
    norms = {'input_layernorm': 'attn_norm', 'post_attention_layernorm': 'ffn_norm'}
    if arch == 'gemma3':
        norms = {'input_layernorm': 'attn_norm',
                 'post_attention_layernorm': 'post_attention_norm',
                 'pre_feedforward_layernorm': 'ffn_norm',
                 'post_feedforward_layernorm': 'post_ffw_norm'}
    modules = {'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k',
               'self_attn.v_proj': 'attn_v', 'self_attn.o_proj': 'attn_output',
               'self_attn.qkv_proj': 'attn_qkv', 'self_attn.q_norm': 'attn_q_norm',
               'self_attn.k_norm': 'attn_k_norm', 'mlp.gate_proj': 'ffn_gate',
               'mlp.up_proj': 'ffn_up', 'mlp.gate_up_proj': 'ffn_up', 'mlp.down_proj': 'ffn_down'}
    modules.update({norm: gguf for norm, gguf in norms.items()})
    for i in range(model.config.num_hidden_layers):
        for module, short in modules.items():
            for kind in ('weight', 'bias'):
                key = f'model.layers.{i}.{module}.{kind}'
                if key not in state:
                    continue
                heads = {'attn_q': HEADS, 'attn_k': KV_HEADS}.get(short)
                permute = heads if arch == 'llama' and heads else None
                yield f'blk.{i}.{short}.{"bias" if kind == "bias" else "weight"}', \
                    state[key], key, permute


def _to_file(weight: np.ndarray, qtype, kquant_rows, seed: int):
    """Return (raw data as written, fp32 weights it dequantizes to)."""
    if qtype == T.F32:
        return weight, weight
    if qtype == T.F16:
        raw = weight.astype(np.float16)
        return raw, raw.astype(np.float32)
    if qtype in KQUANTS:
        raw = kquant_rows(qtype, weight.shape[0], weight.shape[1], seed)
    else:
        raw = quantize(weight, qtype)
    return raw, dequantize(raw, qtype).reshape(weight.shape).astype(np.float32)


def write_model(path, arch: str, model, types, kquant_rows, tokenizer=None) -> None:
    """Write ``model``'s weights into a GGUF file at ``path``, then load them back into it.

    types: {GGUF short name (``attn_q``, ``token_embd``...): GGML type}, or one type for every
    matrix (norms and biases stay F32). tokenizer: a function adding tokenizer metadata to
    the writer, or None.
    """
    config = model.config
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, 'head_dim', None) or HIDDEN // HEADS
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = config.rope_parameters
    rope = rope.get('full_attention', rope)
    writer.add_rope_freq_base(float(rope['rope_theta']))
    if arch == 'gemma3':
        writer.add_sliding_window(config.sliding_window)
    if tokenizer is not None:
        tokenizer(writer)
    loaded = {}
    for seed, (name, value, key, heads) in enumerate(_gguf_tensors(arch, model)):
        weight = value.detach().float().numpy().copy()
        if weight.ndim == 1:
            raw = weight + 1.0 if arch == 'gemma3' and 'norm' in name else weight
            writer.add_tensor(name, raw)
            loaded[key] = weight
            continue
        short = name.split('.')[-2]
        qtype = types.get(short, T.Q8_0) if isinstance(types, dict) else types
        if heads:  # llama.cpp's interleaved RoPE rows: HF row order[i] = file row i
            weight = weight[np.argsort(rope_row_order(weight.shape[0], heads))]
        raw, back = _to_file(weight, qtype, kquant_rows, seed)
        writer.add_tensor(name, raw, raw_dtype=qtype if qtype != T.F32 else None)
        if heads:
            back = back[rope_row_order(back.shape[0], heads)]
        loaded[key] = back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    state = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in loaded.items()}
    if config.tie_word_embeddings:
        state['lm_head.weight'] = state['model.embed_tokens.weight']
    model.load_state_dict(state, strict=False)


def byte_level_tokenizer(writer) -> None:
    """Add a tiny ``gpt2`` (byte-level BPE) tokenizer with ChatML specials and template."""
    from tokenizers.pre_tokenizers import ByteLevel
    chars = sorted(ByteLevel.alphabet())
    merges = ['Ġ t', 'h e', 'Ġt he', 'Ġ a', 'o r']
    specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
    tokens = specials + chars + [m.replace(' ', '') for m in merges]
    tokens += [f'<extra_{i}>' for i in range(VOCAB - len(tokens))]
    writer.add_tokenizer_model('gpt2')
    writer.add_tokenizer_pre('smollm')
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


SPM_PIECES = ['\u2581', 'a', 'b', 'c', '\u2581a', 'ab', '\u2581ab', 'bc', 'abc', '\u2581abc',
              'ca', '\u2581b']


def sentencepiece_tokenizer(writer) -> None:
    """Add a tiny ``llama`` (SentencePiece) tokenizer: scored pieces, byte fallback, no template.

    Scores make ``ab`` merge before ``bc`` (so "abc" -> "abc" via "ab" + "c"), and every
    byte token exists (for characters outside the pieces).
    """
    specials = ['<pad>', '<eos>', '<bos>', '<unk>']
    tokens = specials + [f'<0x{b:02X}>' for b in range(256)] + SPM_PIECES
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(SPM_PIECES))]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * len(SPM_PIECES)
    n_extra = VOCAB - len(tokens)
    tokens += [f'<unused{i}>' for i in range(n_extra)]
    scores += [-1000.0] * n_extra
    types += [4] * n_extra
    writer.add_tokenizer_model('llama')
    writer.add_tokenizer_pre('default')
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)


def rel_error(a, b) -> float:
    """Return max |a - b| relative to the largest |b| (logits: the largest logit)."""
    return float((a - b).abs().max() / b.abs().max())
