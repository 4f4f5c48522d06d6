"""The dense GGUF decoder (a GPU's path) and its static-buffer steps, checked on the CPU.

The decoder that runs on a GPU holds each matrix dequantized (gguf's own dequantization) in
one dtype and decodes on static buffers (engine/models/static_step.py; CUDA graphs there).
On the CPU in fp32 the same code must answer like the file's blocks through the C++ kernels
(today's path) and like transformers on the same weights; only capture / replay needs CUDA.
"""

import threading

import pytest
import torch

from gguf_files import (byte_level_tokenizer, KQUANTS, MIXED, rel_error, T, tiny_model,
                        write_model)
from timebill_ros.config import EngineConfig, EvictionConfig, PrefixCacheConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.engine.forward import PassHooks
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.models import load_decoder
from timebill_ros.engine.models.static_step import capacity_for, MIN_CAPACITY
from timebill_ros.engine.models.weights import dequantize, DenseMatrix, Matrix
from timebill_ros.engine.stopping import CancelStop, StopCriteria

ARCHS = ('llama', 'qwen2', 'qwen3', 'gemma3', 'phi3')
TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0) + KQUANTS
REL_TOL = 2e-4  # as test_gguf_models.py: fp32 sums in another order
PROMPT = [5, 17, 260, 33, 41, 99, 7, 8, 150, 11, 12, 200, 13, 14, 70, 15, 16, 18, 19, 21]


def _dense(path, dtype=torch.float32):
    return load_decoder(GgufFile(path), 'cpu', dtype)


def _steps(decoder, ids, n_prompt, static=True):
    """Return logits after the prompt and after each later token (one-row steps)."""
    cache, out = decoder.new_cache(), []
    with torch.inference_mode():
        out.append(decoder.run(ids[:n_prompt], 0, cache, step=False))
        for position in range(n_prompt, len(ids)):
            if static:
                logits, _ = decoder.run_step([ids[position]], [position], [cache], [PassHooks()])
                out.append(logits[0].clone())
            else:
                out.append(decoder.run([ids[position]], position, cache, step=True))
    return torch.stack(out)


@pytest.mark.parametrize('arch', ARCHS)
def test_each_architecture_dense_matches_transformers_and_the_kernels(written, arch):
    """Prefill, eager dense steps and static steps give transformers' and the kernels' logits.

    Gemma 3's sliding window of 8 is crossed by the 20-token prompt and the steps.
    """
    path, model = written(arch, MIXED)
    ids = PROMPT + [3, 9, 27, 81, 243, 100, 4, 6]
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0, len(PROMPT) - 1:].float()
    dense = _dense(path)
    static = _steps(dense, ids, len(PROMPT))
    eager = _steps(dense, ids, len(PROMPT), static=False)
    blocks = _steps(load_decoder(GgufFile(path)), ids, len(PROMPT))
    for ours in (static, eager):
        assert rel_error(ours, ref) < REL_TOL
        assert rel_error(ours, blocks) < REL_TOL
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert dense.static_steps.n_seats == 1  # seated once, then decoded in place


@pytest.mark.parametrize('qtype', TYPES, ids=lambda t: t.name)
def test_dense_weights_are_the_files_dequantized_exactly(written, qtype):
    """Dense weights are gguf's dequantization, bit for bit what the kernels unpack."""
    path, _ = written('llama', qtype)
    gguf = GgufFile(path)
    name = 'blk.0.ffn_down.weight'
    data, type_name, shape = gguf.tensor(name), gguf.type_name(name), gguf.shape(name)
    assert type_name == qtype.name
    dense = DenseMatrix(data, type_name, *shape)
    assert torch.equal(dense.weight, Matrix(data, type_name, *shape).dequantized())
    assert torch.equal(dense.weight, torch.from_numpy(dequantize(data, type_name, *shape)))
    half = DenseMatrix(data, type_name, *shape, dtype=torch.float16)
    assert torch.equal(half.weight, dense.weight.half()) and half.nbytes == dense.nbytes // 2


