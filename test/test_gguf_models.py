"""GGUF files served by the engine itself (engine/gguf, engine/models).

Tiny random-weight files of each architecture and each weight type (written by gguf_files.py)
against transformers on the same weights; the tokenizers against known segmentations and,
where llama-cpp-python is installed, against llama.cpp; LlmEngine end to end on a file.
"""

import importlib.util

import numpy as np
import pytest
import torch

from gguf_files import (byte_level_tokenizer, KQUANTS, MIXED, rel_error,
                        sentencepiece_tokenizer, T, tiny_model, write_model)
from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.forward import PassHooks
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.gguf.tokenizer import build_tokenizer
from timebill_ros.engine.model_source import embedded_gguf_path
from timebill_ros.engine.models import ARCHITECTURES, load_decoder
from timebill_ros.engine.models import weights
from timebill_ros.engine.stopping import StopCriteria

ARCHS = ('llama', 'qwen2', 'qwen3', 'gemma3', 'phi3')
TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0) + KQUANTS
# fp32 GEMMs summed in another order than transformers' (and the prefill's dequantize-then-
# GEMM): relative to the largest logit. A wrong weight, row order or norm moves it by > 1e-2.
REL_TOL = 2e-4
PROMPT = [5, 17, 260, 33, 41, 99, 7, 8, 150, 11, 12, 200, 13, 14, 70, 15, 16, 18, 19, 21]


def _reference(model, ids):
    """Return transformers' logits at every position of ``ids``, (n, vocab)."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def _ours(decoder, ids, n_prompt, chunks=None):
    """Return our logits after the prompt and after each later token, (n - n_prompt + 1, V).

    The prompt runs as one pass, or in ``chunks`` (sizes); later tokens one step each.
    """
    cache, out, begin = decoder.new_cache(), [], 0
    with torch.inference_mode():
        for size in chunks or [n_prompt]:
            logits = decoder.run(ids[begin:begin + size], begin, cache, step=False)
            begin += size
        out.append(logits)
        for position in range(n_prompt, len(ids)):
            out.append(decoder.run([ids[position]], position, cache, step=True))
    return torch.stack(out)


@pytest.mark.parametrize('arch', ARCHS)
def test_each_architecture_matches_transformers(written, arch):
    """Prefill (one pass and in chunks) and decoding steps give transformers' logits.

    Gemma 3's file has a sliding window of 8 over a 20-token prompt and 6 steps: five of its
    six layers see only the last 8 positions.
    """
    path, model = written(arch, MIXED)
    decoder = load_decoder(GgufFile(path))
    ids = PROMPT + [3, 9, 27, 81, 243, 100]
    ref = _reference(model, ids)[len(PROMPT) - 1:]
    for chunks in (None, [7, 6, 7]):
        ours = _ours(decoder, ids, len(PROMPT), chunks)
        assert rel_error(ours, ref) < REL_TOL, (arch, chunks)
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize('qtype', TYPES, ids=lambda t: t.name)
def test_each_weight_type_matches_transformers(written, qtype):
    """Every matrix (embeddings and head too) in one type: the same logits as transformers."""
    path, model = written('llama', qtype)
    gguf = GgufFile(path)
    assert {gguf.type_name(n) for n in gguf.tensors if n.endswith('attn_q.weight')} == \
        {qtype.name}
    decoder = load_decoder(gguf)
    ids = PROMPT + [3, 9, 27]
    ours = _ours(decoder, ids, len(PROMPT))
    assert rel_error(ours, _reference(model, ids)[len(PROMPT) - 1:]) < REL_TOL


def test_a_wrong_weight_is_seen(written, tmp_path, kquant_rows):
    """The comparison can fail: one changed weight of the file moves the logits past REL_TOL."""
    path, model = written('llama', T.F32)
    decoder = load_decoder(GgufFile(path))
    layer = decoder.layers[0]
    matrix = layer.gate_up.groups[0][0]
    matrix.dense[3, :] += 0.5
    ours = _ours(decoder, PROMPT, len(PROMPT))
    assert rel_error(ours, _reference(model, PROMPT)[-1:]) > 10 * REL_TOL


def test_a_batched_step_equals_single_steps(written):
    path, _ = written('gemma3', MIXED)
    decoder = load_decoder(GgufFile(path))
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:14]]
    with torch.inference_mode():
        singles, caches = [], []
        for ids in prompts:
            for _ in range(2):
                caches.append(decoder.new_cache())
                decoder.run(ids, 0, caches[-1], step=False)
            singles.append(decoder.run([7], len(ids), caches[-2], step=True))
        batched, interrupted = decoder.run_step(
            [7] * 3, [len(ids) for ids in prompts], caches[1::2], [PassHooks()] * 3)
    assert not interrupted
    for i, single in enumerate(singles):
        assert rel_error(batched[i], single) < 1e-5


def test_no_fp32_copy_of_the_model_is_kept(written):
    """The decoder holds the file's blocks: fewer bytes than the weights in fp32."""
    path, model = written('llama', T.Q4_0)
    decoder = load_decoder(GgufFile(path))
    fp32_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if 'norm' not in n)
    assert decoder.weight_bytes < 0.2 * fp32_bytes
    assert all(m.dense is None for layer in decoder.layers
               for lin in (layer.qkv, layer.out, layer.gate_up, layer.down)
               for m, _ in lin.groups)


