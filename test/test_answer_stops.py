"""Stop strings, the loop guard and finish_reason: criteria, the engine, the service."""


import pytest

from service_helpers import ask, core_service
from timebill_ros.config import EngineConfig, OverrunConfig
from timebill_ros.engine.stopping import (REPETITION, STOP_STRING, LoopGuard, StopCriteria,
                                          StopStrings)
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.timing.model import TimingCoefficients


def _replay(criterion, tokens):
    """Feed ``tokens`` as decoding would; return (reason, tokens seen when it fired)."""
    for index, token in enumerate(tokens, start=1):
        reason = criterion.should_stop(index, token)
        if reason is not None:
            return reason, index
    return None, len(tokens)


# --- the loop guard --------------------------------------------------------------------------
def test_a_repeated_sentence_is_a_loop_cut_after_its_first_copy():
    intro, cycle = list(range(100, 120)), list(range(1, 21))  # a 20-token sentence
    tokens = intro + cycle * 5
    guard = LoopGuard(max_period=64, min_repeats=3, min_span=48)
    reason, at = _replay(guard, tokens)
    assert reason == REPETITION
    assert at == len(intro) + 3 * len(cycle)  # the third copy completes the loop
    assert guard.answer_tokens(tokens[:at]) == len(intro) + len(cycle)


def test_a_one_token_loop_needs_the_minimum_span():
    guard = LoopGuard(max_period=8, min_repeats=3, min_span=48)
    reason, at = _replay(guard, [5] * 100)
    assert reason == REPETITION and at == 48
    assert guard.answer_tokens([5] * 48) == 1


@pytest.mark.parametrize('tokens', [
    # A numbered list: the numbers change, so no cycle repeats exactly.
    [t for i in range(1, 30) for t in (900 + i, 13, 40, 41, 42, 43, 198)],
    # A table rule of 6 tokens repeated 4 times: 24 tokens, under min_span.
    [7, 8, 9] + [60, 61, 62, 63, 64, 65] * 4 + list(range(300, 360)),
    # A cycle longer than max_period repeats unseen.
    list(range(1000, 1070)) * 3,
])
def test_structure_that_is_not_a_loop_goes_on(tokens):
    assert _replay(LoopGuard(max_period=64, min_repeats=3, min_span=48), tokens)[0] is None


def _steps_after(guard, tokens):
    """Feed ``tokens``; return steps_to_fire after each (None where no loop is trusted)."""
    out = []
    for index, token in enumerate(tokens, start=1):
        guard.should_stop(index, token)
        out.append(guard.steps_to_fire())
    return out


def test_a_loop_seen_three_times_gives_the_steps_until_the_guard_ends_it():
    intro, cycle = list(range(100, 110)), [1, 2, 3, 4, 5]  # a 5-token cycle: 48 to fire
    tokens = intro + cycle * 12
    guard = LoopGuard(max_period=64, min_repeats=3, min_span=48)
    steps = _steps_after(guard, tokens)
    # Twice over (10 tokens) is not trusted; the third copy (15 tokens) is.
    assert steps[len(intro) + 14 - 1] is None
    assert steps[len(intro) + 15 - 1] == 48 - 15
    # Each token of the loop brings the end one step closer, down to the step it fires.
    fired = _replay(LoopGuard(max_period=64, min_repeats=3, min_span=48), tokens)[1]
    at = len(intro) + 20
    assert steps[at - 1] == fired - at == 48 - 20


def test_a_long_cycle_is_trusted_only_once_the_guard_fires():
    """A cycle of 20 repeated three times already meets min_repeats: no step before."""
    tokens = list(range(100, 110)) + list(range(1, 21)) * 3
    steps = _steps_after(LoopGuard(max_period=64, min_repeats=3, min_span=48), tokens)
    assert steps == [None] * len(tokens)


@pytest.mark.parametrize('tokens', [
    [7, 8, 9] + [60, 61, 62, 63] * 2 + list(range(300, 340)),  # a cycle seen twice
    [5, 5, 5, 5] + list(range(300, 340)),  # three copies of one token: under 12 tokens
    [t for i in range(1, 30) for t in (900 + i, 13, 40, 41, 42, 43, 198)],  # a list
])
def test_no_steps_where_no_loop_is_trusted(tokens):
    steps = _steps_after(LoopGuard(max_period=64, min_repeats=3, min_span=48), tokens)
    assert steps == [None] * len(tokens)


@pytest.mark.parametrize('kwargs', [{'max_period': 0}, {'min_repeats': 1}, {'min_span': 0},
                                    {'max_period': True}])
def test_bad_guard_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        LoopGuard(**kwargs)


