"""The engine benchmark's arithmetic and report (the timings themselves are not tested)."""

import pytest

from timebill_ros.bench import engine as enginebench


def test_step_weight_bytes_halve_with_fp16_decode_weights(make_tiny_engine):
    full = make_tiny_engine(forward='lean')
    half = make_tiny_engine(forward='lean', decode_weights='float16')
    model = full.model
    linear = sum(m.weight.numel() for name, m in model.named_modules()
                 if name.endswith('_proj'))
    head = model.lm_head.weight.numel()
    assert enginebench.step_weight_bytes(full) == 4 * (linear + head)
    assert enginebench.step_weight_bytes(half) == 2 * (linear + head)


def test_report_puts_formats_side_by_side(tmp_path):
    rows = {'transformers fp32': enginebench.Row('transformers fp32', {100: [0.05, 0.052]},
                                                 {128: [0.2]}),
            'lean fp16': enginebench.Row('lean fp16', {100: [0.02, 0.021]}, {}, [
                {'prompt_id': 'a', 'identical': False, 'same_prefix': 7, 'tokens': 64,
                 'rouge_l': 0.5}], {1: [0.02], 8: [0.0085]})}
    meta = {'model': 'm', 'threads': 2, 'command': 'timebill enginebench', 'rounds': 2,
            'bandwidth_gbs': 30.0, 'floor_ms': {'transformers fp32': 15.0, 'lean fp16': 7.5},
            'agreement_tokens': 64, 'llama_cpp': 'skipped'}
    text = enginebench.report(rows, meta)
    assert '| transformers fp32 | 51.0 | 1.00x | 15.0 | 0.20 |' in text
    assert '| lean fp16 | 20.5 | 2.49x | 7.5 | (= fp32) |' in text
    assert '| lean fp16 | 0/1 | 7 | 0.500 |' in text
    assert '| lean fp16 | 20.0 (2.6x) | 8.5 (6.0x) |' in text
    enginebench.plot(rows, tmp_path / 'engine.png')
    assert (tmp_path / 'engine.png').stat().st_size > 1000


def test_a_prefill_only_row_has_no_decode_figures():
    rows = {'timebill gguf': enginebench.Row('timebill gguf', {100: [0.01]}, {2048: [1.5]}),
            enginebench.PREFILL_ONLY: enginebench.Row(enginebench.PREFILL_ONLY, {},
                                                      {2048: [3.1]})}
    meta = {'model': 'm', 'threads': 2, 'command': 'c', 'rounds': 1, 'bandwidth_gbs': 30.0,
            'floor_ms': {'timebill gguf': 6.0}, 'agreement_tokens': 32, 'llama_cpp': 'skipped',
            'prefill_dtype': 'bfloat16 (a bf16 GEMM ran 4.4x as fast as fp32)',
            'memory': {'file_mb': 860.4, 'before_load_mb': 412.0, 'after_load_mb': 1333.6}}
    text = enginebench.report(rows, meta)
    assert 'after loading the file: 1334 MiB (process before the load: 412 MiB; the file: 860' \
        in text
    assert '| timebill gguf | 10.0 | 1.00x | 6.0 | 1.50 |' in text
    assert f'| {enginebench.PREFILL_ONLY} | - | - | - | 3.10 |' in text
    assert '`engine.prefill_dtype: auto` on this machine: bfloat16 (a bf16' in text


def test_a_saved_run_is_reported_again(tmp_path):
    import argparse
    import json
    rows = {'transformers fp32': enginebench.Row('transformers fp32', {100: [0.05]}, {128: [0.2]},
                                                 [], {}),
            'lean fp16': enginebench.Row('lean fp16', {100: [0.02]}, {}, [], {8: [0.0085]})}
    meta = {'model': 'm', 'threads': 2, 'command': 'c', 'rounds': 1, 'bandwidth_gbs': 30.0,
            'floor_ms': {'transformers fp32': 15.0, 'lean fp16': 7.5},
            'agreement_tokens': 64, 'llama_cpp': 'skipped'}
    enginebench._write(tmp_path / 'a', rows, meta, lambda text: None)
    args = argparse.Namespace(from_json=str(tmp_path / 'a' / 'enginebench.json'),
                              out=str(tmp_path / 'b'))
    assert enginebench.run_enginebench(args, progress=lambda text: None) == 0
    assert (tmp_path / 'b' / 'enginebench.md').read_text() == \
        (tmp_path / 'a' / 'enginebench.md').read_text()
    assert json.loads((tmp_path / 'b' / 'enginebench.json').read_text())['meta'] == meta