def test_an_unsupported_architecture_is_refused_by_name(tmp_path):
    from gguf import GGUFWriter
    path = tmp_path / 'mamba.gguf'
    writer = GGUFWriter(str(path), 'mamba')
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'mamba' is not supported.*llama"):
        load_decoder(GgufFile(path))
    assert set(ARCHS) == set(ARCHITECTURES)


def test_a_bad_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match='is not a file'):
        GgufFile(tmp_path / 'missing.gguf')
    junk = tmp_path / 'junk.gguf'
    junk.write_bytes(b'not a gguf file at all')
    with pytest.raises(ValueError, match='not a readable GGUF file'):
        GgufFile(junk)


def test_unsupported_weight_types_are_refused():
    with pytest.raises(ValueError, match='weight type IQ2_XS is not supported'):
        weights.Matrix(np.zeros((4, 8), np.uint8), 'IQ2_XS', 4, 256)


# -- tokenizers ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def spm_file(tmp_path_factory, kquant_rows):
    path = tmp_path_factory.mktemp('spm') / 'spm.gguf'
    write_model(path, 'gemma3', tiny_model('gemma3'), MIXED, kquant_rows,
                tokenizer=sentencepiece_tokenizer)
    return path


@pytest.fixture(scope='module')
def bpe_file(tmp_path_factory, kquant_rows):
    path = tmp_path_factory.mktemp('bpe') / 'bpe.gguf'
    write_model(path, 'llama', tiny_model('llama'), MIXED, kquant_rows,
                tokenizer=byte_level_tokenizer)
    return path


def _pieces(tokenizer, text):
    return tokenizer.convert_ids_to_tokens(tokenizer(text)['input_ids'])


def test_sentencepiece_merges_by_score_with_byte_fallback(spm_file):
    tokenizer = build_tokenizer(GgufFile(spm_file))
    assert tokenizer.chat_template is None
    assert _pieces(tokenizer, 'abc ab') == ['<bos>', 'abc', '\u2581ab']
    assert _pieces(tokenizer, 'ca b') == ['<bos>', 'ca', '\u2581b']
    # 'é' is no piece: its two UTF-8 bytes.
    assert _pieces(tokenizer, 'aé') == ['<bos>', 'a', '<0xC3>', '<0xA9>']
    assert tokenizer.decode(tokenizer('abc abé', add_special_tokens=False)['input_ids']) == \
        'abc abé'


def test_byte_level_bpe_splits_digits_and_keeps_specials(bpe_file):
    tokenizer = build_tokenizer(GgufFile(bpe_file))
    assert _pieces(tokenizer, 'the or 42') == ['t', 'he', 'Ġ', 'or', 'Ġ', '4', '2']
    ids = tokenizer('<|im_start|>user\nthe<|im_end|>')['input_ids']
    assert ids[0] == 1 and ids[-1] == 2  # the specials as one id each, no BOS added
    assert tokenizer.decode(ids, skip_special_tokens=True) == 'user\nthe'


