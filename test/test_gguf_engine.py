"""``engine.decode_weights: gguf``: the lean forward's one-token steps on GGUF blocks."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import LlmEngine, kernels
from timebill_ros.engine.forward import PassHooks
from timebill_ros.engine.gguf_weights import LAYER_TENSORS, read_step_blocks
from timebill_ros.engine.models.base import rope_row_order
from timebill_ros.engine.lean_llama import LeanLlamaForward
from timebill_ros.engine.model_source import embedded_gguf_path

PROMPT = 'Plan the route to the charging dock and list the steps.'


def test_the_embedded_gguf_blocks_are_the_models_weights():
    """All 211 matrices, rows reordered for RoPE as transformers does: bit-exact."""
    engine = LlmEngine.load(EngineConfig(decode_weights='float32'), EvictionConfig())
    blocks = read_step_blocks(embedded_gguf_path(), engine.model.config)
    assert len(blocks) == 7 * engine.model.config.num_hidden_layers + 1
    gemm = kernels.load()
    modules = dict(engine.model.named_modules())
    for name, (qtype, data) in blocks.items():
        weight = modules[name].weight.detach()
        assert torch.equal(gemm.dequantize(data, qtype, weight.shape[1]), weight), name
    assert {qtype for qtype, _ in blocks.values()} == {kernels.Q4_1, kernels.Q8_0}


def _assert_steps_agree(exact, on_blocks):
    """Six greedy steps of both forwards after one prefill: logits equal to float rounding."""
    ids = list(range(100, 140))
    with torch.inference_mode():
        caches = [exact.new_cache(), on_blocks.new_cache()]
        first = [f.run(ids, 0, c, step=False) for f, c in zip((exact, on_blocks), caches)]
        assert torch.equal(first[0], first[1])  # the prefill never reads the blocks
        token = int(first[0].argmax())
        for offset in range(6):
            a = exact.run([token], len(ids) + offset, caches[0], step=True)
            b = on_blocks.run([token], len(ids) + offset, caches[1], step=True)
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
            token = int(a.argmax())


@pytest.mark.parametrize('qtype', [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0,
                                   GGMLQuantizationType.Q4_0], ids=lambda t: t.name)
def test_steps_on_blocks_match_the_fp32_steps(tiny_model, qtype, quantize_model):
    """Same weights, so the one-token logits agree to float rounding; the prefill is fp32."""
    model, blocks = quantize_model(tiny_model, qtype)
    exact = LeanLlamaForward(model)
    on_blocks = LeanLlamaForward(model, None, blocks)
    assert {layer.qkv.kernel for layer in on_blocks.layers} == {f'gguf-{int(qtype)}'}
    assert on_blocks.lm_head.kernel == f'gguf-{int(qtype)}'
    _assert_steps_agree(exact, on_blocks)


Q4_K, Q5_K, Q6_K = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
                    GGMLQuantizationType.Q6_K)
# Types by linear of a file quantized as llama.cpp's Q4_K_M mixes them (v / down / head Q6_K).
MIXED = {'q_proj': Q4_K, 'k_proj': Q4_K, 'v_proj': Q4_K, 'o_proj': Q5_K, 'gate_proj': Q4_K,
         'up_proj': Q4_K, 'down_proj': Q6_K, 'lm_head': Q6_K}


def _kquantized(model, kquant_rows, qtype_of):
    """Return (model copy, {module name: (kernel type, blocks)}) of random K-quants.

    Every linear of the copy gets the gguf dequantization of random K-quant rows of type
    ``qtype_of(name)`` (K must be a multiple of 256: the 256-wide ``slow_model``).
    """
    model = copy.deepcopy(model)
    blocks = {}
    for seed, (name, module) in enumerate(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            qtype = qtype_of(name)
            n_rows, k = module.weight.shape
            raw = kquant_rows(qtype, n_rows, k, seed)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(dequantize(raw, qtype).reshape(n_rows, k)))
            blocks[name] = (int(qtype), torch.from_numpy(raw))
    return model, blocks


@pytest.mark.parametrize('qtypes', [Q4_K, Q5_K, Q6_K, 'mixed'],
                         ids=lambda t: getattr(t, 'name', t))
def test_steps_on_kquant_blocks_match_the_fp32_steps(slow_model, kquant_rows, qtypes):
    """The K-quants' blocks are gguf's weights, so the steps agree to float rounding."""
    def qtype_of(name):
        return MIXED[name.rsplit('.', 1)[-1]] if qtypes == 'mixed' else qtypes

    model, blocks = _kquantized(slow_model, kquant_rows, qtype_of)
    exact = LeanLlamaForward(model)
    on_blocks = LeanLlamaForward(model, None, blocks)
    assert all(layer.fused for layer in on_blocks.layers)
    kernel_type = int(qtype_of('model.layers.0.mlp.down_proj'))
    assert {layer.down.kernel for layer in on_blocks.layers} == {f'gguf-{kernel_type}'}
    assert on_blocks.lm_head.kernel == f'gguf-{int(qtype_of("lm_head"))}'
    _assert_steps_agree(exact, on_blocks)


def test_read_step_blocks_keeps_the_kquants_as_the_file_holds_them(tmp_path, kquant_rows):
    """A GGUF file of K-quant (and Q8_0, F32) matrices: the blocks read are its weights.

    Query / key rows in transformers' order; the F32 head is left out.
    """
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    matrices = {'attn_q': (256, 256, Q4_K), 'attn_k': (128, 256, Q5_K),
                'attn_v': (128, 256, Q6_K), 'attn_output': (256, 256, GGMLQuantizationType.Q8_0),
                'ffn_gate': (512, 256, Q4_K), 'ffn_up': (512, 256, Q5_K),
                'ffn_down': (256, 512, Q6_K)}
    path = tmp_path / 'kquants.gguf'
    writer = GGUFWriter(str(path), 'llama')
    raws = {}
    for seed, (short, (n_rows, k, qtype)) in enumerate(matrices.items()):
        if qtype == GGMLQuantizationType.Q8_0:
            weights = np.random.default_rng(seed).standard_normal((n_rows, k)) * 0.05
            raws[short] = quantize(weights.astype(np.float32), qtype)
        else:
            raws[short] = kquant_rows(qtype, n_rows, k, seed)
        writer.add_tensor(f'blk.0.{short}.weight', raws[short], raw_dtype=qtype)
    writer.add_tensor('output.weight', np.zeros((8, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    blocks = read_step_blocks(path, config)
    assert set(blocks) == {f'model.layers.0.{module}' for module in LAYER_TENSORS.values()}
    gemm = kernels.load()
    heads = {'attn_q': 4, 'attn_k': 2}
    for short, (n_rows, k, qtype) in matrices.items():
        kernel_type, data = blocks[f'model.layers.0.{LAYER_TENSORS[short]}']
        assert kernel_type == int(qtype), short
        weights = dequantize(raws[short], qtype).reshape(n_rows, k)
        if short in heads:
            weights = weights[rope_row_order(n_rows, heads[short])]
        ours = gemm.dequantize(data, kernel_type, k).numpy()
        assert np.array_equal(ours.view(np.uint32), weights.view(np.uint32)), short


def test_a_batched_step_on_blocks_equals_single_steps(tiny_model, quantize_model):
    model, blocks = quantize_model(tiny_model)
    forward = LeanLlamaForward(model, None, blocks)
    prompts = [list(range(100, 120)), list(range(300, 331)), list(range(50, 59))]
    with torch.inference_mode():
        singles, caches = [], []
        for ids in prompts:
            for _ in range(2):
                caches.append(forward.new_cache())
                forward.run(ids, 0, caches[-1], step=False)
            singles.append(forward.run([7], len(ids), caches[-2], step=True))
        batched, interrupted = forward.run_step(
            [7] * 3, [len(ids) for ids in prompts], caches[1::2], [PassHooks()] * 3)
    assert not interrupted
    for i, single in enumerate(singles):
        assert torch.allclose(batched[i], single, rtol=1e-5, atol=1e-5)


def test_gguf_needs_the_embedded_model(tiny_model, smollm2_tokenizer):
    config = EngineConfig(model_path='/some/transformers/dir', forward='lean',
                          decode_weights='gguf')
    with pytest.raises(ValueError, match='engine.model_path'):
        LlmEngine(config, EvictionConfig(), model=tiny_model, tokenizer=smollm2_tokenizer)


def test_the_embedded_model_answers_on_blocks():
    """Real parts: the server's engine with decode_weights gguf answers like fp32 here."""
    engine = LlmEngine.load(EngineConfig(decode_weights='gguf'), EvictionConfig())
    assert engine.engine_config.decode_weights == 'gguf'
    from timebill_ros.engine.stopping import StopCriteria
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    answer = engine.decode(state, 16, StopCriteria())
    assert len(answer.token_ids) == 16 and answer.text.strip()