def test_agreement_runs_without_rouge_score(make_tiny_engine, monkeypatch):
    """A robot install has no rouge-score: the GPU check's enginebench keeps token agreement."""
    import builtins
    real_import = builtins.__import__

    def no_rouge(name, *args, **kwargs):
        if name.startswith('rouge_score'):
            raise ModuleNotFoundError("No module named 'rouge_score'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, '__import__', no_rouge)
    engines = {'lean fp32': make_tiny_engine(forward='lean'),
               'lean fp16': make_tiny_engine(forward='lean', decode_weights='float16')}
    rows = {name: enginebench.Row(name, {100: [0.01]}, {}) for name in engines}
    said = []
    enginebench._measure_agreement(engines, rows, 1, 4, said.append)
    assert any('no ROUGE-L' in line for line in said)
    agreement = rows['lean fp32'].agreement[0]
    assert agreement['identical'] and agreement['rouge_l'] is None
    meta = {'model': 'm', 'threads': 2, 'command': 'c', 'rounds': 1, 'bandwidth_gbs': 30.0,
            'floor_ms': {name: 5.0 for name in engines}, 'agreement_tokens': 4,
            'llama_cpp': 'skipped'}
    assert '| lean fp32 | 1/1 | 4 | - (no rouge-score) |' in enginebench.report(rows, meta)


def test_the_prefill_parts_add_up_and_unwrap_afterwards(make_tiny_engine):
    """Matrices and attention are timed inside the prefill's total; nothing stays wrapped."""
    from timebill_ros.bench.prefill_parts import prefill_parts_s
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.engine.models import base, weights
    before = (weights.Matrix.__call__, base.GgufDecoder._attend)
    engine = LlmEngine.load(EngineConfig(prefill_dtype='float32'), EvictionConfig())
    parts = prefill_parts_s(engine, 96)
    assert parts['matrices'] > 0 and parts['attention'] > 0
    assert parts['matrices'] + parts['attention'] <= parts['total']
    assert parts['rest'] == pytest.approx(parts['total'] - parts['matrices']
                                          - parts['attention'])
    assert (weights.Matrix.__call__, base.GgufDecoder._attend) == before
    with pytest.raises(ValueError, match='GGUF file'):
        prefill_parts_s(make_tiny_engine(), 8)
    assert (weights.Matrix.__call__, base.GgufDecoder._attend) == before


def test_the_report_shows_the_prefill_parts():
    row = enginebench.Row('timebill gguf', {100: [0.01]}, {128: [0.5]})
    row.prefill_parts = {128: {'total': 0.5, 'matrices': 0.4, 'attention': 0.05, 'rest': 0.05}}
    meta = {'model': 'm', 'threads': 2, 'command': 'c', 'rounds': 1, 'bandwidth_gbs': 30.0,
            'floor_ms': {'timebill gguf': 6.0}, 'agreement_tokens': 32, 'llama_cpp': 'skipped'}
    text = enginebench.report({'timebill gguf': row}, meta)
    assert '| 128 | 0.50 | 0.40 s (80 %) | 0.05 s (10 %) | 0.05 s (10 %) |' in text


def test_the_agreement_context_holds_its_longest_prompt_and_answer(make_tiny_engine):
    """llama.cpp's context must hold an RLP log question (~3.5k tokens) and its answer."""
    from timebill_ros.bench.timebill import rlp_test_prompts
    engine = make_tiny_engine()
    lengths = [len(engine.encode(prompt)) for _, prompt in rlp_test_prompts(8)]
    assert enginebench.agreement_tokens_needed(engine, 8, 64) == max(lengths) + 64
    assert max(lengths) > 2048  # the case that overflowed a 2064-token context