LLAMA_CPP = importlib.util.find_spec('llama_cpp') is not None
PROMPTS = ['The capital of France is', ' leading space', 'Ünïcödé: 東京 🚀 naïve café',
           'line1\nline2\n\n  indented\ttab', "I'm sure you'll've done it 1234567",
           '<|im_start|>user\nhi<|im_end|>\n', 'abc abé ca b', '    four spaces']


@pytest.mark.skipif(not LLAMA_CPP, reason='llama-cpp-python is not installed (make bench-deps)')
@pytest.mark.parametrize('which', ['spm', 'bpe', 'embedded'])
def test_token_ids_equal_llama_cpp(which, spm_file, bpe_file):
    import llama_cpp
    path = {'spm': spm_file, 'bpe': bpe_file, 'embedded': embedded_gguf_path()}[which]
    tokenizer = build_tokenizer(GgufFile(path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for prompt in PROMPTS:
        assert tokenizer(prompt)['input_ids'] == \
            llm.tokenize(prompt.encode(), add_bos=True, special=True), prompt


def test_the_embedded_files_tokenizer_equals_the_converted_one(smollm2_tokenizer):
    """The embedded model's ids as the tokenizer the server used so far gives them."""
    tokenizer = build_tokenizer(GgufFile(embedded_gguf_path()))
    for prompt in PROMPTS:
        assert tokenizer(prompt, add_special_tokens=False)['input_ids'] == \
            smollm2_tokenizer(prompt, add_special_tokens=False)['input_ids'], prompt
    turns = [{'role': 'user', 'content': 'Plan a route'}]
    assert tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False) == \
        smollm2_tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)


# -- the engine on a file --------------------------------------------------------------------

def test_the_engine_serves_a_gguf_file(bpe_file):
    """Chat template, prefill, SnapKV eviction, decoding and the prefix store on a file."""
    engine = LlmEngine(EngineConfig(model_path=str(bpe_file)), EvictionConfig(window_size=4),
                       prefix_cache=PrefixCacheConfig(min_tokens=8, block_tokens=8))
    assert engine.model is None and engine.engine_config.decode_weights == 'gguf'
    assert engine.n_layers == 2 and engine.eos_token_ids == (2,)
    ids = engine.encode('the or the or the or the', system_prompt='the the the')
    assert ids[0] == 1 and len(ids) > 30
    with torch.inference_mode():
        state = engine.prefill(ids, StopCriteria([]), store=engine.prefix_store)
        assert state.n_x == len(ids) and state.pooled is not None
        engine.evict(state, 0.5)
        assert state.n_kv == len(ids) - round(0.5 * len(ids))
        result = engine.decode(state, 5, StopCriteria([]))
        assert len(result.token_ids) == 5
        again = engine.prefill(ids, StopCriteria([]), prefix=engine.match_prefix(ids))
    assert again.n_cached > 0 and again.first_token == state.first_token


@pytest.mark.parametrize('fields', [{'decode_weights': 'gguf', 'device': 'cuda'},
                                    {'decode_weights': 'gguf', 'device': 'cuda:1'}])
def test_a_format_the_gpu_cannot_run_is_refused_at_configure(fields):
    """The GGUF kernels read host memory: refused before any model loads (issue 41).

    A .gguf model_path itself runs on a GPU (the dense decoder, test_dense_decoder.py).
    """
    with pytest.raises(ValueError, match=r"engine.device 'cuda(:\d)?'.*CPU kernels"):
        EngineConfig(**fields)
    assert EngineConfig(**{**fields, 'device': 'cpu'}).device == 'cpu'
    assert EngineConfig(device='cuda', decode_weights='float16').device == 'cuda'
    assert EngineConfig(model_path='my.Q4_K_M.GGUF', device='cuda:0').device == 'cuda:0'
    with pytest.raises(TypeError, match='engine.device'):
        EngineConfig(device=None)


def test_a_base_model_gets_plain_text_with_bos(spm_file):
    engine = LlmEngine(EngineConfig(model_path=str(spm_file)), EvictionConfig())
    ids = engine.encode('ab', system_prompt='abc')
    pieces = engine.tokenizer.convert_ids_to_tokens(ids)
    assert pieces == ['<bos>', 'abc', '<0x0A>', '<0x0A>', 'ab']