def test_fp16_weights_with_fp32_activations_answer_as_fp32(written):
    """What a GPU runs by default (the Jetson preset): GEMMs in fp16, everything else fp32."""
    path, _ = written('gemma3', MIXED)
    ids = PROMPT + [3, 9, 27, 81]
    half, full = _dense(path, torch.float16), _dense(path)
    assert half.new_cache().keys[0].dtype == torch.float32
    ours, reference = _steps(half, ids, len(PROMPT)), _steps(full, ids, len(PROMPT))
    assert rel_error(ours, reference) < 1e-2
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_a_wrong_dense_weight_is_seen(written):
    """The comparison can fail: one changed weight moves the logits past the tolerance."""
    path, _ = written('llama', MIXED)
    good, bad = _dense(path), _dense(path)
    bad.layers[1].gate_up.groups[0][0].weight[5, :] += 0.5
    ids = PROMPT + [3, 9]
    assert rel_error(_steps(bad, ids, len(PROMPT)), _steps(good, ids, len(PROMPT))) > 10 * REL_TOL


def test_dense_layers_join_parts_of_different_types(written):
    """The q, k (Q5_0) and v (Q8_0) parts are one dense matrix, each part exact."""
    path, _ = written('llama', MIXED)
    decoder = _dense(path)
    gguf = GgufFile(path)
    qkv = decoder.layers[0].qkv
    assert len(qkv.groups) == 1
    v_rows = gguf.shape('blk.0.attn_v.weight')[0]
    v = dequantize(gguf.tensor('blk.0.attn_v.weight'), 'Q8_0', *gguf.shape('blk.0.attn_v.weight'))
    assert torch.equal(qkv.groups[0][0].weight[-v_rows:], torch.from_numpy(v))


def _decode_rows(decoder, prompts, n_steps, leave_after=None):
    """Decode ``prompts`` together; row 1 leaves after ``leave_after`` steps. Logits by row."""
    caches, tokens, out = [], [], {i: [] for i in range(len(prompts))}
    with torch.inference_mode():
        for ids in prompts:
            caches.append(decoder.new_cache())
            tokens.append(int(decoder.run(ids, 0, caches[-1], step=False).argmax()))
        live = list(range(len(prompts)))
        for step in range(n_steps):
            if leave_after is not None and step == leave_after and 1 in live:
                live.remove(1)
            logits, interrupted = decoder.run_step(
                [tokens[r] for r in live], [len(prompts[r]) + step for r in live],
                [caches[r] for r in live], [PassHooks() for _ in live])
            assert not interrupted
            for index, row in enumerate(live):
                out[row].append(logits[index].clone())
                tokens[row] = int(logits[index].argmax())
    return out


@pytest.mark.parametrize('arch', ('gemma3', 'qwen2'))
def test_batched_static_steps_equal_single_rows_as_rows_leave(written, arch):
    """Three rows of different lengths step together, one leaves: each row as if alone."""
    path, _ = written(arch, MIXED)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:14]]
    together = _decode_rows(_dense(path), prompts, 6, leave_after=3)
    for row, ids in enumerate(prompts):
        alone = _decode_rows(_dense(path), [ids], 6 if row != 1 else 3)[0]
        assert len(together[row]) == len(alone)
        for a, b in zip(together[row], alone):
            assert rel_error(a, b) < 1e-5


def test_a_cache_whose_row_is_taken_keeps_its_kv(written):
    """Goal A's row goes to goal B and back: A's answer as if it had decoded alone."""
    path, _ = written('llama', MIXED)
    decoder = _dense(path)
    reference = _steps(_dense(path), PROMPT + [3, 9, 27, 81], len(PROMPT))
    with torch.inference_mode():
        a, b = decoder.new_cache(), decoder.new_cache()
        out = [decoder.run(PROMPT, 0, a, step=False)]
        decoder.run(PROMPT[:7], 0, b, step=False)
        for position, token in zip(range(len(PROMPT), len(PROMPT) + 4), [3, 9, 27, 81]):
            logits, _ = decoder.run_step([token], [position], [a], [PassHooks()])
            out.append(logits[0].clone())
            decoder.run_step([1], [7 + position - len(PROMPT)], [b], [PassHooks()])
    assert rel_error(torch.stack(out), reference) < 1e-5
    assert decoder.static_steps.n_seats >= 5  # the two goals took the one row in turns


