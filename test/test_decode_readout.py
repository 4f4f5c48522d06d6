"""The decode readout: the answer's own states at checkpoints, from decoding and for training.

Decoding pools the last layer's output of each step (PrefillState.answer_pool); teacher forcing
the same answer after the prompt must give the same pool (what the readout trains on), on every
forward that decodes: the lean Llama, transformers' and the GGUF decoder. Then the readout
trains, exports and loads as the server loads it, and the rest's bound reads it first.
"""

import json

import numpy as np
import pytest
import torch
from gguf_files import byte_level_tokenizer, T, tiny_model, write_model

from timebill_ros.config import EngineConfig, EvictionConfig, PredictorConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.forward import HiddenPool
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.predictors import make_readout
from timebill_ros.predictors.decode_readout import decode_input, DecodeReadout
from timebill_ros.predictors.prefill_readout import PrefillReadout
from timebill_ros.server.checkpoints import RestLength
from timebill_ros.training.dataset import Example
from timebill_ros.training.decode_features import (
    answer_pooled, answer_states, checkpoints_of, decode_features)
from timebill_ros.training.export import export_readout_onnx
from timebill_ros.training.heads.decode_readout import checkpoint_examples, DecodeReadoutModel
from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel
from timebill_ros.training.target import final_norm_weight

PROMPT = 'The robot reports: ' + ' '.join(f'sensor {i} nominal.' for i in range(12))
N_ANSWER = 20


@pytest.fixture(scope='module')
def gguf_engine(tmp_path_factory):
    """Return an engine on a tiny Llama GGUF file (Q8_0): the GGUF decoder's own steps."""
    path = tmp_path_factory.mktemp('decode') / 'tiny-decode-q8_0.gguf'
    write_model(path, 'llama', tiny_model('llama'), T.Q8_0, {}, tokenizer=byte_level_tokenizer)
    return LlmEngine.load(EngineConfig(model_path=str(path)), EvictionConfig())


def _engines(make_tiny_engine, gguf_engine):
    return {'lean': make_tiny_engine(), 'transformers': make_tiny_engine(forward='transformers'),
            'gguf': gguf_engine}


@pytest.mark.parametrize('forward', ['lean', 'transformers', 'gguf'])
def test_decoding_pools_what_teacher_forcing_gives(make_tiny_engine, gguf_engine, forward):
    """At each checkpoint k the pool holds k - 1 rows: those teacher forcing gives."""
    engine = _engines(make_tiny_engine, gguf_engine)[forward]
    ids = engine.encode(PROMPT)
    state = engine.prefill(ids, StopCriteria())
    state.answer_pool = HiddenPool(engine.forward.norm_eps, (engine.n_layers,))
    seen = {}

    def checkpoint(n_generated):
        seen[n_generated] = state.answer_pool.features()
        return None

    out = engine.decode(state, N_ANSWER, StopCriteria(), checkpoint=checkpoint)
    assert len(out.token_ids) == N_ANSWER and seen[1] is None  # no step has run yet
    forced = answer_states(engine, engine.prefill(ids, StopCriteria()), out.token_ids[:-1])
    assert forced.shape[0] == N_ANSWER - 1
    tolerance = 2e-3 if forward == 'gguf' else 1e-4  # block kernels step, dense GEMM forces
    for k in (2, 9, N_ANSWER - 1):
        torch.testing.assert_close(seen[k], answer_pooled(forced, k), rtol=tolerance,
                                   atol=tolerance)
    torch.testing.assert_close(state.answer_pool.features(), answer_pooled(forced, N_ANSWER),
                               rtol=tolerance, atol=tolerance)


def test_a_checkpoint_input_is_one_pool_of_one_layer_more():
    prompt = torch.arange(8.0).reshape(1, 8)  # [last_1, last_2, mean_1, mean_2], H = 2
    answer = torch.tensor([[10.0, 11.0, 12.0, 13.0]])  # [last, mean]
    assert decode_input(prompt, answer).tolist() == [[0, 1, 2, 3, 10, 11, 4, 5, 6, 7, 12, 13]]
    with pytest.raises(ValueError, match='hidden size'):
        decode_input(torch.zeros(1, 6), torch.zeros(1, 4))
    with pytest.raises(ValueError, match='n_generated'):
        answer_pooled(torch.zeros(5, 2), 7)
    # An answer trains the checkpoints it is still decoding at, with its states known.
    assert checkpoints_of(100, 99) == [17, 33, 65]
    assert checkpoints_of(1024, 40) == [17, 33]
    assert checkpoints_of(17, 16) == []