# -- the prefill's GEMM dtype and its attention blocks ----------------------------------------

def test_a_bf16_gemm_rounds_only_products_of_many_rows(written):
    """More than GEMM_ROWS rows in bf16 move off fp32 by bf16's rounding; fewer stay exact."""
    path, _ = written('llama', T.Q4_K)
    matrix = load_decoder(GgufFile(path)).layers[0].gate_up.groups[0][0]
    x = torch.randn(weights.GEMM_ROWS + 4, matrix.k, generator=torch.Generator().manual_seed(1))
    exact = matrix(x)
    rounded = matrix(x, torch.bfloat16)
    assert rounded.dtype == torch.float32 and rounded.shape == exact.shape
    assert 1e-5 < rel_error(rounded, exact) < 2e-2
    few = x[:4]
    assert torch.equal(matrix(few, torch.bfloat16), matrix(few))


@pytest.mark.parametrize('arch', ['gemma3', 'llama'])
def test_a_bf16_prefill_is_close_and_its_steps_are_fp32(written, arch):
    """A bf16 prefill stays near transformers' logits; the steps after it are fp32's.

    The same tokens are picked; a step after the prefill runs the fp32 kernels: the same
    logits as an fp32 decoder's on the same cache.
    """
    path, model = written(arch, MIXED)
    decoder, exact = load_decoder(GgufFile(path)), load_decoder(GgufFile(path))
    decoder.prefill_dtype = torch.bfloat16
    ids = PROMPT + [3, 9, 27]
    ours = _ours(decoder, ids, len(PROMPT))
    ref = _reference(model, ids)[len(PROMPT) - 1:]
    # bf16-rounded weights move a tiny random model's logits by a few percent of the largest.
    assert REL_TOL < rel_error(ours, ref) < 5e-2
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    caches = [decoder.new_cache(), decoder.new_cache()]
    with torch.inference_mode():
        for cache in caches:  # the same bf16 prefill twice: the same cache
            decoder.run(PROMPT, 0, cache, step=False)
        step = decoder.run([3], len(PROMPT), caches[0], step=True)
        assert torch.equal(exact.run([3], len(PROMPT), caches[1], step=True), step)


@pytest.mark.parametrize('block', [2, 3, 5])
@pytest.mark.parametrize('arch', ['gemma3', 'llama'])
def test_masked_chunks_attend_in_blocks_of_queries(written, arch, block, monkeypatch):
    """Chunks after the first attend block by block (sliding window 8 in gemma3's file)."""
    from timebill_ros.engine.models import base
    monkeypatch.setattr(base, 'ATTENTION_BLOCK', block)
    path, model = written(arch, MIXED)
    decoder = load_decoder(GgufFile(path))
    ids = PROMPT + [3, 9, 27]
    ours = _ours(decoder, ids, len(PROMPT), [4, 9, 7])
    assert rel_error(ours, _reference(model, ids)[len(PROMPT) - 1:]) < REL_TOL


def test_auto_prefill_dtype_is_float32_without_bf16_dot_products(monkeypatch, tmp_path):
    """No bf16 flag: float32 and no probe, every start; with one, the probe decides."""
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text('processor : 0\nflags : fpu sse avx2 fma f16c\n\nprocessor : 1\n'
                       'flags : fpu sse avx2 fma f16c avx512f\n')
    assert weights.cpu_bf16_flags(str(cpuinfo)) == ()
    arm = tmp_path / 'cpuinfo_arm'
    arm.write_text('processor : 0\nFeatures : fp asimd bf16 i8mm\n')
    assert weights.cpu_bf16_flags(str(arm)) == ('bf16',)
    probed = []

    def probe(speedup):
        return lambda: probed.append(speedup) or speedup
    for flags, speedup, dtype in (((), 9.0, 'float32'), (('amx_bf16',), 3.9, 'bfloat16'),
                                  (('avx512_bf16',), 1.2, 'float32')):
        monkeypatch.setattr(weights, 'cpu_bf16_flags', lambda flags=flags: flags)
        monkeypatch.setattr(weights, 'bf16_gemm_speedup', probe(speedup))
        weights.auto_prefill_dtype.cache_clear()
        try:
            assert [weights.prefill_dtype('auto') for _ in range(5)] == [dtype] * 5
            assert ('no bf16 dot products' in weights.auto_prefill_dtype()[1]) == (not flags)
        finally:
            weights.auto_prefill_dtype.cache_clear()
    assert probed == [3.9, 1.2]  # no probe without a flag; one a process with one