def test_a_cache_grows_into_the_next_bucket(written):
    """Crossing the 256-token capacity moves the cache to the 512 bucket, answers unchanged."""
    path, _ = written('llama', T.Q8_0)
    ids = [(7 * i) % 300 + 3 for i in range(MIN_CAPACITY + 3)]
    n_prompt = MIN_CAPACITY - 2
    static = _steps(_dense(path), ids, n_prompt)
    eager = _steps(_dense(path), ids, n_prompt, static=False)
    assert rel_error(static, eager) < 1e-5
    assert capacity_for(MIN_CAPACITY) == MIN_CAPACITY
    assert capacity_for(MIN_CAPACITY + 1) == 2 * MIN_CAPACITY


def test_buckets_past_the_byte_cap_are_given_back_and_caches_keep_their_kv(written):
    path, _ = written('llama', T.Q8_0)
    decoder = _dense(path)
    decoder.static_steps.max_bytes = 1  # every new bucket gives the older ones back
    ids = [(11 * i) % 300 + 3 for i in range(MIN_CAPACITY + 4)]
    static = _steps(decoder, ids, MIN_CAPACITY - 2)
    assert len(decoder.static_steps._buckets) == 1
    assert rel_error(static, _steps(_dense(path), ids, MIN_CAPACITY - 2, static=False)) < 1e-5


def test_eviction_writes_into_the_row_a_cache_lives_in(written):
    """keep() after the cache moved into a bucket row: the next static step sees it."""
    path, _ = written('qwen3', MIXED)
    results = []
    for static in (True, False):
        decoder = _dense(path)
        cache = decoder.new_cache()
        with torch.inference_mode():
            decoder.run(PROMPT, 0, cache, step=False)
            first = decoder.run_step([3], [len(PROMPT)], [cache], [PassHooks()]) if static \
                else ({0: decoder.run([3], len(PROMPT), cache, step=True)}, {})
            keep = torch.arange(0, len(PROMPT) + 1, 2).view(1, 1, -1).expand(1, 2, -1)
            for layer in range(decoder.n_layers):
                decoder.keep(cache, layer, keep.contiguous())
            if static:
                logits, _ = decoder.run_step([9], [len(PROMPT) + 1], [cache], [PassHooks()])
                results.append((first[0][0].clone(), logits[0].clone()))
            else:
                results.append((first[0][0], decoder.run([9], len(PROMPT) + 1, cache, True)))
    for a, b in zip(*results):
        assert rel_error(a, b) < 1e-5


def test_an_interrupted_row_leaves_before_the_step(written):
    path, _ = written('llama', MIXED)
    decoder = _dense(path)
    event = threading.Event()
    cancel = CancelStop(event)
    with torch.inference_mode():
        caches = [decoder.new_cache(), decoder.new_cache()]
        for cache in caches:
            decoder.run(PROMPT, 0, cache, step=False)
        event.set()
        logits, interrupted = decoder.run_step(
            [3, 3], [len(PROMPT)] * 2, caches, [PassHooks(StopCriteria([cancel])), PassHooks()])
    assert list(logits) == [1] and interrupted == {0: 'canceled'}
    assert caches[0].lengths == [len(PROMPT)] * decoder.n_layers  # nothing written for it
    assert caches[1].lengths == [len(PROMPT) + 1] * decoder.n_layers


def test_a_twin_has_its_own_buckets(written):
    path, _ = written('llama', MIXED)
    decoder = _dense(path)
    twin = decoder.twin()
    assert twin.static_steps is not decoder.static_steps
    assert twin.static_steps.decoder is twin and twin.layers is decoder.layers


