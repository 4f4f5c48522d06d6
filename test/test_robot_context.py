"""The robot-context workload of ``timebill bench`` (bench/robot_context.py, issue 42)."""

import pytest

from timebill_ros.bench import robot_context
from timebill_ros.bench.robot_context import build_workload
from timebill_ros.engine.gguf.file import GgufFile
from timebill_ros.engine.gguf.tokenizer import build_tokenizer
from timebill_ros.engine.model_source import embedded_gguf_path


@pytest.fixture(scope='module')
def count_tokens():
    """Return text -> tokens of the embedded model's own tokenizer."""
    tokenizer = build_tokenizer(GgufFile(embedded_gguf_path()))
    return lambda text: len(tokenizer(text)['input_ids'])


@pytest.fixture(scope='module')
def items(count_tokens):
    return build_workload(count_tokens)


def test_sixty_items_or_more_over_ten_long_contexts_or_more(items, count_tokens):
    contexts = {item.context_id: item for item in items}
    assert len(items) == 72 and len(contexts) == 12
    assert {c.split('-')[0] for c in contexts} == set(robot_context.KINDS)
    for item in contexts.values():  # 1-4k tokens, each at its size (a line past the target)
        size = int(item.context_id.split('-')[1])
        assert size <= item.n_context <= size + 80, item.context_id
        assert item.n_context == count_tokens(item.context)
        assert 1000 <= item.n_context <= 4000
    assert len({item.item_id for item in items}) == 72


def test_questions_follow_their_context_as_the_prefix_store_reuses_it(items):
    for item in items:
        assert item.prompt.startswith(item.context + '\n\n')
        assert item.prompt.endswith(item.question)
    by_context = {}
    for item in items:
        by_context.setdefault(item.context_id, set()).add(item.question)
    assert all(len(questions) == 6 for questions in by_context.values())


def test_references_are_the_contexts_own_facts(items):
    """Where an item has a reference answer, every line of it is read off its context."""
    with_reference = [item for item in items if item.reference]
    assert len(with_reference) == 8  # fleet errors, restricted rooms, faults, tasks: x2 sizes
    for item in with_reference:
        for line in item.reference.splitlines():
            fact = line.lstrip('-0123456789. ').strip()
            if item.context_id.startswith('fleet_log'):  # "time robot error ...": as logged
                stamp, robot, error = fact.split(' ', 2)
                assert f'{stamp} {robot} reported {error}' in item.context
            elif item.context_id.startswith('sensors'):
                motor, temp = fact.split(': ')
                assert f'{motor}: temp={temp.replace(" C", "")} C' in item.context
                assert 'status=fault' in item.context.split(f'{motor}: ')[1].split('\n')[0]
            elif item.context_id.startswith('site_map'):
                assert f'- {fact}: ' in item.context
                assert 'restricted' in item.context.split(f'- {fact}: ')[1].split('\n')[0]
            else:
                assert f'Please {fact}.' in item.context


def test_the_same_seed_gives_the_same_workload(count_tokens, items):
    again = build_workload(count_tokens, kinds=('sensors',), sizes=(1200,))
    assert again == [item for item in items if item.context_id == 'sensors-1200']
    other = build_workload(count_tokens, kinds=('sensors',), sizes=(1200,), seed=1)
    assert other[0].context != again[0].context


def test_bad_arguments_are_refused(count_tokens):
    with pytest.raises(TypeError, match='count_tokens must be callable'):
        build_workload(3)
    with pytest.raises(ValueError, match=r"unknown context kinds \['weather'\]"):
        build_workload(count_tokens, kinds=('weather',))
    with pytest.raises(ValueError, match='a context size must be an int >= 64'):
        build_workload(count_tokens, kinds=('tools',), sizes=(10,))
    assert len(build_workload(count_tokens, kinds=('tools',), sizes=(200,), questions=2)) == 2