def test_the_prefill_dtype_resolves_and_keys_the_calibration(
        bpe_file, tiny_model, smollm2_tokenizer):
    from timebill_ros.timing.profiler import key_fields
    engine = LlmEngine(EngineConfig(model_path=str(bpe_file), prefill_dtype='bfloat16'),
                       EvictionConfig())
    assert engine.forward.prefill_dtype == torch.bfloat16
    assert key_fields(engine.engine_config)[2] == 'float32-auto-gguf-bfloat16'
    auto = LlmEngine(EngineConfig(model_path=str(bpe_file)), EvictionConfig())
    assert auto.engine_config.prefill_dtype == weights.prefill_dtype('auto')
    assert auto.engine_config.prefill_dtype in ('float32', 'bfloat16')
    assert weights.bf16_gemm_speedup() > 0
    with pytest.raises(ValueError, match="prefill dtype must be auto, float32 or bfloat16"):
        weights.prefill_dtype('float16')
    with pytest.raises(ValueError, match="engine.prefill_dtype 'float32' applies to a .gguf"):
        LlmEngine(EngineConfig(prefill_dtype='float32'), EvictionConfig(), model=tiny_model,
                  tokenizer=smollm2_tokenizer)
    with pytest.raises(ValueError, match='engine.prefill_dtype'):
        EngineConfig(prefill_dtype='int8')


def test_a_gguf_engine_has_a_twin_on_its_weights(bpe_file):
    """The offload executor's engine (LlmEngine.twin) shares the decoder's blocks."""
    engine = LlmEngine(EngineConfig(model_path=str(bpe_file)), EvictionConfig())
    twin = engine.twin(engine.engine_config)
    assert twin.forward.layers is engine.forward.layers and twin.forward is not engine.forward
    ids = engine.encode('the or the or the')
    with torch.inference_mode():
        answers = [each.decode(each.prefill(ids, StopCriteria([])), 6, StopCriteria([]))
                   .token_ids for each in (engine, twin)]
    assert answers[0] == answers[1]


LONG = (PROMPT * 3)[:60]  # chunks of more than weights.GEMM_ROWS rows take the torch GEMM


@pytest.mark.parametrize('prefill_dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('arch', ['gemma3', 'llama', 'qwen2'])
def test_a_prefill_by_layer_is_the_prefill_chunk_by_chunk(written, arch, prefill_dtype):
    """run_by_layer: the bits of one run() a chunk, in layer order (gemma3: window 8)."""
    path, _ = written(arch, MIXED)
    decoder = load_decoder(GgufFile(path))
    decoder.prefill_dtype = prefill_dtype
    sizes = [17, 25, 18]
    by_chunk, by_layer = decoder.new_cache(), decoder.new_cache()
    with torch.inference_mode():
        begin = 0
        for size in sizes:
            want = decoder.run(LONG[begin:begin + size], begin, by_chunk, step=False)
            begin += size
        got = decoder.run_by_layer(LONG, 0, by_layer, sizes)
    assert torch.equal(got, want)
    for layer in range(decoder.n_layers):
        for a, b in zip(by_layer.layer_kv(layer), by_chunk.layer_kv(layer)):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match='do not cover'):
        decoder.run_by_layer(LONG, 0, decoder.new_cache(), [17, 25])


def test_held_weights_are_dequantized_once_a_block(written, monkeypatch):
    """A bf16 prefill in weights_held dequantizes a matrix once; fp32 never does.

    Outside weights_held, each bf16 call dequantizes; the fp32 GEMM reads the blocks.
    """
    path, _ = written('llama', MIXED)
    decoder = load_decoder(GgufFile(path))
    matrix = decoder.layers[0].down.groups[0][0]
    calls = []
    dequantized = weights.Matrix.dequantized
    monkeypatch.setattr(weights.Matrix, 'dequantized',
                        lambda self: (calls.append(self), dequantized(self))[1])
    x = torch.randn(20, matrix.k)
    with weights.weights_held():
        first, again = matrix(x, torch.bfloat16), matrix(x, torch.bfloat16)
    assert len(calls) == 1 and torch.equal(first, again)
    matrix(x, torch.bfloat16)
    assert len(calls) == 2
    matrix(x)
    assert len(calls) == 2


