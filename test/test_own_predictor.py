"""A model's own length predictors: ``timebill predictor build --model FILE`` and its parts.

The end-to-end test builds them for a tiny random-weight Llama GGUF file (written with gguf's
writer, a byte-level vocabulary, 8k positions) from nothing: collection, the RLP on
transformers' copy of the file, the readout on the features kept during collection, both
exported where the node looks; the node's loaders then accept them for that file.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf_files import byte_level_tokenizer, T, tiny_model, write_model
from transformers import LlamaConfig, LlamaForCausalLM

from timebill_ros.cli import predictor_build
from timebill_ros.config import EngineConfig, EvictionConfig, PredictorConfig, ServerConfig
from timebill_ros.engine import LlmEngine, model_source
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.predictors import make_predictor, make_readout
from timebill_ros.predictors.contract import predictor_files
from timebill_ros.training import collect as collect_mod
from timebill_ros.training.corpus import build_corpus, quick_subset
from timebill_ros.training.dataset import Example
from timebill_ros.training.heads.rlp import RlpNet
from timebill_ros.training.prefill_features import FeatureSink, prefill_features
from timebill_ros.training.target import final_norm_weight, load_target_model

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_quick_subset_spreads_over_categories_and_keeps_test_out():
    """--prompts N: N train / val prompts from every part of the corpus, no test prompt."""
    items = build_corpus()
    subset = quick_subset(items, 120)
    assert len(subset) == 120 == len({it.prompt_id for it in subset})
    assert not [it for it in subset if it.split == 'test']
    categories = {it.category for it in items}
    assert len({it.category for it in subset}) >= 0.9 * len(categories)
    assert quick_subset(items, 10 ** 6) == [it for it in items if it.split != 'test']
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match='n_prompts'):
            quick_subset(items, bad)


def test_collection_keeps_the_readouts_features(make_tiny_engine, tmp_path):
    """The pooled states seen during collection are what prefill_features would compute."""
    engine = make_tiny_engine()
    engine.pool_layers = (1, 2)
    items = build_corpus()[:3]
    sink = FeatureSink(engine, tmp_path / 'features.pt')
    collect_mod.collect(engine, items, tmp_path / 'lengths.jsonl', n_model=6, max_batch=2,
                        log=lambda line: None, on_prefill=sink.add)
    sink.close()
    examples = [Example(it.prompt_id, it.category, it.split, it.prompt, 6, True, 0, 6)
                for it in items]
    logs = []
    cached = prefill_features(engine, examples, tmp_path / 'features.pt', log=logs.append)
    assert not logs, 'every prompt was prefilled again'
    fresh = prefill_features(engine, examples, None, log=lambda line: None)
    for prompt_id, pooled in fresh.items():
        assert pooled.shape == (1, 2 * 2 * 64)
        torch.testing.assert_close(cached[prompt_id], pooled)


def test_rlp_layers_follow_gemma3_layer_types():
    """Gemma 3's sliding and full layers get their own RoPE base in the RLP's trunk."""
    model = tiny_model('gemma3')
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])  # shorter than the sliding window (8)
    with torch.inference_mode():
        expected = model.model(ids).last_hidden_state
        net = RlpNet(model, n_layers=6, n_outputs=4)
        got = net.norm(net.trunk(ids, 6))
    types = {layer.attention_type for layer in net.layers}
    assert types == {'sliding_attention', 'full_attention'}
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def _long_llama():
    """Return a tiny Llama with 8k positions: corpus prompts in a byte-level vocabulary fit."""
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                         max_position_embeddings=8192, rope_theta=10000.0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if 'norm' in name:
                param.copy_(torch.randn_like(param) * 0.3 + 1.0)
    return model


@pytest.fixture(scope='module')
def own_file(tmp_path_factory):
    """Return (path, transformers model of its weights) of a tiny Llama GGUF, Q8_0."""
    path = tmp_path_factory.mktemp('own') / 'tiny-robot-q8_0.gguf'
    model = _long_llama()
    write_model(path, 'llama', model, T.Q8_0, {}, tokenizer=byte_level_tokenizer)
    return path, model


def test_target_model_of_a_gguf_file_is_its_weights(own_file):
    """The RLP's transformers copy of a served GGUF holds the file's dequantized weights."""
    path, reference = own_file
    engine = LlmEngine.load(EngineConfig(model_path=str(path)), EvictionConfig())
    assert engine.model is None and engine.gguf_file is not None
    target = load_target_model(engine)
    for name, weight in reference.state_dict().items():
        if name.startswith('model.layers.0.') or name == 'model.norm.weight':
            torch.testing.assert_close(target.state_dict()[name], weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(final_norm_weight(engine), reference.model.norm.weight)


def test_built_on_reads_the_training_count(tmp_path):
    """A file with its count, one from before counts were stored, and a missing one."""
    onnx = tmp_path / 'm__rlp.onnx'
    assert predictor_build.built_on(onnx) == 0
    onnx.write_bytes(b'x')
    assert predictor_build.built_on(onnx) == sys.maxsize
    onnx.with_suffix('.json').write_text(json.dumps({'train_prompts': '83'}))
    assert predictor_build.built_on(onnx) == 83


def test_build_steps_collect_only_what_is_not_committed(tmp_path):
    """The embedded model trains on its committed lengths; another model collects first."""
    embedded = predictor_build.build_steps(ServerConfig(), ['--params', 'p.yaml'])
    # The embedded model's decode readout takes its answer ids from the committed subset.
    assert [c[4] for c in embedded] == ['train', 'readout', 'decode-readout']
    assert all(c[-2:] == ['--params', 'p.yaml'] for c in embedded)
    own = ServerConfig(engine=EngineConfig(model_path=str(tmp_path / 'm.gguf')))
    steps = predictor_build.build_steps(own, [], prompts=40)
    assert steps[0][4:] == ['collect', '--prompts', '40']
    assert [c[4] for c in steps[1:]] == ['train', 'readout', 'decode-readout']
    assert all('--if-stale' in c for c in steps[1:])


def test_the_committed_answer_ids_are_the_committed_lengths_answers():
    """Every answer of the embedded ids file has the committed lengths file's length."""
    records = collect_mod.load_records(REPO / predictor_build.DEFAULT_LENGTHS)
    ids = collect_mod.load_records(REPO / predictor_build.DEFAULT_ANSWER_IDS)
    assert collect_mod.merge_answer_ids(records, ids, 'committed') == len(ids) == 240
    # The EOS is not kept; a capped answer keeps every step; a loop keeps less than its steps.
    kept = {'eos': -1, 'length': 0}
    for prompt_id in ids:
        record = records[prompt_id]
        short = len(record['answer_ids']) - record['n_tokens']
        assert short == kept[record['finish']] if record['finish'] in kept else short < 0
    assert {records[p]['split'] for p in ids} == {'train', 'val'}
    assert predictor_build.answer_ids_path(ServerConfig()).name == 'answer_ids_240.jsonl'
    own = ServerConfig(engine=EngineConfig(model_path='m.gguf'))
    assert predictor_build.answer_ids_path(own) is None
    assert predictor_build.answer_ids_path(ServerConfig(), lengths_given='x.jsonl') is None