def test_the_fused_layer_step_equals_the_op_by_op_step(tiny_model, quantize_model):
    """One C++ call a layer (engine/kernels layer_step) against the same step op by op.

    The prompt ends near the cache's capacity, so the steps also cross a growth of it.
    """
    model, blocks = quantize_model(tiny_model)
    forward = LeanLlamaForward(model, None, blocks)
    assert all(layer.fused for layer in forward.layers)
    ids = list(range(100, 350))
    with torch.inference_mode():
        fused, op_by_op = forward.new_cache(), forward.new_cache()
        token = int(forward.run(ids, 0, fused, step=False).argmax())
        forward.run(ids, 0, op_by_op, step=False)
        for offset in range(10):
            a = forward.run([token], len(ids) + offset, fused, step=True)
            for layer in forward.layers:
                layer.fused = False
            b = forward.run([token], len(ids) + offset, op_by_op, step=True)
            for layer in forward.layers:
                layer.fused = True
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
            token = int(b.argmax())
    assert fused.lengths == op_by_op.lengths == [len(ids) + 10] * len(forward.layers)
    for idx in range(len(forward.layers)):
        for x, y in zip(fused.layer_kv(idx), op_by_op.layer_kv(idx)):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_fused_batched_step_equals_the_op_by_op_batched_step(tiny_model, quantize_model):
    """Nine rows (two kernel calls of at most 8), caches from 5 to 1,100 tokens.

    Rows past 512 cached tokens split their attention into chunks that are merged again.
    """
    model, blocks = quantize_model(tiny_model)
    forward = LeanLlamaForward(model, None, blocks)
    lengths = [5, 40, 511, 512, 513, 700, 1100, 64, 9]
    with torch.inference_mode():
        fused, op_by_op = [], []
        for n in lengths:
            ids = [(7 * i + n) % 900 + 100 for i in range(n)]
            for caches in (fused, op_by_op):
                caches.append(forward.new_cache())
                forward.run(ids, 0, caches[-1], step=False)
        tokens = [11 * i + 3 for i in range(len(lengths))]
        a, _ = forward.run_step(tokens, lengths, fused, [PassHooks()] * len(lengths))
        for layer in forward.layers:
            layer.fused = False
        b, _ = forward.run_step(tokens, lengths, op_by_op, [PassHooks()] * len(lengths))
    for row in range(len(lengths)):
        assert torch.allclose(a[row], b[row], rtol=1e-5, atol=1e-5 * float(b[row].abs().max()))
    for x, y in zip(fused, op_by_op):
        assert x.lengths == y.lengths
        for idx in range(len(forward.layers)):
            for kx, ky in zip(x.layer_kv(idx), y.layer_kv(idx)):
                assert torch.allclose(kx, ky, rtol=1e-5, atol=1e-6)