# --- stop strings ----------------------------------------------------------------------------
def test_a_stop_string_ends_the_answer_before_it():
    words = ['Go', ' to', ' dock', ' 3', '.', '\n', 'END', ' more']
    stop = StopStrings(['END', 'xyz'], lambda tokens: ''.join(words[t] for t in tokens))
    reason, at = _replay(stop, list(range(len(words))))
    assert reason == STOP_STRING and at == 7
    assert stop.answer_tokens(list(range(at))) == 7
    assert stop.cut_text('Go to dock 3.\nEND') == 'Go to dock 3.\n'
    assert stop.cut_text('no stop here') is None


def test_stop_criteria_remember_which_criterion_fired():
    guard = LoopGuard(max_period=4, min_repeats=2, min_span=4)
    criteria = StopCriteria([guard])
    for index, token in enumerate([1, 2, 1, 2], start=1):
        reason = criteria.check(index, token)
    assert reason == REPETITION and criteria.fired is guard


# --- through the engine and the service --------------------------------------------------------
def test_the_engine_cuts_the_answer_at_a_stop_string(make_tiny_engine):
    engine = make_tiny_engine()
    ids = engine.encode('Count to ten.')
    free = engine.decode(engine.prefill(ids, StopCriteria()), 24, StopCriteria())
    text_of = lambda tokens: engine.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa
    target = free.text[len(free.text) // 2:len(free.text) // 2 + 3]
    assert target.strip(), free.text
    stop = StopStrings([target], text_of)
    out = engine.decode(engine.prefill(ids, StopCriteria()), 24, StopCriteria([stop]))
    assert out.stop_reason == STOP_STRING
    assert out.text == free.text[:free.text.find(target)]
    assert target not in out.text and len(out.token_ids) <= len(free.token_ids)


COEFFS = TimingCoefficients(a=1e-9, b=1e-5, c=1e-3, p=1e-6, q=1e-3)


@pytest.fixture
def service(slow_model, smollm2_tokenizer):
    engine_cfg = EngineConfig(max_new_tokens=200, prefill_chunk_tokens=64,
                              decode_weights='float32', loop_guard_min_span=24)
    service = core_service(slow_model, smollm2_tokenizer, engine_cfg, COEFFS,
                           overrun=OverrunConfig(default_policy='kill'))
    yield service
    service.shutdown()


def test_a_looping_model_ends_with_repetition_long_before_n_max(service):
    # The slow model's greedy answer settles into a cycle without EOS (conftest).
    result = ask(service, GoalRequest('Describe the dock.', budget_s=600.0))
    assert result.status == status.COMPLETED, result.message
    assert result.finish_reason == status.FINISH_REPETITION
    assert result.response_tokens < 200 and 'repeated' in result.message


def test_finish_reasons_of_each_ending(service):
    long = ask(service, GoalRequest('Describe the dock.', budget_s=600.0, max_new_tokens=4))
    assert long.finish_reason == status.FINISH_LENGTH
    bad = ask(service, GoalRequest('Describe the dock.', budget_s=600.0, stop=('',)))
    assert bad.status == status.REJECTED and bad.finish_reason == status.FINISH_REJECTED
    assert 'stop[0]' in bad.message
    many = ask(service, GoalRequest('Describe the dock.', budget_s=600.0, stop=('a',) * 17))
    assert many.status == status.REJECTED and 'at most 16' in many.message
    late = ask(service, GoalRequest('Describe the dock.', budget_s=1e-4))
    assert late.finish_reason in (status.FINISH_REJECTED, status.FINISH_DEADLINE)


def test_finish_reasons_are_documented_in_the_action():
    text = open('action/Instruct.action', encoding='utf-8').read()
    for reason in status.FINISH_REASONS:
        assert reason in text.split('string finish_reason', 1)[1][:400], reason


NOTE_SCHEMA = ('{"type": "object", "additionalProperties": false, "required": ["note"],'
               ' "properties": {"note": {"type": "string"}}}')


def test_a_schema_answer_that_loops_is_closed_into_a_valid_document(service):
    """Under a schema the guard does not cut: it closes the string and the object instead."""
    import json

    import jsonschema
    # The slow model's greedy answer settles into a cycle (conftest): inside the string here.
    result = ask(service, GoalRequest('Describe the dock.', budget_s=600.0,
                                      json_schema=NOTE_SCHEMA))
    assert result.status == status.COMPLETED, result.message
    assert result.finish_reason == status.FINISH_EOS, result.message
    assert result.response_tokens < 200  # long before max_new_tokens
    jsonschema.validate(json.loads(result.response), json.loads(NOTE_SCHEMA))


def test_a_schema_answer_closes_before_max_new_tokens(service):
    """Closing starts a reserve before max_new_tokens: the document ends whole, not cut."""
    import json
    result = ask(service, GoalRequest('Describe the dock.', budget_s=600.0, max_new_tokens=40,
                                      json_schema=NOTE_SCHEMA))
    assert result.finish_reason == status.FINISH_EOS, result.message
    assert result.response_tokens <= 40
    assert set(json.loads(result.response)) == {'note'}
