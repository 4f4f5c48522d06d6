"""The lean Llama forward against transformers' own modules, on tiny random models."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import LlmEngine, make_forward
from timebill_ros.engine.hf_forward import TransformersForward
from timebill_ros.engine.lean_llama import fbgemm_fp16_available, LeanLlamaForward
from timebill_ros.engine.stopping import StopCriteria

PROMPT = 'List the steps to pick up the red cup from the table and put it in the sink.'


def _engines(model, tokenizer, decode_weights='float32'):
    return [LlmEngine(EngineConfig(forward=forward, decode_weights=decode_weights),
                      EvictionConfig(window_size=8), model=model, tokenizer=tokenizer)
            for forward in ('lean', 'transformers')]


def _generate(engine, ids, alpha, n_tokens=24, chunk=16):
    state = engine.prefill(ids, StopCriteria(), chunk_plan=lambda begin, n: chunk)
    engine.evict(state, alpha)
    return state, engine.decode(state, n_tokens, StopCriteria())


@pytest.mark.parametrize('model_name', ['tiny_model', 'tiny_qwen2'])
@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_fp32_matches_transformers(request, smollm2_tokenizer, model_name, alpha):
    """Same cache, same logits (to float rounding), same greedy answer, evicted or not."""
    model = request.getfixturevalue(model_name)
    lean, reference = _engines(model, smollm2_tokenizer)
    assert isinstance(lean.forward, LeanLlamaForward)
    assert isinstance(reference.forward, TransformersForward)
    ids = lean.encode(PROMPT)
    state_a, answer_a = _generate(lean, ids, alpha)
    state_b, answer_b = _generate(reference, ids, alpha)
    assert state_a.first_token == state_b.first_token
    assert answer_a.token_ids == answer_b.token_ids and len(answer_a.token_ids) == 24
    for idx in range(lean.n_layers):
        for a, b in zip(lean.layer_kv(state_a, idx), reference.layer_kv(state_b, idx)):
            assert a.shape == b.shape
            assert torch.allclose(a, b, atol=1e-5)
    with torch.inference_mode():
        position = state_a.n_x + len(answer_a.token_ids)
        last = answer_a.token_ids[-1:]
        logits_a = lean.forward.run(last, position, state_a.cache, step=True)
        logits_b = reference.forward.run(last, position, state_b.cache, step=True)
    assert torch.allclose(logits_a, logits_b, atol=1e-4)


def test_fp16_decode_weights_stay_close(tiny_model, smollm2_tokenizer):
    """16-bit copies serve the one-token steps only; the prefill stays in fp32."""
    half, = _engines(tiny_model, smollm2_tokenizer, decode_weights='float16')[:1]
    full = LlmEngine(EngineConfig(forward='lean', decode_weights='float32'),
                     EvictionConfig(window_size=8),
                     model=tiny_model, tokenizer=smollm2_tokenizer)
    layer = half.forward.layers[0]
    n_out = sum(w.shape[0] for w, _ in layer.qkv.parts)
    assert layer.qkv.step_bytes == 2 * n_out * layer.qkv.parts[0][0].shape[1]
    if fbgemm_fp16_available():
        assert layer.qkv.kernel == 'fbgemm-fp16' and layer.qkv.step_weight is None
    else:
        assert layer.qkv.kernel == 'aten-float16'
        assert layer.qkv.step_weight.dtype == torch.float16
    assert full.forward.layers[0].qkv.kernel == 'model'  # fp32: the model's own tensors
    ids = half.encode(PROMPT)
    state_h = half.prefill(ids, StopCriteria())
    state_f = full.prefill(ids, StopCriteria())
    assert torch.equal(half.layer_kv(state_h, 1)[0], full.layer_kv(state_f, 1)[0])
    with torch.inference_mode():
        logits_h = half.forward.run([state_h.first_token], state_h.n_x, state_h.cache, True)
        logits_f = full.forward.run([state_f.first_token], state_f.n_x, state_f.cache, True)
    assert not torch.equal(logits_h, logits_f)
    assert torch.allclose(logits_h, logits_f, atol=0.05, rtol=0.01)


def test_the_rotate_matrix_is_rotate_half(tiny_model):
    from timebill_ros.engine.lean_llama import _rotate_half
    forward = LeanLlamaForward(tiny_model, torch.float16)
    x = torch.randn(2, 1, 3, forward.head_dim)
    assert torch.equal(torch.matmul(x, forward.rotate), _rotate_half(x))


def test_fp16_steps_in_a_batch_match_each_goal_alone(tiny_model, smollm2_tokenizer):
    """The fast step path: B rows together give each row's logits alone (to rounding)."""
    engine = LlmEngine(EngineConfig(forward='lean', decode_weights='float16'),
                       EvictionConfig(window_size=8), model=tiny_model,
                       tokenizer=smollm2_tokenizer)
    from timebill_ros.engine.forward import PassHooks
    prompts = [PROMPT, 'Is the door open?', 'Report the battery level and the arm state.']
    states = [engine.prefill(engine.encode(p), StopCriteria()) for p in prompts]
    alone = [engine.prefill(engine.encode(p), StopCriteria()) for p in prompts]
    with torch.inference_mode():
        together, _ = engine.forward.run_step(
            [s.first_token for s in states], [s.n_x for s in states],
            [s.cache for s in states], [PassHooks() for _ in states])
        for i, state in enumerate(alone):
            logits, _ = engine.forward.run_step([state.first_token], [state.n_x],
                                                [state.cache], [PassHooks()])
            assert torch.allclose(logits[0], together[i], atol=1e-3)
            assert int(logits[0].argmax()) == int(together[i].argmax())


def test_aten_fp16_steps_where_fbgemm_is_absent(tiny_model, smollm2_tokenizer, monkeypatch):
    """ARM and CUDA builds have no FBGEMM: aten's fp16 linear, outputs close to FBGEMM's."""
    from timebill_ros.engine import lean_llama
    fast = LeanLlamaForward(tiny_model, torch.float16)
    monkeypatch.setattr(lean_llama, 'fbgemm_fp16_available', lambda: False)
    plain = LeanLlamaForward(tiny_model, torch.float16)
    assert plain.layers[0].qkv.kernel == 'aten-float16'
    x = torch.randn(3, 1, tiny_model.config.hidden_size)
    for a, b in zip(fast.layers[0].gate_up(x, True), plain.layers[0].gate_up(x, True)):
        assert a.dtype == b.dtype == torch.float32
        assert torch.allclose(a, b, atol=2e-2)


def test_auto_picks_transformers_for_other_models(smollm2_tokenizer, tiny_model):
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=128, n_positions=64)
    gpt2 = GPT2LMHeadModel(config).eval()
    assert isinstance(make_forward(gpt2, EngineConfig()), TransformersForward)
    with pytest.raises(ValueError, match="engine.forward is lean, but model_type 'gpt2'"):
        make_forward(gpt2, EngineConfig(forward='lean'))
    assert isinstance(make_forward(tiny_model, EngineConfig()), LeanLlamaForward)
    assert isinstance(make_forward(tiny_model, EngineConfig(forward='transformers')),
                      TransformersForward)


def test_forward_passes_are_counted(make_tiny_engine):
    engine = make_tiny_engine()
    ids = engine.encode(PROMPT)
    state = engine.prefill(ids, StopCriteria())
    assert engine.n_forward_passes == -(-len(ids) // 16)
    engine.decode(state, 5, StopCriteria())
    assert engine.n_forward_passes == -(-len(ids) // 16) + 4
