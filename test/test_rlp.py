"""The RLP pipeline on a tiny random Llama: corpus, collect, dataset, train, ONNX, predictor."""

import dataclasses
import json
import threading
import time

import numpy as np
import onnxruntime
import pytest
import torch
from rlp_helpers import planted

from timebill_ros.config import (EngineConfig, EvictionConfig, PredictorConfig,
                                 PrefixCacheConfig)
from timebill_ros.engine import LlmEngine, stopping
from timebill_ros.predictors import FallbackPredictor, make_predictor
from timebill_ros.predictors.onnx_rlp import (OnnxRlpPredictor, PredictorTiming,
                                              trained_input_tokens)
from timebill_ros.training import collect as collect_mod
from timebill_ros.predictors.compress import compress_ids
from timebill_ros.training.corpus import SPLITS, build_corpus, split_of
from timebill_ros.training.dataset import Example, load_examples
from timebill_ros.predictors.contract import read_metadata
from timebill_ros.training.export import compare_with_torch, export_onnx
from timebill_ros.training.metrics import length_metrics
from timebill_ros.training.heads.base import bucket_length, bucket_of
from timebill_ros.training.heads.rlp import (ordinal_log_probs, ordinal_threshold_logits,
                                             RlpModel)


def test_corpus_is_deterministic_split_and_diverse():
    first, second = build_corpus(), build_corpus()
    assert first == second
    assert len({it.prompt_id for it in first}) == len(first)
    assert len({it.prompt for it in first}) == len(first)
    by_split = {s: [it for it in first if it.split == s] for s in SPLITS}
    assert len(by_split['train']) > len(by_split['val']) > 0 and len(by_split['test']) > 50
    categories = {it.category for it in first}
    for needed in ('plan', 'navigate', 'manipulate', 'yes_no', 'log_qa', 'map_qa', 'summary',
                   'chat', 'u_structural', 'u_syntactic', 'u_semantic', 'u_vague',
                   'u_open_ended', 'u_multi_part'):
        assert needed in categories
    assert 7000 < max(len(it.prompt) for it in first) <= 8000  # a few thousand tokens
    assert all(it.split == split_of(it.prompt_id) for it in first)


def test_split_depends_on_seed_and_id_only():
    assert split_of('plan-0001') == split_of('plan-0001')
    shares = [split_of(f'x-{i}') for i in range(3000)]
    assert 0.65 < shares.count('train') / 3000 < 0.75
    assert any(split_of(f'x-{i}', seed=1) != split_of(f'x-{i}') for i in range(50))


def test_compress_keeps_head_and_tail():
    ids = list(range(100))
    assert compress_ids(ids, 200) == ids
    out = compress_ids(ids, 10)
    assert out == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    with pytest.raises(ValueError, match='max_tokens'):
        compress_ids(ids, 1)


def test_metrics_and_buckets():
    m = length_metrics([10, 20, 30], [10, 20, 30])
    assert m['mae'] == 0 and m['r2'] == 1 and m['within'] == 1
    m = length_metrics([10, 20, 30], [20, 20, 20])
    assert m['mae'] == pytest.approx(20 / 3) and m['r2'] == pytest.approx(0.0)
    with pytest.raises(ValueError, match='shapes'):
        length_metrics([1, 2], [1])
    assert bucket_of(1, 16) == 0 and bucket_of(16, 16) == 0 and bucket_of(17, 16) == 1
    assert bucket_length(0, 16) == 16 and bucket_length(3, 64) == 256


def test_response_length_counts_up_to_eos():
    assert collect_mod.response_length([5, 6, 2, 7], {2}, 10) == (3, False)
    assert collect_mod.response_length([5, 6, 7], {2}, 3) == (3, True)


