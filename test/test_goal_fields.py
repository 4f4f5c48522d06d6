"""Goal fields a planner relies on: sampling with a seed, and conversations (messages)."""


import pytest
import torch

from service_helpers import ask, core_service, slow_schema, wait_schema_compiles
from timebill_ros.config import EngineConfig
from timebill_ros.engine.sampling import Sampler, SamplingConfig
from timebill_ros.engine.stopping import StopCriteria
from timebill_ros.ros.client import make_goal
from timebill_ros.ros.conversions import request_from_goal
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.timing.model import TimingCoefficients


# --- sampling ----------------------------------------------------------------------------------
@pytest.mark.parametrize('field, value', [
    ('temperature', -0.1), ('temperature', float('nan')), ('top_p', 0.0), ('top_p', 1.5),
    ('top_k', -1), ('top_k', 2.5), ('repetition_penalty', 0.5), ('seed', -3),
    ('temperature', True)])
def test_bad_sampling_values_name_their_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def _draw(config, n=30):
    torch.manual_seed(99)
    logits = torch.randn(500)
    sampler = Sampler(config)
    return [sampler(logits + 0.01 * i) for i in range(n)]


def test_greedy_is_the_argmax_and_a_seed_repeats_its_answer():
    logits = torch.randn(500)
    assert Sampler()(logits) == int(logits.argmax())
    hot = SamplingConfig(temperature=1.5, seed=7)
    assert _draw(hot) == _draw(hot)
    assert _draw(hot) != _draw(SamplingConfig(temperature=1.5, seed=8))
    assert _draw(SamplingConfig(temperature=1.5, top_k=1, seed=1)) == _draw(SamplingConfig())
    assert _draw(SamplingConfig(temperature=1.5, top_p=1e-6, seed=1)) == _draw(SamplingConfig())


def test_top_k_keeps_the_draws_among_the_k_likeliest():
    logits = torch.randn(500)
    allowed = set(torch.topk(logits, 5).indices.tolist())
    sampler = Sampler(SamplingConfig(temperature=5.0, top_k=5, seed=3))
    assert {sampler(logits) for _ in range(200)} <= allowed


def test_the_repetition_penalty_moves_greedy_off_a_seen_token():
    logits = torch.zeros(10)
    logits[3], logits[4] = 2.0, 1.9
    sampler = Sampler(SamplingConfig(repetition_penalty=1.5))
    assert sampler(logits) == 3
    assert sampler(logits) == 4  # 3 was seen: 2.0 / 1.5 < 1.9


def test_the_engine_samples_token_one_too_and_repeats_with_a_seed(make_tiny_engine):
    engine = make_tiny_engine()
    ids = engine.encode('Name a colour.')

    def answer(seed):
        state = engine.prefill(ids, StopCriteria())
        return engine.decode(state, 12, StopCriteria(),
                             sampler=Sampler(SamplingConfig(temperature=2.0, seed=seed)))

    first, again, other = answer(5), answer(5), answer(6)
    assert first.token_ids == again.token_ids and first.token_ids != other.token_ids
    greedy = engine.decode(engine.prefill(ids, StopCriteria()), 12, StopCriteria())
    assert greedy.token_ids != first.token_ids


