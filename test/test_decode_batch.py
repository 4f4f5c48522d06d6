"""Batched decoding (engine/decode_batch.py) on the lean forward, tiny random Llama."""

import pytest

from timebill_ros.engine.stopping import (CANCELED, DEADLINE, MAX_TOKENS, StopCriteria,
                                          StopCriterion)

PROMPTS = ['Go to the kitchen and bring the red cup.',
           'Is the gripper open? Answer yes or no, then explain why in one sentence.',
           'Summarise: motor 3 overheated twice, battery at 40 %, lidar restarted at 12:03.']


class _FireAt(StopCriterion):
    """Stops with ``reason`` on its ``at``-th check."""

    def __init__(self, at, reason):
        self.at, self.reason, self.calls = at, reason, 0

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        self.calls += 1
        return self.reason if self.calls == self.at else None


def _prefill(engine, prompt, alpha=0.0):
    state = engine.prefill(engine.encode(prompt), StopCriteria())
    engine.evict(state, alpha)
    return state


def _alone(engine, prompt, alpha, n_max, stop=None, interrupt=None):
    return engine.decode(_prefill(engine, prompt, alpha), n_max, stop or StopCriteria(),
                         interrupt=interrupt)


@pytest.fixture(params=['float32', 'gguf'])
def engine(make_tiny_engine, request):
    """Return the lean-forward engine, its steps in fp32 or on the GGUF kernels (Q4_1 copy)."""
    return make_tiny_engine(forward='lean', decode_weights=request.param)


def test_goals_decoded_together_answer_as_they_do_alone(engine):
    settings = [(PROMPTS[0], 0.0, 12), (PROMPTS[1], 0.5, 20), (PROMPTS[2], 0.3, 7)]
    alone = [_alone(engine, *s) for s in settings]
    batch = engine.new_batch()
    rows = [batch.join(_prefill(engine, p, a), n, StopCriteria()) for p, a, n in settings]
    assert len(batch) == 3
    results, steps = {}, 0
    while len(batch):
        for row, result in batch.step():
            results[row] = (result, steps)
        steps += 1
    for row, expected in zip(rows, alone):
        result, _ = results[row]
        assert result.token_ids == expected.token_ids
        assert result.text == expected.text and result.stop_reason == MAX_TOKENS
        assert result.n_kv_final == expected.n_kv_final
    # Each goal left as soon as it was done: the 7-token one after 6 steps + its check.
    assert [results[r][1] for r in rows] == [11, 19, 6]


def test_a_goal_joins_between_steps(engine):
    late_alone = _alone(engine, PROMPTS[1], 0.0, 10)
    batch = engine.new_batch()
    first = batch.join(_prefill(engine, PROMPTS[0], 0.0), 30, StopCriteria())
    for _ in range(4):
        assert batch.step() == []
    late = batch.join(_prefill(engine, PROMPTS[1], 0.0), 10, StopCriteria())
    ended = []
    while len(batch):
        ended += batch.step()
    assert [row for row, _ in ended] == [late, first]
    assert ended[0][1].token_ids == late_alone.token_ids


def test_an_interrupt_ends_only_its_own_goal_inside_a_step(engine):
    n_layers = engine.n_layers
    other_alone = _alone(engine, PROMPTS[2], 0.0, 9)
    batch = engine.new_batch()
    # Check 1 of each step is the step edge (stop), then one per layer (interrupt):
    # fire before layer 2 of step 3.
    killer = _FireAt(2 * (n_layers + 1) + 2, DEADLINE)
    doomed = batch.join(_prefill(engine, PROMPTS[0], 0.0), 50, StopCriteria([killer]),
                        interrupt=StopCriteria([killer]))
    other = batch.join(_prefill(engine, PROMPTS[2], 0.0), 9, StopCriteria())
    ended = {}
    while len(batch):
        ended.update(batch.step())
    assert ended[doomed].stop_reason == DEADLINE
    assert len(ended[doomed].token_ids) == 3  # token 1 + steps 1 and 2; step 3 abandoned
    assert ended[other].token_ids == other_alone.token_ids
    # A stop at a step edge (cancel) also ends only its goal.
    batch.join(_prefill(engine, PROMPTS[1], 0.0), 40, StopCriteria([_FireAt(1, CANCELED)]))
    row = batch.join(_prefill(engine, PROMPTS[2], 0.0), 9, StopCriteria())
    first = batch.step()
    assert [r.stop_reason for _, r in first] == [CANCELED] and len(batch) == 1
    while len(batch):
        first += batch.step()
    assert first[-1][0] == row and first[-1][1].token_ids == other_alone.token_ids


def test_feedback_is_per_goal(engine):
    calls = {0: [], 1: []}
    batch = engine.new_batch()
    for i, prompt in enumerate(PROMPTS[:2]):
        batch.join(_prefill(engine, prompt), 9, StopCriteria(),
                   on_tokens=lambda n, text, i=i: calls[i].append((n, text)), feedback_every=4)
    results = {}
    while len(batch):
        results.update(batch.step())
    for i in (0, 1):
        assert [n for n, _ in calls[i]][:2] == [4, 8]
        assert ''.join(text for _, text in calls[i]) == results[i].text


def test_transformers_forward_takes_one_goal_per_step(make_tiny_engine):
    engine = make_tiny_engine(forward='transformers')
    batch = engine.new_batch()
    batch.join(_prefill(engine, PROMPTS[0]), 5, StopCriteria())
    with pytest.raises(ValueError, match='at most 1 goal'):
        batch.join(_prefill(engine, PROMPTS[1]), 5, StopCriteria())
    with pytest.raises(ValueError, match='n_max'):
        engine.new_batch().join(_prefill(engine, PROMPTS[1]), 0, StopCriteria())