def test_collect_is_resumable_and_detects_changed_prompts(make_tiny_engine, tmp_path):
    engine = make_tiny_engine()
    items = build_corpus()[:5]
    out = tmp_path / 'lengths.jsonl'
    logs = []
    assert collect_mod.collect(engine, items[:3], out, n_model=6, max_batch=2,
                               log=logs.append) == 3
    assert collect_mod.collect(engine, items, out, n_model=6, log=logs.append) == 2
    assert collect_mod.collect(engine, items, out, n_model=6, log=logs.append) == 0
    records = collect_mod.load_records(out)
    assert sorted(records) == sorted(it.prompt_id for it in items)
    assert all(1 <= r['n_tokens'] <= 6 and r['n_model'] == 6 for r in records.values())
    assert all(len(r['answer_ids']) in (r['n_tokens'], r['n_tokens'] - 1)
               for r in records.values())
    assert any('ETA' in line for line in logs)
    with pytest.raises(ValueError, match='n_model'):
        collect_mod.collect(engine, items, out, n_model=8, log=logs.append)
    changed = [items[0].__class__(items[0].prompt_id, items[0].category, items[0].split,
                                  'a different text')]
    with pytest.raises(ValueError, match='changed'):
        collect_mod.collect(engine, changed, out, n_model=6, log=logs.append)


def test_batched_lengths_match_one_at_a_time_on_tiny_model(make_tiny_engine):
    """Continuous batching (answers leave and join between steps) changes no length."""
    engine = make_tiny_engine()
    items = build_corpus()[:5]
    encoded = {it.prompt_id: engine.encode(it.prompt) for it in items}

    def lengths(max_batch):
        return {item.prompt_id: (n, capped, tuple(ids)) for item, n, capped, _, ids in
                collect_mod.decode_lengths(engine, items, encoded, 7, max_batch)}

    alone = lengths(1)
    assert len(alone) == 5 and lengths(3) == alone
    assert all(1 <= n <= 7 and capped == (n == 7) for n, capped, _ in alone.values())
    # the answer's ids: n - 1 of them before an EOS, all 7 steps' when capped
    assert all(len(ids) == (7 if capped else n - 1) for n, capped, ids in alone.values())


def test_guarded_collection_counts_the_steps_until_the_loop_guard_fired(
        slow_model, smollm2_tokenizer, tmp_path):
    """A looping answer ends where the server's guard ends it, not at N_model."""
    engine = LlmEngine(EngineConfig(decode_weights='float32'), EvictionConfig(),
                       model=slow_model, tokenizer=smollm2_tokenizer,
                       prefix_cache=PrefixCacheConfig(enabled=False))
    items, out, guard = build_corpus()[:3], tmp_path / 'guarded.jsonl', (32, 3, 24)
    assert collect_mod.collect(engine, items, out, n_model=300, max_batch=2,
                               loop_guard=guard, log=lambda s: None) == 3
    records = collect_mod.load_records(out).values()
    # the slow model's greedy answers settle into a cycle without EOS (conftest)
    assert {r['finish'] for r in records} == {'repetition'}
    assert all(24 <= r['n_tokens'] < 300 and not r['capped'] for r in records)
    assert all(r['loop_guard'] == list(guard) for r in records)
    # the steps the server runs: decoding one answer alone stops at the same step
    one = items[0]
    state = engine.prefill(engine.encode(one.prompt), stopping.StopCriteria())
    alone = stopping.LoopGuard(*guard)
    engine.decode(state, 300, stopping.StopCriteria([alone]))
    assert len(alone.tokens) == collect_mod.load_records(out)[one.prompt_id]['n_tokens']
    with pytest.raises(ValueError, match='loop_guard'):
        collect_mod.collect(engine, items, out, n_model=300, log=lambda s: None)
    free = tmp_path / 'free.jsonl'
    collect_mod.collect(engine, items[:1], free, n_model=300, log=lambda s: None)
    assert collect_mod.load_records(free)[one.prompt_id]['capped']


def test_load_examples_joins_corpus_and_lengths(tmp_path):
    items = build_corpus()[:4]
    path = tmp_path / 'l.jsonl'
    path.write_text(''.join(json.dumps({
        'prompt_id': it.prompt_id, 'category': it.category, 'split': it.split,
        'n_prompt_tokens': 10, 'n_tokens': 7 + i, 'capped': False, 'n_model': 256,
        'prompt_sha': collect_mod.prompt_sha(it.prompt)}) + '\n' for i, it in enumerate(items)))
    splits = load_examples(path)
    got = sorted((e for s in splits.values() for e in s), key=lambda e: e.prompt_id)
    assert [e.n_tokens for e in sorted(got, key=lambda e: e.n_tokens)] == [7, 8, 9, 10]
    with pytest.raises(FileNotFoundError, match='predictor collect'):
        load_examples(tmp_path / 'missing.jsonl')