# --- conversations -------------------------------------------------------------------------------
def test_messages_sit_between_the_system_prompt_and_the_prompt(make_tiny_engine):
    engine = make_tiny_engine()
    turns = [{'role': 'system', 'content': 'You steer robots.'},
             {'role': 'user', 'content': 'Go to dock 2.'},
             {'role': 'assistant', 'content': 'On my way.'},
             {'role': 'user', 'content': 'Now dock 5.'}]
    want = engine.tokenizer(engine.tokenizer.apply_chat_template(
        turns, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    got = engine.encode('Now dock 5.', 'You steer robots.',
                        (('user', 'Go to dock 2.'), ('assistant', 'On my way.')))
    assert got == want['input_ids']
    conversation = (('user', 'Go to dock 2.'), ('assistant', 'On my way.'),
                    ('user', 'Now dock 5.'))
    assert engine.encode('', 'You steer robots.', conversation) == got


COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)


@pytest.fixture
def service(tiny_model, smollm2_tokenizer):
    engine_cfg = EngineConfig(max_new_tokens=12, prefill_chunk_tokens=64,
                              decode_weights='float32')
    service = core_service(tiny_model, smollm2_tokenizer, engine_cfg, COEFFS)
    yield service
    service.shutdown()


def _ask(service, **fields):
    fields.setdefault('budget_s', 600.0)
    return ask(service, GoalRequest(**fields))


def test_seeded_goals_answer_alike_and_bad_values_are_rejected(service):
    one = _ask(service, prompt='Name a colour.', temperature=1.0, seed=11)
    two = _ask(service, prompt='Name a colour.', temperature=1.0, seed=11)
    assert one.status == two.status == status.COMPLETED and one.response == two.response
    for field, value in (('top_p', 1.5), ('temperature', -1.0), ('top_k', -2),
                         ('repetition_penalty', 0.0)):
        bad = _ask(service, prompt='Name a colour.', **{field: value})
        assert bad.status == status.REJECTED and field in bad.message, bad.message
        assert bad.finish_reason == status.FINISH_REJECTED


@pytest.mark.parametrize('fields, needle', [
    ({'prompt': '', 'messages': (('user', 'Hi'), ('assistant', 'Hello'))}, 'last of messages'),
    ({'prompt': 'x', 'messages': (('robot', 'Hi'),)}, 'messages[0].role'),
    ({'prompt': 'x', 'messages': (('user', 'Hi'), ('system', 'late'))}, 'messages[1]'),
    ({'prompt': 'x', 'system_prompt': 's', 'messages': (('system', 'twice'),)}, 'messages[0]'),
    ({'prompt': 'x', 'messages': (('user', '  '),)}, 'messages[0].content'),
    ({'prompt': 'x', 'messages': ('user',)}, 'messages[0]'),
])
def test_bad_conversations_are_rejected_naming_the_message(service, fields, needle):
    result = _ask(service, **fields)
    assert result.status == status.REJECTED and needle in result.message, result.message


def test_a_conversation_with_an_empty_prompt_runs(service):
    result = _ask(service, prompt='', messages=(('user', 'Go to dock 2.'),
                                                ('assistant', 'On my way.'),
                                                ('user', 'Now dock 5.')))
    assert result.status == status.COMPLETED, result.message
    assert result.prompt_tokens > 20


def test_ros_goals_map_their_zero_defaults():
    goal = make_goal('Go.', budget_s=2.0, messages=[('user', 'Hi'), ('assistant', 'Yes')],
                     stop=['\n'])
    request = request_from_goal(goal, 'g', 0.0, 0.0)
    assert request.messages == (('user', 'Hi'), ('assistant', 'Yes'))
    assert (request.temperature, request.top_p, request.top_k, request.repetition_penalty,
            request.seed, request.stop) == (0.0, 1.0, 0, 1.0, None, ('\n',))
    seeded = request_from_goal(make_goal('Go.', budget_s=2.0, temperature=0.7, top_p=0.9,
                                         seed=42), 'g', 0.0, 0.0)
    assert (seeded.temperature, seeded.seed) == (pytest.approx(0.7), 42)
    assert seeded.top_p == pytest.approx(0.9)


# --- json_schema ---------------------------------------------------------------------------------
ENUM_SCHEMA = ('{"type": "object", "additionalProperties": false, "required": ["action", "ok"],'
               ' "properties": {"action": {"enum": ["move", "pick", "wait"]},'
               ' "ok": {"type": "boolean"}}}')


def test_a_schema_goal_answers_one_valid_document(service):
    import json

    import jsonschema
    result = _ask(service, prompt='What next?', json_schema=ENUM_SCHEMA, max_new_tokens=60)
    assert result.status == status.COMPLETED, result.message
    assert result.finish_reason == status.FINISH_EOS, result.message
    jsonschema.validate(json.loads(result.response), json.loads(ENUM_SCHEMA))


def test_a_schema_goal_cut_short_says_so(service):
    result = _ask(service, prompt='What next?', json_schema=ENUM_SCHEMA, max_new_tokens=3)
    assert result.status == status.COMPLETED and result.finish_reason == status.FINISH_LENGTH
    assert 'JSON document is incomplete' in result.message


@pytest.mark.parametrize('schema, needle', [
    ('{"type": ', 'not JSON'), ('[1, 2]', 'JSON object'),
    ('{"type": "object", "properties": {"a": {"type": "no-such-type"}}}', 'cannot be compiled')])
def test_bad_schemas_are_rejected_before_any_model_work(service, schema, needle):
    before = service.engine.n_forward_passes
    result = _ask(service, prompt='What next?', json_schema=schema)
    assert result.status == status.REJECTED and needle in result.message, result.message
    assert 'json_schema' in result.message and service.engine.n_forward_passes == before


def test_a_schema_with_sampling_stays_valid(service):
    import json

    import jsonschema
    for seed in (1, 2, 3):
        result = _ask(service, prompt='What next?', json_schema=ENUM_SCHEMA, max_new_tokens=60,
                      temperature=1.2, seed=seed)
        assert result.finish_reason == status.FINISH_EOS, result.message
        jsonschema.validate(json.loads(result.response), json.loads(ENUM_SCHEMA))


def test_the_mask_costs_a_fraction_of_a_millisecond(make_tiny_engine):
    from timebill_ros.engine.grammar import measure_mask_step_s
    assert 0 < measure_mask_step_s(make_tiny_engine()) < 0.05


# --- hostile schemas (issue 58) ---------------------------------------------------------------
def nested_schema(depth):
    """Return ``depth`` objects nested through "properties" (2 JSON levels each), compact."""
    import json
    schema = {'type': 'string'}
    for _ in range(depth):
        schema = {'type': 'object', 'properties': {'a': schema}}
    return json.dumps(schema, separators=(',', ':'))


@pytest.mark.parametrize('schema, needle', [
    (nested_schema(440), 'too deep'),  # 16,298 characters: 18 s of compile, issue 58
    (nested_schema(250), 'too deep: 501 levels of nesting, at most 64'),
    ('[' * 16000, 'too deep'), ('{"a": ' * 2000 + '1' + '}' * 2000, 'too deep')])
def test_deep_schemas_are_refused_before_compiling(service, monkeypatch, schema, needle):
    from timebill_ros.engine import grammar
    compiled = []
    monkeypatch.setattr(grammar.SchemaCompiler, '_compile_now',
                        lambda self, text: compiled.append(text))
    result = _ask(service, prompt='What next?', json_schema=schema)
    assert result.status == status.REJECTED, result.message
    assert result.error_code == status.ERROR_INVALID_SCHEMA and needle in result.message
    assert compiled == []


def test_a_slow_compile_is_refused_at_its_limit_then_cached():
    import time

    from timebill_ros.engine.grammar import SchemaCompiler
    from transformers import AutoTokenizer

    from timebill_ros.engine.model_source import resolve_model_dir
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(EngineConfig()),
                                              local_files_only=True)
    compiler = SchemaCompiler(tokenizer, len(tokenizer))
    schema = slow_schema('limit', n_fields=6)
    with pytest.raises(ValueError, match='too complex: compile exceeded 0.00 s'):
        compiler.compile(schema, 0.001)
    with pytest.raises(ValueError, match='still compiling'):  # at once, no second wait
        compiler.compile(schema, 10.0)
    end = time.monotonic() + 60
    while time.monotonic() < end:  # the compile goes on and lands in the cache
        try:
            assert compiler.compile(schema, 0.0) is not None
            break
        except ValueError:
            time.sleep(0.05)
    else:
        pytest.fail('the compile never landed in the cache')
    wait_schema_compiles()


def test_a_schema_goal_waits_no_longer_than_its_budget(service):
    import time
    assert service.engine.schemas is not None  # made at start-up in the node (its probe)
    start = time.monotonic()
    result = _ask(service, prompt='What next?', json_schema=slow_schema('budget'),
                  budget_s=0.2)
    assert result.status == status.REJECTED, result.message
    assert result.error_code == status.ERROR_INVALID_SCHEMA
    assert 'too complex: compile exceeded 0.2' in result.message
    assert time.monotonic() - start < 0.5  # the budget, not queue.max_schema_compile_s (2)
    wait_schema_compiles()