def test_merged_answer_ids_must_come_from_the_same_collection():
    """Ids join only the record of the same prompt, settings and length; else a ValueError."""
    def record(n_tokens, **extra):
        return {'prompt_sha': 'abc', 'n_model': 1024, 'loop_guard': [64, 3, 48],
                'n_tokens': n_tokens, **extra}
    records = {'a': record(3), 'b': record(5)}
    source = {'a': record(3, answer_ids=[1, 2]), 'z': record(2, answer_ids=[7])}
    assert collect_mod.merge_answer_ids(records, source, 'ids.jsonl') == 1
    assert records['a']['answer_ids'] == [1, 2] and 'answer_ids' not in records['b']
    with pytest.raises(ValueError, match=r'ids.jsonl: b has n_tokens=6'):
        collect_mod.merge_answer_ids(records, {'b': record(6, answer_ids=[1] * 5)}, 'ids.jsonl')


def test_run_steps_logs_every_line_and_stops_at_a_failure(tmp_path):
    """Each step's output reaches the terminal and the log; a failing step ends the build."""
    class Out:
        text = ''

        def write(self, line):
            Out.text += line

        def flush(self):
            pass

    ok = [sys.executable, '-c', 'print("step one done")']
    bad = [sys.executable, '-c', 'import sys; print("broken"); sys.exit(3)']
    never = [sys.executable, '-c', 'print("never runs")']
    log = tmp_path / 'build.log'
    assert predictor_build.run_steps([ok, bad, never], log, out=Out(), needed=('python',)) == 3
    for text in (Out.text, log.read_text()):
        assert 'step one done' in text and 'broken' in text and 'exit code 3' in text
        assert 'never runs' not in text
    # A step others do not need: the next one still runs, the build still fails.
    assert predictor_build.run_steps([bad, ok], log, out=Out(), needed=()) == 3
    assert log.read_text().count('step one done') == 2 and '--- ended:' in log.read_text()
    assert predictor_build.run_steps([ok], log, out=Out()) == 0
    assert '--- built:' in log.read_text()