@pytest.fixture(scope='module')
def trained_rlp(tiny_model, smollm2_tokenizer):
    def encode(prompt):
        text = smollm2_tokenizer.apply_chat_template(
            [{'role': 'user', 'content': prompt}], add_generation_prompt=True, tokenize=False)
        return smollm2_tokenizer(text, add_special_tokens=False)['input_ids']
    model = RlpModel(tiny_model, encode, bucket_tokens=16, n_model=64, n_layers=2,
                     n_trainable_layers=1, max_input_tokens=64, epochs=8, lr=3e-3,
                     head_lr=3e-3, accumulate=2, seed=0, log=lambda s: None)
    model.fit(planted(24, 'train'), planted(8, 'val'))
    return model


def test_rlp_learns_a_planted_relation(trained_rlp):
    test = planted(10, 'test')
    pred = trained_rlp.predict_tokens(test)
    truth = np.array([e.n_tokens for e in test])
    assert length_metrics(truth, pred)['mae'] < np.abs(truth - truth.mean()).mean()
    assert set(pred) <= {16.0, 32.0, 48.0, 64.0}


def test_ordinal_head_gives_a_distribution_and_learns(tiny_model, smollm2_tokenizer, tmp_path):
    raw = torch.tensor([[2.0, -1.0, 0.5, 3.0]])  # base logit + 3 edge gaps -> 4 buckets
    log_p = ordinal_log_probs(raw)
    assert log_p.shape == (1, 4) and torch.exp(log_p).sum().item() == pytest.approx(1.0)
    z = ordinal_threshold_logits(raw)
    assert torch.all(z[:, 1:] < z[:, :-1])  # P(n > edge_j) falls with j
    assert torch.sigmoid(z[0, 0]).item() == pytest.approx(1 - torch.exp(log_p[0, 0]).item())

    def encode(prompt):
        return smollm2_tokenizer(prompt, add_special_tokens=False)['input_ids']
    model = RlpModel(tiny_model, encode, bucket_tokens=16, n_model=64, n_layers=2,
                     n_trainable_layers=1, max_input_tokens=64, epochs=8, lr=3e-3,
                     head_lr=3e-3, accumulate=2, seed=0, log=lambda s: None, head='ordinal')
    assert model.name == 'RLP L=2 B=16 ordinal median'
    model.fit(planted(24, 'train'), planted(8, 'val'))
    test = planted(10, 'test')
    truth = np.array([e.n_tokens for e in test])
    assert length_metrics(truth, model.predict_tokens(test))['mae'] < \
        np.abs(truth - truth.mean()).mean()
    path = export_onnx(model, tmp_path / 'ordinal.onnx', 'tiny-model', embedding='float32')
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    ids = [model.input_ids(e.prompt) for e in test]
    assert compare_with_torch(model, session, ids)[0] < 1e-4
    assert read_metadata(session)['head'] == 'ordinal'
    with pytest.raises(ValueError, match='head'):
        RlpModel(tiny_model, encode, bucket_tokens=None, head='ordinal')
    with pytest.raises(ValueError, match='head'):
        RlpModel(tiny_model, encode, head='poisson')


