"""The Q4_K-dominant test file (timebill_ros.bench.gguf_make): made by llama.cpp's quantizer."""

import pytest

from timebill_ros.bench import gguf_make
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.models import base

TINY = dict(hidden=256, ffn=512, heads=2, kv_heads=1, head_dim=128, layers=2)


@pytest.mark.parametrize('change, word', [
    (dict(hidden=250), 'hidden'), (dict(kv_heads=3), 'kv_heads'), (dict(layers=0), 'layers'),
    (dict(ffn=1.5), 'ffn'), (dict(heads=True), 'heads')])
def test_dims_refuse_what_no_model_has(change, word):
    with pytest.raises(ValueError, match=word):
        gguf_make.Dims(**dict(TINY, **change))


def test_the_default_sizes_are_qwen25_1p5b():
    dims = gguf_make.Dims()
    assert dims.matrix_weights(151936) == pytest.approx(1.54e9, rel=0.01)  # Qwen2.5-1.5B
    shapes = dict(gguf_make.tensor_plan(dims, 100))
    assert shapes['blk.27.ffn_down.weight'] == (1536, 8960)
    assert shapes['blk.0.attn_k.weight'] == (256, 1536) and 'output.weight' not in shapes


def test_llama_cpp_quantizes_the_random_model_to_mostly_q4_k(tmp_path):
    path = gguf_make.make_q4k_file(tmp_path, gguf_make.Dims(**TINY), seed=3,
                                   say=lambda text: None)
    assert path.name == 'random-qwen2-2x256-ffn512-seed3-q4_k_m.gguf'
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no F16 left behind
    gguf = GgufFile(path)
    types = [gguf.type_name(name) for name, _ in gguf_make.tensor_plan(
        gguf_make.Dims(**TINY), 49152) if not name.endswith(('norm.weight', 'bias'))]
    assert types.count('Q4_K') > len(types) / 2 and set(types) <= {'Q4_K', 'Q6_K'}
    spec = base.common_spec(gguf)
    assert (spec.arch, spec.hidden, spec.n_kv_heads, spec.head_dim) == ('qwen2', 256, 1, 128)
    assert len(gguf.get('tokenizer.ggml.tokens')) == 49152
    assert gguf_make.make_q4k_file(tmp_path, gguf_make.Dims(**TINY), seed=3) == path  # cached


def test_llama_quantize_refuses_an_unknown_recipe(tmp_path):
    with pytest.raises(ValueError, match='Q3_X'):
        gguf_make.llama_quantize(tmp_path / 'a', tmp_path / 'b', 'Q3_X')