def _examples(engine, n=6):
    """Collected-looking answers: greedy decodes of varied prompts, their ids kept."""
    examples, records = [], {}
    for i in range(n):
        prompt = f'Report {i}: ' + 'status ok. ' * (3 + i)
        state = engine.prefill(engine.encode(prompt), StopCriteria())
        out = engine.decode(state, 40, StopCriteria())
        n_tokens = 20 + 3 * i  # a stand-in length: the readout learns whatever it is given
        examples.append(Example(f'p{i}', 'robot', 'train' if i < 4 else 'val', prompt,
                                n_tokens, False, state.n_x, 64))
        records[f'p{i}'] = {'answer_ids': out.token_ids}
    return examples, records


def _trained(engine, tmp_path):
    """Return (decode readout model, its ONNX path, examples) trained on the tiny engine."""
    engine.pool_layers = (1, 2)
    examples, records = _examples(engine)
    features = decode_features(engine, examples, records, tmp_path / 'features.pt',
                               log=lambda line: None)
    # Every answer is decoding at k = 17 (20..35 tokens); only p5 (35) still at k = 33.
    assert sorted(features) == sorted([f'p{i}@17' for i in range(6)] + ['p5@33'])
    again = decode_features(engine, examples, records, tmp_path / 'features.pt',
                            log=lambda line: pytest.fail(line))
    assert again.keys() == features.keys()  # cached: nothing teacher-forced again
    logs = []
    records['p1'] = {'answer_ids': list(reversed(records['p1']['answer_ids']))}
    changed = decode_features(engine, examples, records, tmp_path / 'features.pt',
                              log=logs.append)
    assert '1 answers to teacher-force' in logs[0]  # the answer collected again, only it
    assert not torch.equal(changed['p1@17'], features['p1@17'])
    assert torch.equal(changed['p0@17'], features['p0@17'])
    features = changed
    points = checkpoint_examples(examples, features)
    assert {e.prompt_id for e in points} == set(features)
    assert all(e.n_tokens == dict((x.prompt_id, x.n_tokens) for x in examples)[
        e.prompt_id.split('@')[0]] for e in points)  # the target stays the whole length
    model = DecodeReadoutModel(final_norm_weight(engine), engine.n_layers, features,
                               bucket_tokens=16, n_model=64, epochs=2, pool_layers=(1, 2),
                               log=lambda line: None)
    model.fit([e for e in points if e.split == 'train'], [e for e in points if e.split == 'val'])
    assert model.name == 'decode readout 1+2+answer B=16 ordinal median'
    path = export_readout_onnx(model, tmp_path / 'tiny__decode_readout.onnx', 'tiny')
    return model, path, examples


def _prefill_readout_file(engine, examples, path):
    """Return the path of a prefill readout (layers 1 and 2) trained on ``examples``' prompts."""
    prefill = PrefillReadoutModel(
        final_norm_weight(engine), engine.n_layers,
        {e.prompt_id: engine.prefill(engine.encode(e.prompt), StopCriteria()).pooled
         for e in examples}, bucket_tokens=16, n_model=64, epochs=1, pool_layers=(1, 2),
        log=lambda line: None)
    prefill.fit([e for e in examples if e.split == 'train'], [])
    return export_readout_onnx(prefill, path, 'tiny')


def test_the_readout_trains_exports_and_loads_as_the_server_loads_it(
        make_tiny_engine, tmp_path):
    engine = make_tiny_engine()
    model, path, _ = _trained(engine, tmp_path)
    assert json.loads(path.with_suffix('.json').read_text())['answer_pool'] == '1'
    readout = DecodeReadout.load(path)
    with pytest.raises(ValueError, match='not a prefill readout export'):
        PrefillReadout.load(path)
    # A goal decoding with the answer pool: the server's input is the training layout.
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    assert readout.rest_bounds(state.pooled, None, 1, 64, 0.9) is None
    readout.start(engine, state)
    engine.decode(state, 17, StopCriteria())
    values = readout.features(state.pooled, state.answer_pool)
    expected = decode_input(state.pooled, state.answer_pool.features())
    np.testing.assert_allclose(values, expected.numpy(), rtol=0, atol=0)
    with torch.inference_mode():
        torch_output = model.net(expected)[0].numpy()
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(readout.run(values)), -1),
                               torch.softmax(torch.from_numpy(torch_output), -1), atol=1e-4)
    point, upper = readout.rest_bounds(state.pooled, state.answer_pool, 17, 64, 0.9)
    assert 1 <= point <= upper <= 64 - 17


def test_the_held_out_rest_table_is_rebuilt_from_its_rows(make_tiny_engine, tmp_path):
    from timebill_ros.cli.predictor_decode import rest_data, rest_table
    engine = make_tiny_engine()
    model, path, examples = _trained(engine, tmp_path)
    model.n_train = 4
    held_out = [e for e in checkpoint_examples(examples, model.features) if e.split == 'val']
    data = rest_data(model, held_out, PrefillReadout.load(
        _prefill_readout_file(engine, examples, tmp_path / 'prefill.onnx')), 'tiny')
    # p4 and p5 (the val answers) are 32 and 35 tokens long.
    assert [(row['prompt_id'], row['k'], row['rest']) for row in data['rows']] == [
        ('p4@17', 17, 15), ('p5@17', 17, 18), ('p5@33', 33, 2)]
    assert all(0 <= row[source][0] <= row[source][1] <= 64 - row['k']
               for row in data['rows'] for source in ('decode', 'prefill'))
    table = rest_table(json.loads(json.dumps(data)))  # what --rest-table reads back
    assert table == rest_table(data) and '| 17 | 2 |' in table and '| 33 | 1 |' in table