def test_rlp_copies_and_freezes_target_layers(trained_rlp, tiny_model):
    net = trained_rlp.net
    assert torch.equal(net.embed_tokens.weight, tiny_model.model.embed_tokens.weight)
    assert torch.equal(net.layers[0].mlp.up_proj.weight,
                       tiny_model.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(net.layers[1].mlp.up_proj.weight,
                           tiny_model.model.layers[1].mlp.up_proj.weight)
    with pytest.raises(ValueError, match='n_trainable_layers'):
        RlpModel(tiny_model, str.split, n_layers=2, n_trainable_layers=3)
    with pytest.raises(ValueError, match='n_trainable_layers'):
        RlpModel(tiny_model, str.split, n_layers=2, n_trainable_layers=-1)
    probe = RlpModel(tiny_model, str.split, n_layers=2, n_trainable_layers=0)  # norm + head
    assert probe.name == 'RLP L=2 T=0 B=16 median'
    assert not any(p.requires_grad for layer in probe.net.layers for p in layer.parameters())
    with pytest.raises(ValueError, match='bucket_tokens'):
        RlpModel(tiny_model, str.split, bucket_tokens=0)


@pytest.fixture(scope='module')
def exported(trained_rlp, tmp_path_factory):
    path = tmp_path_factory.mktemp('rlp') / 'tiny__rlp.onnx'
    export_onnx(trained_rlp, path, 'tiny-model', embedding='float32')
    return path


def test_onnx_export_matches_torch(trained_rlp, exported):
    session = onnxruntime.InferenceSession(str(exported), providers=['CPUExecutionProvider'])
    ids = [trained_rlp.input_ids(e.prompt) for e in planted(4, 'test')]
    ids += [[1], list(range(3, 300))]
    assert compare_with_torch(trained_rlp, session, ids)[0] < 1e-5  # bucket probabilities
    meta = read_metadata(session)
    assert meta['kind'] == 'classification' and meta['bucket_tokens'] == '16'
    assert meta['model_key'] == 'tiny-model' and meta['n_model'] == '64'
    assert meta['embedding'] == 'float32'


def test_int8_embedding_export_is_smaller_and_close(trained_rlp, exported, tmp_path):
    path = export_onnx(trained_rlp, tmp_path / 'tiny__rlp.onnx', 'tiny-model')  # int8 default
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    meta = read_metadata(session)
    assert meta['embedding'] == 'int8' and meta['model_key'] == 'tiny-model'
    # The tiny model's 49152 x 64 fp32 table (12.6 MB) is most of the file; int8 is a quarter.
    assert path.stat().st_size < 0.5 * exported.stat().st_size
    ids = [trained_rlp.input_ids(e.prompt) for e in planted(8, 'test')]
    diff, same = compare_with_torch(trained_rlp, session, ids)
    assert 1e-6 < diff < 0.1  # quantized (not bit-identical), and close
    assert same >= 7
    with pytest.raises(ValueError, match='embedding'):
        export_onnx(trained_rlp, tmp_path / 'x.onnx', 'tiny-model', embedding='int4')


def test_onnx_predictor_applies_eq2_and_compression(exported):
    predictor = OnnxRlpPredictor.load(exported, threads=1, provider='cpu',
                                      prefill_s=lambda n_x: 1e-3 * n_x,
                                      timing=PredictorTiming(0.0, 1e-3, 0.0),
                                      min_input_tokens=8, max_input_tokens=100)
    assert predictor.to_tokens(np.array([0.0, 5.0, 0.0, 0.0]), 128) == 32
    assert predictor.to_tokens(np.array([0.0, 5.0, 0.0, 0.0]), 20) == 20
    assert predictor.to_tokens(np.array([0.0, 0.0, 0.0, 9.0]), 500) == 500  # censored top
    assert predictor.input_cap(50) == 50 and predictor.input_cap(4) == 8
    assert predictor.input_cap(5000) == 64  # the file's training N_p, under the 100 asked
    n_hat = predictor.predict('p', list(range(10, 400)), 128)
    assert predictor.last_input_tokens == 64 and 16 <= n_hat <= 128
    # Bucket probabilities 0.1 / 0.5 / 0.3 / 0.1: median bucket 1, 0.9-quantile bucket 2.
    logits = np.log(np.array([0.1, 0.5, 0.3, 0.1]))
    assert predictor.to_tokens(logits, 128) == 32
    assert predictor.to_tokens(logits, 128, q=0.9) == 48
    assert predictor.to_tokens(logits, 128, q=0.95) == 128  # top bucket: ">= N_model"
    n_hat, n_upper = predictor.predict_bounds('p', list(range(10, 400)), 128, 0.9)
    assert n_hat == predictor.predict('p', list(range(10, 400)), 128) <= n_upper <= 128


def test_the_rlp_reads_no_longer_inputs_than_it_was_trained_on(exported):
    """The fixture was trained at N_p = 64: a config's 2048 is lowered to it, min too."""
    predictor = OnnxRlpPredictor.load(exported, provider='cpu', timing=PredictorTiming(0, 0, 0),
                                      min_input_tokens=100, max_input_tokens=2048)
    assert predictor.trained_input_tokens == 64
    assert (predictor.min_input_tokens, predictor.max_input_tokens) == (64, 64)
    predictor.predict('p', list(range(10, 4000)), 128)
    assert predictor.last_input_tokens == 64
    assert trained_input_tokens({}) == 0 and trained_input_tokens({'max_input_tokens': '7'}) == 7
    for bad in ('x', '-3'):
        with pytest.raises(ValueError, match=f"max_input_tokens.*'{bad}'"):
            trained_input_tokens({'max_input_tokens': bad})


def test_predictor_timing_solves_the_cap():
    timing = PredictorTiming(1e-6, 1e-4, 0.01)
    n_p = timing.max_tokens_within(0.5)
    assert timing.predict_s(n_p) <= 0.5 < timing.predict_s(n_p + 1)
    assert timing.max_tokens_within(0.001) == 0


def test_fit_timing_measures_the_session(exported):
    predictor = OnnxRlpPredictor.load(exported, provider='cpu', max_input_tokens=256)
    assert predictor.timing.predict_s(256) >= predictor.timing.predict_s(16) > 0


def test_make_predictor_falls_back_with_reason(tmp_path, exported):
    logs = []
    missing = make_predictor(PredictorConfig(model_file=str(tmp_path / 'none.onnx')),
                             'tiny-model', log=logs.append)
    assert isinstance(missing, FallbackPredictor)
    assert missing.name.startswith('fallback (rlp unavailable: FileNotFoundError')
    other = make_predictor(PredictorConfig(model_file=str(exported), max_input_tokens=64),
                           'another-model', log=logs.append)
    assert isinstance(other, FallbackPredictor) and 'another-model' in other.name
    good = make_predictor(PredictorConfig(model_file=str(exported), max_input_tokens=64),
                          'tiny-model', prefill_s=lambda n: 0.1, log=logs.append)
    assert isinstance(good, OnnxRlpPredictor) and good.name == 'rlp'
    assert FallbackPredictor().name == 'fallback'


@pytest.mark.parametrize('upper_quantile', [0.0, 0.9])
def test_service_runs_the_rlp_alongside_prefill(exported, tiny_model, smollm2_tokenizer,
                                                upper_quantile):
    from timebill_ros.server import status
    from timebill_ros.config import BudgetConfig, EngineConfig, ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.server.goals import GoalRequest
    from timebill_ros.server.service import TimeBillService
    from timebill_ros.timing.model import TimingCoefficients
    coeffs = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)
    engine_cfg = EngineConfig(max_new_tokens=48, prefill_chunk_tokens=64)
    config = ServerConfig(engine=engine_cfg, budget=BudgetConfig(upper_quantile=upper_quantile))
    engine = LlmEngine(engine_cfg, config.eviction, model=tiny_model, tokenizer=smollm2_tokenizer)
    predictor = OnnxRlpPredictor.load(exported, provider='cpu', prefill_s=coeffs.prefill_s,
                                      timing=PredictorTiming(0.0, 1e-5, 1e-3),
                                      min_input_tokens=16, max_input_tokens=64)
    prompt = 'Is the dock free? Answer yes or no.'
    n_hat, n_upper = predictor.predict_bounds(prompt, engine.encode(prompt), 48, 0.9)
    service = TimeBillService(config, engine, predictor, coeffs)
    service.start()
    try:
        done = []
        finished = threading.Event()
        service.submit(GoalRequest(prompt, budget_s=1e5),
                       lambda fb: None, lambda r: (done.append(r), finished.set()))
        assert finished.wait(60)
    finally:
        service.shutdown()
    result = done[0]
    assert result.status == status.COMPLETED, result.message
    assert result.predictor == 'rlp' and result.predict_time_s > 0
    assert result.predicted_tokens == n_hat in (16, 32, 48)  # Eq. 2, B = 16, capped by N_max
    assert 0 < predictor.last_input_tokens <= 64
    # N^_W: TimeBill's min(k N^, N_max), or the q-quantile of the RLP's distribution.
    expected_n_w = n_upper if upper_quantile else min(48, 5 * n_hat)
    assert result.pessimistic_tokens == expected_n_w