@pytest.mark.parametrize('short', ['ffn_down', 'attn_output', 'attn_q'])
def test_an_fp32_prefill_on_the_blocks_is_the_dequantized_product_whatever_the_chunk(
        written, short):
    """Rows beyond GEMM_ROWS run gemm_tiled: gguf's weights' product, a row's bits its own.

    To fp32 rounding of the float64 product; each row the same bits in any chunk.
    """
    path, _ = written('llama', MIXED)
    decoder = load_decoder(GgufFile(path))
    layer = {'ffn_down': decoder.layers[0].down, 'attn_output': decoder.layers[0].out,
             'attn_q': decoder.layers[0].qkv}[short]
    matrix = layer.groups[0][0]
    x = torch.randn(50, matrix.k, generator=torch.Generator().manual_seed(3))
    y = matrix(x)
    ref = torch.nn.functional.linear(x.double(), matrix.dequantized().double())
    if matrix.bias is not None:
        ref = ref + matrix.bias.double()
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    assert torch.equal(matrix(x[:20]), y[:20]) and torch.equal(matrix(x[30:]), y[30:])


def test_a_gguf_prefill_in_chunks_runs_by_layer_and_stops_within_one(bpe_file):
    """The engine's chunked prefill of a GGUF model: by layer; each check before a layer."""
    from timebill_ros.engine import GenerationStopped, fixed_chunks
    from timebill_ros.engine.stopping import CANCELED, StopCriterion
    engine = LlmEngine(EngineConfig(model_path=str(bpe_file), prefill_dtype='float32'),
                       EvictionConfig())
    ids = engine.encode('robot log: ' + ' '.join(f'event {i} at dock {i % 5}' for i in range(12)))
    one = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(len(ids)))
    size = len(ids) // 3 + 1
    chunked = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(size))
    assert chunked.n_chunks == 3 and chunked.first_token == one.first_token
    torch.testing.assert_close(chunked.pooled, one.pooled, rtol=1e-4, atol=1e-5)

    class Record(StopCriterion):
        def __init__(self, at):
            self.calls, self.at = [], at

        def should_stop(self, n_generated, last_token_id, n_prefilled=None):
            self.calls.append(n_prefilled)
            return CANCELED if len(self.calls) == self.at else None

    stop, interrupt = Record(at=None), Record(at=engine.n_layers * 3 - 1)
    with pytest.raises(GenerationStopped, match=CANCELED):
        engine.prefill(ids, StopCriteria([stop]), chunk_plan=fixed_chunks(size),
                       interrupt=StopCriteria([interrupt]))
    # Checked together before each (layer, chunk), layer 1's chunks first; the stop fell
    # before the last chunk of the last layer.
    assert stop.calls == interrupt.calls and len(stop.calls) == engine.n_layers * 3 - 1
    n_x, layers = len(ids), engine.n_layers
    assert stop.calls[:4] == [0, size // layers, 2 * size // layers, n_x // layers]
    assert stop.calls == sorted(stop.calls) and stop.calls[-1] < n_x


def test_the_benchmarks_switch_every_kernels_holder(written):
    """bench/kernel_builds.use_kernels (decode_ab's A/B) reaches the decoder and each matrix."""
    from timebill_ros.bench.kernel_builds import use_kernels
    path, _ = written('llama', T.Q4_0)
    decoder = load_decoder(GgufFile(path))
    built = decoder.kernels
    matrices = [m for layer in decoder.layers
                for lin in (layer.qkv, layer.out, layer.gate_up, layer.down)
                for m, _ in lin.groups]
    other = object()
    assert use_kernels(decoder, other) >= 1 + len(matrices)
    assert decoder.kernels is other and all(m.kernels is other for m in matrices)
    use_kernels(decoder, built)
    assert decoder.kernels is built and all(m.kernels is built for m in matrices)