def test_the_engine_runs_the_dense_decoder_like_the_kernels(tmp_path, kquant_rows):
    """Prefill, SnapKV eviction, the prefix store and decoding through LlmEngine."""
    path = tmp_path / 'qwen2.gguf'
    write_model(path, 'qwen2', tiny_model('qwen2'), MIXED, kquant_rows,
                tokenizer=byte_level_tokenizer)
    answers = []
    for dense in (False, True):
        engine = LlmEngine(EngineConfig(model_path=str(path)), EvictionConfig(window_size=4),
                           prefix_cache=PrefixCacheConfig(min_tokens=8, block_tokens=8))
        if dense:  # what a GPU loads, here on the CPU in fp32
            engine.forward = load_decoder(engine.gguf_file, 'cpu', torch.float32)
        ids = [(13 * i) % 300 + 3 for i in range(40)]
        with torch.inference_mode():
            state = engine.prefill(ids, StopCriteria(), store=engine.prefix_store)
            engine.evict(state, 0.4)
            first = engine.decode(state, 8, StopCriteria()).token_ids
            again = engine.prefill(ids, StopCriteria(), prefix=engine.match_prefix(ids))
            second = engine.decode(again, 8, StopCriteria()).token_ids
        assert again.n_cached > 0
        answers.append((first, second))
    assert answers[0] == answers[1]


def test_the_engine_caps_the_step_buffers_as_configured(tmp_path, kquant_rows):
    path = tmp_path / 'llama.gguf'
    write_model(path, 'llama', tiny_model('llama'), MIXED, kquant_rows,
                tokenizer=byte_level_tokenizer)
    engine = LlmEngine(EngineConfig(model_path=str(path), decode_weights='float32',
                                    step_buffers_mb=12.5), EvictionConfig())
    assert engine.forward.dense and engine.engine_config.decode_weights == 'float32'
    assert engine.forward.static_steps.max_bytes == 12_500_000
    assert engine.forward.static_steps.n_captures == 0  # no graphs on the CPU
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match='engine.step_buffers_mb'):
            EngineConfig(step_buffers_mb=bad)


def test_a_gguf_file_on_a_gpu_is_accepted_in_its_dtype():
    config = EngineConfig(model_path='robot.Q4_K_M.gguf', device='cuda', dtype='float16')
    assert config.decode_weights == 'auto'
    assert EngineConfig(model_path='r.gguf', device='cuda', dtype='float16',
                        decode_weights='float16').decode_weights == 'float16'
    with pytest.raises(ValueError, match="decode_weights must be auto there, got 'float32'"):
        EngineConfig(model_path='r.gguf', device='cuda:0', dtype='float16',
                     decode_weights='float32')


def test_the_value_sum_split_in_parts_is_the_whole_product():
    from timebill_ros.engine.models.static_step import SPLIT_TOKENS, weighted_values
    generator = torch.Generator().manual_seed(0)
    for capacity in (SPLIT_TOKENS, 4 * SPLIT_TOKENS):
        probs = torch.rand(6, 3, capacity, generator=generator).softmax(-1)
        values = torch.randn(6, capacity, 64, generator=generator)
        assert torch.allclose(weighted_values(probs, values), torch.bmm(probs, values),
                              atol=1e-6)


@pytest.mark.parametrize('n_before, window', [(0, 0), (40, 0), (0, 16), (40, 16)])
def test_a_gpus_whole_chunk_attention_is_the_blocks_attention(written, n_before, window):
    """What the GPU runs for a prefill chunk (one SDPA call, KV heads repeated) on the CPU."""
    from timebill_ros.engine.models import base
    generator = torch.Generator().manual_seed(1)
    n_tokens = 300
    q = torch.randn(1, 4, n_tokens, 64, generator=generator)
    keys = torch.randn(1, 2, n_before + n_tokens, 64, generator=generator)
    values = torch.randn(1, 2, n_before + n_tokens, 64, generator=generator)
    start = base._window_start(n_before, window)
    mask = base._mask(n_tokens, n_before, window)
    keys, values = keys[:, :, start:], values[:, :, start:]
    decoder = _dense(written('llama', MIXED)[0])
    blocks = decoder._attend(q, keys, values, mask)
    whole = base._attend_whole(q, keys, values, mask, decoder.spec.attention_scale)
    assert torch.allclose(whole, blocks, atol=1e-5)