def test_verify_reruns_through_the_server_path(make_tiny_engine, tmp_path):
    engine = make_tiny_engine()
    items = build_corpus()[:3]
    out = tmp_path / 'lengths.jsonl'
    collect_mod.collect(engine, items, out, n_model=5, log=lambda s: None)
    rows = collect_mod.verify(engine, items, out, 3, log=lambda s: None)
    assert [r[0] for r in rows] == [it.prompt_id for it in items]
    assert all(batched == single for _, batched, single in rows)


def test_report_and_overlap_tables_format_every_row():
    from timebill_ros.training.overlap import format_overlap
    from timebill_ros.training.report import format_table
    ex = Example('t-1', 'x', 'test', 'p', 10, False, 5, 128)
    rows = [{'predictor': 'RLP', 'mae': 1.0, 'rmse': 2.0, 'r2': 0.5, 'within': 0.9,
             'val_mae': 3.0, 'fit_s': 4.0, 'predict_ms': 5.0}]
    table = format_table(rows, {'train': [ex], 'val': [ex], 'test': [ex]})
    assert '| RLP | 1.0 | 2.0 | 0.500 | 90 % | 3.0 | - | 4 | 5.0 |' in table
    rows[0].update(cover_upper=0.85, upper_over_true=1.5)
    splits = {'train': [ex], 'val': [ex], 'test': [ex]}
    assert '| 3.0 | 85 % (1.5x) | 4 |' in format_table(rows, splits)
    over = format_overlap([{'n_x': 10, 'n_p': 10, 'prefill_alone_s': 0.1, 'prefill_s': 0.2,
                            'predict_s': 0.05, 'overhang_s': 0.0, 'hidden_runs': 3,
                            'repeats': 3}])
    assert '| 10 | 10 | 0.100 | 0.200 | 0.050 | 0.000 | 3/3 |' in over