def test_build_for_a_gguf_file_from_nothing(own_file, tmp_path):
    """``predictor build --model FILE --prompts 6``: lengths, features, RLP and readout.

    The files land under the file's content key, and the node's loaders take them.
    """
    path, _ = own_file
    cache = tmp_path / 'cache'
    common = ['--model', str(path), '--set', f'engine.model_cache_dir={cache}']
    command = [sys.executable, '-m', 'timebill_ros.cli', 'predictor', 'build', '--prompts', '6',
               *common]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = ServerConfig(engine=EngineConfig(model_path=str(path), model_cache_dir=str(cache)))
    key = model_source.model_key(config.engine)
    assert key.startswith('tiny-robot-q8_0-')
    lengths = cache / 'rlp' / f'{key}__lengths.jsonl'
    records = [json.loads(line) for line in lengths.read_text().splitlines()]
    assert len(records) == 6 and all(r['loop_guard'] for r in records)
    assert (cache / 'rlp' / f'{key}__build.log').read_text().count('--- step') == 4
    assert all(len(r['answer_ids']) in (r['n_tokens'], r['n_tokens'] - 1) or r['finish'] ==
               'repetition' for r in records)
    assert '[' in done.stdout and 'ETA' in done.stdout  # the progress bar
    assert 'prefill features:' not in done.stdout  # the readout reused collection's states
    files = predictor_files(config)
    assert predictor_build.built_on(files['RLP']) == predictor_build.built_on(
        files['readout']) == sum(r['split'] == 'train' for r in records)
    rlp = make_predictor(PredictorConfig(), key, None, str(cache), log=lambda line: None)
    assert rlp.model_key == key and 'fallback' not in rlp.name
    engine = LlmEngine.load(config.engine, EvictionConfig())
    readout = make_readout(PredictorConfig(decode_readout=True), key, str(cache),
                           log=lambda line: None, n_layers=engine.n_layers)
    assert readout is not None
    engine.pool_layers = readout.pool_layers
    state = engine.prefill(engine.encode('Is the door open?'), StopCriteria())
    n_hat, n_upper = readout.predict_bounds(state.pooled, 256, q=0.9)
    assert 1 <= n_hat <= n_upper <= 256 and np.isfinite(n_hat)
    # The decode readout, from the answers' kept ids, checked against torch and loaded.
    assert 'ONNX vs torch on' in done.stdout.split('step 4/4: decode-readout')[-1]
    assert readout.decode is not None and readout.decode.model_key == key
    # A second build finds everything up to date and trains nothing.
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count('already built') == 3, again.stdout
