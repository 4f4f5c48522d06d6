"""engine.decode_weights: the start-up choice (auto) and the int8 weight-only step format."""

import pytest
import torch

from timebill_ros.config import EngineConfig, EvictionConfig, ServerConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.step_format import choose_step_format, MIN_GAIN, PROBE_ROUNDS
from timebill_ros.server.backends.local import resolved_engine
from timebill_ros.engine.stopping import StopCriteria

PROMPT = 'List the steps to pick up the red cup from the table and put it in the sink.'


def _choose(step_s):
    """Run the chooser on stand-in forwards whose step takes step_s[format] seconds."""
    calls = []

    def measure(forward):
        calls.append(forward)
        return step_s[forward]

    return choose_step_format(lambda name: name, measure, tuple(step_s)), calls


@pytest.mark.parametrize('fp16_s, expected', [
    (0.020, 'float16'),                          # clearly faster: the copy pays
    (0.030 * (1 - MIN_GAIN) + 1e-4, 'float32'),  # faster, but by less than MIN_GAIN
    (0.030, 'float32'),                          # a tie: the exact format
    (0.040, 'float32'),                          # slower
])
def test_the_exact_format_wins_unless_fp16_is_clearly_faster(fp16_s, expected):
    (chosen, forward, step_s), calls = _choose({'float32': 0.030, 'float16': fp16_s})
    assert chosen == expected and forward == expected
    assert step_s == {'float32': 0.030, 'float16': fp16_s}
    # Rounds alternate between the formats, so a drift of the machine hits both.
    assert calls == ['float32', 'float16'] * PROBE_ROUNDS


@pytest.mark.parametrize('step_ms, expected', [
    ((30, 20, 10), 'gguf'),      # the fastest, and exact
    ((30, 20, 25), 'float16'),   # fp16 clearly faster than the fastest exact format
    ((30, 24, 25), 'gguf'),      # fp16 faster, but by less than MIN_GAIN
    ((12, 20, 25), 'float32'),   # the machine's fp32 GEMM beats the kernels
])
def test_gguf_competes_as_an_exact_format(step_ms, expected):
    step_s = dict(zip(('float32', 'float16', 'gguf'), (ms / 1e3 for ms in step_ms)))
    (chosen, _, _), calls = _choose(step_s)
    assert chosen == expected
    assert calls == ['float32', 'float16', 'gguf'] * PROBE_ROUNDS


def test_the_candidates_must_be_faithful_with_an_exact_one():
    for formats in (('float16',), ('float32', 'int8')):
        with pytest.raises(ValueError, match='faithful'):
            choose_step_format(lambda name: name, lambda forward: 0.01, formats)


def test_auto_resolves_to_a_faithful_format_and_configs_key_on_it(
        tiny_model, smollm2_tokenizer):
    engine = LlmEngine(EngineConfig(decode_weights='auto'), EvictionConfig(window_size=8),
                       model=tiny_model, tokenizer=smollm2_tokenizer)
    chosen = engine.engine_config.decode_weights
    assert chosen in ('float32', 'float16')
    assert set(engine.step_format_probe) == {'float32', 'float16'}
    assert all(s > 0 for s in engine.step_format_probe.values())
    # gguf's blocks are the embedded model's weights, not those of a model a caller built.
    assert engine.gguf_skipped == 'the model was given by the caller'
    assert engine.n_forward_passes == 0  # the probe's passes are not the server's
    lines = []
    config = resolved_engine(ServerConfig(), engine, log=lines.append)
    assert config.engine.decode_weights == chosen
    assert lines and f'auto: {chosen}' in lines[0]
    assert 'did not try gguf: the model was given by the caller' in lines[1]


def test_auto_on_the_transformers_forward_probes_nothing(tiny_model, smollm2_tokenizer):
    engine = LlmEngine(EngineConfig(forward='transformers', decode_weights='auto'),
                       EvictionConfig(window_size=8), model=tiny_model,
                       tokenizer=smollm2_tokenizer)
    assert engine.step_format_probe == {}
    assert engine.engine_config.decode_weights == 'auto'


def test_int8_weights_are_quantized_per_row_and_stay_close(tiny_model, smollm2_tokenizer):
    """int8 steps: weight bytes quartered, logits near fp32's, the prefill untouched."""
    engines = {name: LlmEngine(EngineConfig(forward='lean', decode_weights=name),
                               EvictionConfig(window_size=8), model=tiny_model,
                               tokenizer=smollm2_tokenizer) for name in ('int8', 'float32')}
    qkv = engines['int8'].forward.layers[0].qkv
    weight = torch.cat([w for w, _ in qkv.parts])
    assert qkv.kernel == 'int8-bf16' and qkv.int8_weight.dtype == torch.int8
    assert qkv.step_bytes == weight.numel() + 2 * weight.shape[0]
    dequantized = qkv.int8_weight.float() * qkv.int8_scale.float()[:, None]
    assert torch.allclose(dequantized, weight, atol=float(weight.abs().max()) / 100)
    ids = engines['int8'].encode(PROMPT)
    states = {name: e.prefill(ids, StopCriteria()) for name, e in engines.items()}
    assert torch.equal(engines['int8'].layer_kv(states['int8'], 1)[0],
                       engines['float32'].layer_kv(states['float32'], 1)[0])
    with torch.inference_mode():
        logits = {name: e.forward.run([states[name].first_token], states[name].n_x,
                                      states[name].cache, True)
                  for name, e in engines.items()}
    assert not torch.equal(logits['int8'], logits['float32'])
    assert torch.allclose(logits['int8'], logits['float32'], atol=0.1, rtol=0.05)


def test_an_unknown_decode_format_is_refused():
    with pytest.raises(ValueError, match="engine.decode_weights.*'int4'"):
        EngineConfig(decode_weights='int4')