def test_readouts_of_a_bucket_distribution():
    from timebill_ros.predictors.length_distribution import (bucket_cdf, quantile_bucket,
                                                             read_bucket)
    # Most mass on bucket 0 (the mode), but 60 % beyond it: the median is further out.
    logits = np.log([0.4, 0.05, 0.05, 0.3, 0.2])
    assert np.allclose(bucket_cdf(logits), [0.4, 0.45, 0.5, 0.8, 1.0])
    assert read_bucket(logits, 'argmax') == 0
    assert read_bucket(logits, 'median') == 2
    assert quantile_bucket(logits, 0.9) == 4 and quantile_bucket(logits, 0.8) == 3
    with pytest.raises(ValueError, match="q must be in"):
        quantile_bucket(logits, 0.0)
    with pytest.raises(ValueError, match="readout must be one of"):
        read_bucket(logits, 'mean')


def test_constant_mean_baseline_and_report_rows(tiny_model, smollm2_tokenizer):
    from timebill_ros.training.heads.constant_mean import ConstantMean
    from timebill_ros.training.report import evaluate_models
    train, test = planted(24, 'train'), planted(8, 'test')
    splits = {'train': train, 'val': planted(8, 'val'), 'test': test}
    baseline = ConstantMean()
    with pytest.raises(RuntimeError, match='fit'):
        baseline.predict_tokens(test)
    baseline.fit(train)
    assert np.allclose(baseline.predict_tokens(test), (5 + 60) / 2)
    rlp = RlpModel(tiny_model, smollm2_tokenizer.encode, bucket_tokens=16, n_model=64,
                   n_layers=2, max_input_tokens=64, epochs=1, log=lambda s: None)
    rows = evaluate_models([baseline, rlp], splits, log=lambda s: None)
    names = [r['predictor'] for r in rows]
    # The RLP is read both ways from one training, and only it has an upper quantile.
    assert names == ['constant mean', 'RLP L=2 B=16 median', 'RLP L=2 B=16 argmax']
    assert 'cover_upper' not in rows[0]
    assert all(0.0 <= r['cover_upper'] <= 1.0 for r in rows[1:])
    assert rlp.readout == 'median' and rlp.name == 'RLP L=2 B=16 median'