def test_make_readout_attaches_the_decode_readout_of_the_same_layers(
        make_tiny_engine, tmp_path):
    engine = make_tiny_engine()
    _, decode_path, examples = _trained(engine, tmp_path)
    pooled = {e.prompt_id: engine.prefill(engine.encode(e.prompt), StopCriteria()).pooled
              for e in examples}
    logs = []

    def prefill_readout(layers, name):
        prefill = PrefillReadoutModel(final_norm_weight(engine), engine.n_layers,
                                      {k: v if layers == (1, 2) else v[:, :v.shape[1] // 2]
                                       for k, v in pooled.items()},
                                      bucket_tokens=16, n_model=64, epochs=1,
                                      pool_layers=layers, log=lambda line: None)
        prefill.fit([e for e in examples if e.split == 'train'], [])
        return export_readout_onnx(prefill, tmp_path / name, 'tiny')

    config = PredictorConfig(readout_file=str(prefill_readout((1, 2), 'same.onnx')),
                             decode_readout_file=str(decode_path), decode_readout=True)
    readout = make_readout(config, 'tiny', log=logs.append)
    assert isinstance(readout.decode, DecodeReadout) and 'decode readout loaded' in logs[-1]
    off = make_readout(PredictorConfig(readout_file=config.readout_file,
                                       decode_readout_file=str(decode_path)),
                       'tiny', log=logs.append)
    assert off.decode is None  # off by default
    missing = make_readout(PredictorConfig(readout_file=config.readout_file,
                                           decode_readout_file=str(tmp_path / 'none.onnx'),
                                           decode_readout=True),
                           'tiny', log=logs.append)
    assert missing.decode is None and 'no decode readout at' in logs[-1]
    other = make_readout(PredictorConfig(readout_file=str(prefill_readout((2,), 'other.onnx')),
                                         decode_readout_file=str(decode_path),
                                         decode_readout=True),
                         'tiny', log=logs.append)
    assert other.decode is None and 'reads prompt layers (1, 2)' in logs[-1]


def test_the_rest_reads_the_decode_readout_first():
    rest = RestLength(n_hat=20, n_w=30, n_max=40, rest_bounds=lambda n: (7, 9))
    assert rest.bounds(9) == (7, 9)
    rest.decode_bounds = lambda n: (3, 5)
    assert rest.bounds(9) == (3, 5)
    rest.decode_bounds = lambda n: None  # no answer states yet: the prefill's distribution
    assert rest.bounds(9) == (7, 9)

    def broken(n):
        raise RuntimeError('onnxruntime failed')

    rest.decode_bounds = broken
    assert rest.bounds(9) == (7, 9) and 'onnxruntime failed' in rest.decode_error
    rest.decode_bounds = lambda n: (3, 5)
    assert rest.bounds(17) == (7, 9)  # once broken, not asked again for this goal


def test_a_timebill_online_goal_reads_its_rest_from_the_decode_readout(
        make_tiny_engine, tmp_path):
    """Through the service: the goal's checkpoints read the decode readout, as it says."""
    import threading

    from timebill_ros.config import BudgetConfig, ServerConfig
    from timebill_ros.predictors import FallbackPredictor
    from timebill_ros.server import status
    from timebill_ros.server.goals import GoalRequest
    from timebill_ros.server.service import TimeBillService
    from timebill_ros.timing.model import TimingCoefficients
    engine = make_tiny_engine()
    _, decode_path, examples = _trained(engine, tmp_path)
    readout = make_readout(PredictorConfig(
        readout_file=str(_prefill_readout_file(engine, examples, tmp_path / 'prefill.onnx')),
        decode_readout_file=str(decode_path), decode_readout=True), 'tiny',
        log=lambda line: None)
    config = ServerConfig(budget=BudgetConfig(checkpoint_tokens=4))
    service = TimeBillService(config, engine, FallbackPredictor(),
                              TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3),
                              readout=readout)
    service.start()
    try:
        done, results = threading.Event(), []
        service.submit(GoalRequest(PROMPT, budget_s=100_000.0, max_new_tokens=24),
                       lambda feedback: None, lambda result: (results.append(result),
                                                              done.set()))
        assert done.wait(120)
    finally:
        service.shutdown()
    result = results[0]
    assert result.status == status.COMPLETED, result.message
    assert result.predictor == 'prefill readout + decode readout'
    assert result.checkpoint_tokens == (5, 9, 13, 17, 21)