def test_layers_with_biases_are_not_fused(tiny_qwen2, quantize_model):
    model, blocks = quantize_model(tiny_qwen2)
    forward = LeanLlamaForward(model, None, blocks)
    assert not any(layer.fused for layer in forward.layers)
    assert forward.layers[0].qkv.kernel.startswith('gguf')


def test_the_default_serves_the_embedded_gguf_on_its_blocks():
    """The server's default (embedded model, CPU, fp32, auto): the GGUF file, no fp32 copy."""
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    assert engine.gguf_file is not None and engine.model is None
    assert engine.engine_config.decode_weights == 'gguf'
    assert engine.engine_config.model_path == ''  # the model key stays the embedded one
    assert engine.model_key == 'smollm2-135m-instruct'


@pytest.mark.parametrize('change', [{'dtype': 'float16'}, {'forward': 'transformers'},
                                    {'decode_weights': 'float16'}, {'model_path': '/some/dir'},
                                    {'device': 'cuda', 'forward': 'transformers'}])
def test_the_embedded_gguf_is_served_only_where_its_decoder_applies(change):
    """Its blocks on the CPU in fp32; on a GPU in any dtype (the dense decoder)."""
    from timebill_ros.engine import model_source
    assert model_source.gguf_to_serve(EngineConfig()) == model_source.embedded_gguf_path()
    assert model_source.gguf_to_serve(EngineConfig(), transformers_model=True) is None
    assert model_source.gguf_to_serve(EngineConfig(**change)) is None
    for gpu in ({'device': 'cuda'}, {'device': 'cuda:0', 'dtype': 'float16'}):
        assert model_source.gguf_to_serve(EngineConfig(**gpu)) == \
            model_source.embedded_gguf_path()


def test_auto_probes_gguf_on_the_embedded_transformers_model():
    """Asked for transformers modules, auto times gguf beside fp32 and fp16."""
    engine = LlmEngine.load(EngineConfig(), EvictionConfig(), transformers_model=True)
    assert engine.model is not None and engine.gguf_skipped is None
    assert set(engine.step_format_probe) == {'float32', 'float16', 'gguf'}
    assert engine.engine_config.decode_weights in engine.step_format_probe


def test_gguf_is_not_probed_where_it_cannot_run(tiny_model):
    from timebill_ros.engine.loading import gguf_unusable_reason
    assert 'engine.model_path' in gguf_unusable_reason(
        tiny_model, EngineConfig(model_path='/some/dir'))
    half = copy.deepcopy(tiny_model).to(torch.bfloat16)
    assert 'torch.bfloat16' in gguf_unusable_reason(half, EngineConfig())
    assert gguf_unusable_reason(tiny_model, EngineConfig()) is None