def test_wcet_coverage_table_and_plot_without_baselines(tmp_path):
    from timebill_ros.training.metrics import wcet_coverage
    from timebill_ros.training.report import format_wcet_table, save_report
    assert wcet_coverage([10, 300, 40], [20, 100, 50], 256) == {
        'cover': pytest.approx(2 / 3), 'mean_fraction': pytest.approx(170 / 3 / 256)}
    assert wcet_coverage([1000], [2000], 256)['cover'] == 1.0  # both capped at N_max
    with pytest.raises(ValueError, match='n_max'):
        wcet_coverage([1], [1], 0)
    test = [Example(f't-{i}', 'x', 'test', 'p', n, n >= 1024, 5, 1024)
            for i, n in enumerate((20, 200, 1024))]
    rows = [{'predictor': 'RLP L=4 B=64 median', 'mae': 1.0, 'rmse': 2.0, 'r2': 0.5,
             'within': 0.9, 'val_mae': 3.0, 'fit_s': 4.0, 'predict_ms': 5.0,
             'predicted': [64.0, 64.0, 1024.0], 'upper': [128.0, 256.0, 1024.0],
             'cover_upper': 1.0, 'upper_over_true': 2.0}]
    splits = {'train': test, 'val': test, 'test': test}
    table = format_wcet_table(rows, splits)
    # k = 2: N^_W = 128, 128, 2048 -> capped at N_max; 20 and the capped answer are covered.
    assert '| RLP L=4 B=64 median | k = 2 | 67 % (0.67) | 67 % (0.42) |' in table
    assert '| RLP L=4 B=64 median | q = 0.9 quantile | 100 % (0.83) | 100 % (0.46) |' in table
    md = save_report(rows, splits, tmp_path)  # an RLP-only run (--only RLP) still plots
    assert (tmp_path / 'rlp_calibration.png').is_file() and 'k = 5' in md.read_text()


def test_family_view_holds_whole_families_out(tmp_path):
    from timebill_ros.training.corpus import family_splits
    items = build_corpus()
    families = family_splits()
    assert set(families.values()) == {'train', 'val', 'test'}
    assert family_splits() == families  # deterministic
    path = tmp_path / 'l.jsonl'
    path.write_text(''.join(json.dumps({
        'prompt_id': it.prompt_id, 'category': it.category, 'split': it.split,
        'n_prompt_tokens': 10, 'n_tokens': 7, 'capped': False, 'n_model': 1024,
        'prompt_sha': collect_mod.prompt_sha(it.prompt)}) + '\n' for it in items))
    by_family = load_examples(path, 'family')
    seen = {split: {e.category for e in examples} for split, examples in by_family.items()}
    assert not seen['test'] & seen['train'] and not seen['val'] & seen['train']
    by_prompt = load_examples(path, 'prompt')
    assert {e.category for e in by_prompt['test']} & seen['train']  # shared templates
    with pytest.raises(ValueError, match='view must be one of'):
        load_examples(path, 'random')


def test_quantile_levels_are_calibrated_on_held_out_prompts(trained_rlp):
    """Each q gets the lowest level whose N^ covers a share q of held-out answers (>= q)."""
    from timebill_ros.predictors.length_distribution import OutputFormat, parse_quantile_levels
    from timebill_ros.training.export import calibrate_quantiles, LEVEL_GRID
    # Held-out answers longer than the planted ones: the plain q-levels cover too few.
    held_out = [dataclasses.replace(e, n_tokens=min(64, e.n_tokens + 30))
                for e in planted(16, 'val')]
    levels = parse_quantile_levels(calibrate_quantiles(trained_rlp, held_out))
    assert [q for q, _ in levels] == [0.8, 0.9, 0.95, 0.99]
    truth = np.array([e.n_tokens for e in held_out], dtype=float)
    for q, level in levels:
        assert level >= q
        covered = (trained_rlp.predict_tokens(held_out, q=level) >= truth).mean()
        assert covered >= q or level == LEVEL_GRID[-1]
        lower = [lv for lv in LEVEL_GRID if q <= lv < level]
        assert all((trained_rlp.predict_tokens(held_out, q=lv) >= truth).mean() < q
                   for lv in lower)
    fmt = OutputFormat('classification', 16, 64, 'median', levels)
    assert fmt.level(0.9) == dict(levels)[0.9] and fmt.level(0.85) == dict(levels)[0.9]
    assert fmt.level(0.995) == 0.995  # beyond the calibrated ones: q itself
    assert OutputFormat('classification', 16, 64, 'median').level(0.9) == 0.9
    assert calibrate_quantiles(trained_rlp, []) == ''
    for bad in ('0.9', '0.9:x', '1.5:0.9'):
        with pytest.raises(ValueError, match='quantile_levels'):
            parse_quantile_levels(bad)


