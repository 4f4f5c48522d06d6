"""The prefill readout: N^ read from the target model's own pooled prefill states.

Covers: the engine's pooled states (both forwards, chunked) equal the RLP's pooling of the
final-normed states; the readout head on them equals the all-layers probe (RlpNet, L = all,
T = 0) on the same prompt; training, the ONNX export and the server-side reader; the runner
using it after the prefill, and a broken readout ending in the fallback, not a failure.
"""

import threading

import numpy as np
import onnxruntime
import pytest
import torch
from rlp_helpers import planted

from timebill_ros.config import BudgetConfig, EngineConfig, PredictorConfig, ServerConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.predictors import FallbackPredictor, make_readout
from timebill_ros.predictors.prefill_readout import PrefillReadout
from timebill_ros.training.dataset import Example
from timebill_ros.training.export import export_onnx, export_readout_onnx
from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel, ReadoutNet
from timebill_ros.training.heads.rlp import RlpModel, RlpNet
from timebill_ros.training.prefill_features import prefill_features
from timebill_ros.training.target import final_norm_weight
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.service import TimeBillService
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.timing.model import TimingCoefficients

COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)
PROMPT = 'Plan a route from the dock to shelf 7, then report the battery level.'


def _unit(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize('forward', ['lean', 'transformers'])
def test_pooled_states_are_the_layers_states_pooled(make_tiny_engine, tiny_model, forward):
    engine = make_tiny_engine(forward=forward, prefill_chunk_tokens=7)
    ids = engine.encode(PROMPT)
    hidden = tiny_model.config.hidden_size
    state = engine.prefill(ids, StopCriteria())
    assert engine.pool_layers == (2,)  # the last layer by default
    assert state.n_chunks > 3 and state.pooled.shape == (1, 2 * hidden)
    with torch.inference_mode():
        out = tiny_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    normed = out.hidden_states[-1][0]  # transformers: the last entry is after the final norm
    weight = tiny_model.model.norm.weight
    expected = torch.cat([normed[-1], normed.mean(0)])
    got = state.pooled[0] * torch.cat([weight, weight])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    engine.pool_layers = (1, 2)  # layer 1's output too: [last 1, last 2, mean 1, mean 2]
    pooled = engine.prefill(ids, StopCriteria()).pooled[0].view(4, hidden)
    first = _unit(out.hidden_states[1][0])
    torch.testing.assert_close(pooled[0], first[-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pooled[2], first.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pooled[[1, 3]].flatten() * torch.cat([weight, weight]),
                               expected, rtol=1e-4, atol=1e-4)


def test_readout_head_equals_the_all_layer_probe(make_tiny_engine, tiny_model):
    engine = make_tiny_engine()
    ids = engine.encode(PROMPT)
    pooled = engine.prefill(ids, StopCriteria()).pooled
    probe = RlpNet(tiny_model, len(tiny_model.model.layers), 5, ordinal=True).eval()
    readout = ReadoutNet(tiny_model.model.norm.weight, 5, ordinal=True).eval()
    readout.head.load_state_dict(probe.head.state_dict())
    with torch.no_grad():  # a learned norm weight, as training leaves it
        probe.norm.weight.copy_(torch.linspace(0.5, 1.5, probe.norm.weight.shape[0]))
        readout.norm_weight.copy_(probe.norm.weight)
    with torch.inference_mode():
        torch.testing.assert_close(readout(pooled), probe(torch.tensor([ids])),
                                   rtol=1e-4, atol=1e-4)


@pytest.fixture(scope='module')
def splits():
    return {split: planted(n, split) for split, n in (('train', 24), ('val', 8), ('test', 10))}


@pytest.fixture(scope='module')
def trained_readout(tiny_model, smollm2_tokenizer, splits, tmp_path_factory):
    engine = LlmEngine(EngineConfig(prefill_chunk_tokens=16), PredictorEviction(),
                       model=tiny_model, tokenizer=smollm2_tokenizer)
    cache = tmp_path_factory.mktemp('features') / 'features.pt'
    examples = [e for split in splits.values() for e in split]
    lines = []
    features = prefill_features(engine, examples, cache, log=lines.append, layers=(1, 2))
    assert cache.is_file() and set(features) == {e.prompt_id for e in examples}
    assert any('ETA' in line for line in lines)
    again = prefill_features(engine, examples, cache, log=lines.append)  # all cached now
    assert all(torch.equal(again[k], features[k]) for k in features)
    model = PrefillReadoutModel(final_norm_weight(engine), engine.n_layers, features,
                                bucket_tokens=16, n_model=64, epochs=30, seed=0,
                                log=lambda s: None)
    model.head_lr = 3e-3
    model.fit(splits['train'], splits['val'])
    return engine, model


def PredictorEviction():
    from timebill_ros.config import EvictionConfig
    return EvictionConfig(window_size=8)


def test_readout_learns_a_planted_relation(trained_readout, splits):
    _, model = trained_readout
    assert model.name == 'prefill readout 1+2 B=16 ordinal median'  # default: middle, last
    assert model.pool_layers == (1, 2) and model.net.norm_weight.shape == (128,)
    truth = np.array([e.n_tokens for e in splits['test']])
    assert model.mae(splits['test']) < np.abs(truth - truth.mean()).mean()
    with pytest.raises(ValueError, match='no prefill features'):
        model.predict_tokens([Example('unseen', 'x', 'test', 'Hi', 5, False, 5, 64)])


@pytest.fixture(scope='module')
def exported_readout(trained_readout, tmp_path_factory):
    _, model = trained_readout
    return export_readout_onnx(model, tmp_path_factory.mktemp('readout') / 'r.onnx',
                               'tiny-model')


def test_readout_export_matches_torch_and_reads_eq2(trained_readout, exported_readout,
                                                    splits):
    _, model = trained_readout
    readout = PrefillReadout.load(exported_readout, provider='cpu')
    assert readout.model_key == 'tiny-model' and readout.time_s > 0
    assert readout.pool_layers == (1, 2)
    for example in splits['test']:
        pooled = model.features[example.prompt_id]
        with torch.inference_mode():
            expected = torch.softmax(model.net(pooled)[0], -1).numpy()
        got = readout.run(pooled)
        np.testing.assert_allclose(np.exp(got) / np.exp(got).sum(), expected, atol=1e-4)
        n_hat, n_upper = readout.predict_bounds(pooled, 48, 0.9)
        assert n_hat in (16, 32, 48) and n_hat <= n_upper <= 48
        assert n_hat == min(48, model.output_tokens(torch.from_numpy(got)))
        assert readout.predict_bounds(pooled, 48)[1] is None
    with pytest.raises(ValueError, match='pooled states must have'):
        readout.run(np.zeros(3))


def test_readout_refuses_an_rlp_file_and_make_readout_logs_why(trained_readout, tmp_path,
                                                               tiny_model, smollm2_tokenizer):
    rlp = RlpModel(tiny_model, smollm2_tokenizer.encode, bucket_tokens=16, n_model=64,
                   n_layers=1, max_input_tokens=32, epochs=1, log=lambda s: None)
    path = export_onnx(rlp, tmp_path / 'rlp.onnx', 'tiny-model', embedding='float32')
    with pytest.raises(ValueError, match='not a prefill readout'):
        PrefillReadout(onnxruntime.InferenceSession(str(path),
                                                    providers=['CPUExecutionProvider']))
    lines = []
    config = PredictorConfig(readout_file=str(tmp_path / 'missing.onnx'))
    assert make_readout(config, 'tiny-model', log=lines.append) is None
    assert 'prefill readout unavailable' in lines[0] and 'missing.onnx' in lines[0]
    off = PredictorConfig(prefill_readout=False, readout_file=str(path))
    assert make_readout(off, 'tiny-model') is None
    with pytest.raises(TypeError, match='prefill_readout'):
        PredictorConfig(prefill_readout='yes')


def test_make_readout_refuses_layers_the_model_lacks(exported_readout):
    lines = []
    config = PredictorConfig(readout_file=str(exported_readout))
    assert make_readout(config, 'tiny-model', log=lines.append, n_layers=2) is not None
    assert make_readout(config, 'tiny-model', log=lines.append, n_layers=1) is None
    assert 'reads layers (1, 2), the model has 1' in lines[-1]


class BrokenReadout:
    name = 'broken readout'
    time_s = 0.001
    pool_layers = (2,)

    def run(self, pooled):
        raise RuntimeError('readout exploded')

    def predict_bounds(self, pooled, n_max, q=0.0):
        return self.run(pooled)


def _serve(tiny_model, smollm2_tokenizer, readout, prompt):
    engine_cfg = EngineConfig(max_new_tokens=48, prefill_chunk_tokens=64)
    config = ServerConfig(engine=engine_cfg, budget=BudgetConfig(upper_quantile=0.9))
    engine = LlmEngine(engine_cfg, config.eviction, model=tiny_model, tokenizer=smollm2_tokenizer)
    service = TimeBillService(config, engine, FallbackPredictor(), COEFFS, readout=readout)
    service.start()
    try:
        done, finished = [], threading.Event()
        service.submit(GoalRequest(prompt, budget_s=1e5), lambda fb: None,
                       lambda r: (done.append(r), finished.set()))
        assert finished.wait(60)
    finally:
        service.shutdown()
    return done[0]


def test_service_reads_n_hat_from_the_prefill(exported_readout, tiny_model, smollm2_tokenizer):
    readout = PrefillReadout.load(exported_readout, provider='cpu')
    prompt = 'Is the dock free? Answer yes or no.'
    engine = LlmEngine(EngineConfig(prefill_chunk_tokens=64), PredictorEviction(),
                       model=tiny_model, tokenizer=smollm2_tokenizer)
    engine.pool_layers = readout.pool_layers
    pooled = engine.prefill(engine.encode(prompt), StopCriteria()).pooled
    n_hat, n_upper = readout.predict_bounds(pooled, 48, 0.9)
    result = _serve(tiny_model, smollm2_tokenizer, readout, prompt)  # sets the engine's layers
    assert result.status == status.COMPLETED, result.message
    assert result.predictor == 'prefill readout' and result.predict_time_s > 0
    assert result.predicted_tokens == n_hat and result.pessimistic_tokens == n_upper


def test_a_broken_readout_falls_back_and_the_goal_completes(tiny_model, smollm2_tokenizer):
    result = _serve(tiny_model, smollm2_tokenizer, BrokenReadout(), 'Hi.')
    assert result.status == status.COMPLETED, result.message
    assert 'readout exploded' in result.predictor and result.predictor.startswith('fallback')
    assert result.predicted_tokens == 48


class SlowPredictor(FallbackPredictor):
    def expected_time_s(self, n_x):
        return 1.0


def test_with_a_readout_no_predictor_time_is_budgeted(tiny_model, smollm2_tokenizer):
    config = ServerConfig(engine=EngineConfig(max_new_tokens=8))
    engine = LlmEngine(config.engine, config.eviction, model=tiny_model,
                       tokenizer=smollm2_tokenizer)
    plain = TimeBillService(config, engine, SlowPredictor(), COEFFS)
    read = TimeBillService(config, engine, SlowPredictor(), COEFFS, readout=BrokenReadout())
    assert plain.time_model.predict_s(100) == pytest.approx(1.0)
    assert read.time_model.predict_s(100) == 0.0
    assert read.runner.readout is read.readout and plain.runner.readout is None