def test_the_predictor_runs_on_the_cpu_beside_a_gpu_prefill(exported, monkeypatch):
    """``predictor.provider: auto`` is the CPU where onnxruntime-gpu lists CUDA (issue 41).

    The GPU runs the prefill the predictor overlaps; ``cuda`` still asks for the CUDA
    provider, with the CPU as its fallback (what this machine's onnxruntime runs it on).
    """
    import warnings

    from timebill_ros.predictors.onnx_rlp import resolve_providers
    monkeypatch.setattr(onnxruntime, 'get_available_providers',
                        lambda: ['CUDAExecutionProvider', 'CPUExecutionProvider'])
    assert resolve_providers('auto') == ['CPUExecutionProvider']
    assert resolve_providers('cpu') == ['CPUExecutionProvider']
    assert resolve_providers('cuda') == ['CUDAExecutionProvider', 'CPUExecutionProvider']
    timing = PredictorTiming(0.0, 1e-3, 0.0)
    predictor = OnnxRlpPredictor.load(exported, provider='auto', timing=timing)
    assert predictor.session.get_providers() == ['CPUExecutionProvider']
    with warnings.catch_warnings():  # onnxruntime warns when it lacks the CUDA provider
        warnings.simplefilter('ignore')
        asked = OnnxRlpPredictor.load(exported, provider='cuda', timing=timing)
    assert asked.session.get_providers()[-1] == 'CPUExecutionProvider'
    assert asked.predict('p', list(range(10, 80)), 64) == predictor.predict(
        'p', list(range(10, 80)), 64)
    with pytest.raises(ValueError, match="'tpu'"):
        resolve_providers('tpu')
    assert PredictorConfig().provider == 'auto'
    with pytest.raises(ValueError, match="predictor.provider.*'gpu'"):
        PredictorConfig(provider='gpu')


def test_each_rlp_call_gives_the_arena_back(exported):
    """The CPU arena would keep the largest call's activations (N_p^2) for good."""
    predictor = OnnxRlpPredictor.load(exported, provider='cpu', max_input_tokens=256)
    session, seen = predictor.session, []

    class Recording:
        def __getattr__(self, name):
            return getattr(session, name)

        def run(self, names, feeds, options=None):
            seen.append(options)
            return session.run(names, feeds, options)
    predictor.session = Recording()
    first = predictor.run(list(range(5, 60)))
    second = predictor.run(list(range(5, 60)))
    assert len(seen) == 2 and seen[0] is not seen[1]
    assert all(o.get_run_config_entry('memory.enable_memory_arena_shrinkage') == 'cpu:0'
               for o in seen)
    assert (first == second).all()


def test_rlp_calls_from_several_threads_run_one_at_a_time(exported):
    """A call's activations grow with N_p^2: concurrent calls would add up their peaks."""
    predictor = OnnxRlpPredictor.load(exported, provider='cpu', max_input_tokens=256)
    session, lock = predictor.session, threading.Lock()
    inside, most, answers = [0], [0], []

    class Counting:
        def __getattr__(self, name):
            return getattr(session, name)

        def run(self, names, feeds, options=None):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)  # long enough for the other threads to arrive meanwhile
            try:
                return session.run(names, feeds, options)
            finally:
                with lock:
                    inside[0] -= 1
    predictor.session = Counting()
    threads = [threading.Thread(target=lambda: answers.append(predictor.run(range(5, 60))))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 4 and most[0] == 1
    assert all((answer == answers[0]).all() for answer in answers)
