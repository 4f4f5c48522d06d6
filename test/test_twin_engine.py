"""A second engine on the first one's weights (LlmEngine.twin: the offload executor's)."""

import dataclasses
import threading
import traceback

import pytest
import torch

from timebill_ros.config import PrefixCacheConfig
from timebill_ros.engine.stopping import StopCriteria

PROMPTS = ['Plan a path to the dock.', 'List the tools on the bench, then pick one.']


def _answer(engine, prompt, n_tokens=12):
    state = engine.prefill(engine.encode(prompt), StopCriteria())
    engine.evict(state, 0.5)
    return engine.decode(state, n_tokens, StopCriteria()).token_ids


def _answers_in_threads(jobs):
    """Run (engine, prompt) jobs, each on its own thread of 1 torch thread, all at once.

    The engines of the jobs are distinct: an engine runs on one thread at a time.
    """
    answers, errors = [None] * len(jobs), []

    def run(index, engine, prompt):
        try:
            torch.set_num_threads(1)
            with torch.inference_mode():
                answers[index] = _answer(engine, prompt)
        except Exception:  # reported below
            errors.append(traceback.format_exc())
    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[0] if errors else ''
    return answers


@pytest.mark.parametrize('decode_weights', ['float32', 'gguf'])
def test_a_twin_shares_the_weights_and_answers_as_its_engine(make_tiny_engine, decode_weights):
    engine = make_tiny_engine(decode_weights=decode_weights,
                              prefix_cache=PrefixCacheConfig(min_tokens=8, block_tokens=8))
    twin = engine.twin(dataclasses.replace(engine.engine_config, threads=1))
    assert twin.model is engine.model and twin.tokenizer is engine.tokenizer
    assert twin.forward is not engine.forward and twin.forward._hooks is not \
        engine.forward._hooks
    assert twin.forward.layers is engine.forward.layers  # one copy of the weights
    assert twin.prefix_store is engine.prefix_store and twin.scorer is not engine.scorer
    assert twin.engine_config.threads == 1 and engine.engine_config.threads == 0
    # A first pass of the kernels may sum in another order than the later ones (a random
    # tiny model's near-tied logits then pick other tokens): both engines warm up first.
    # One engine never runs on two threads at once: one thread each, as executors do.
    for each in (engine, twin):
        for prompt in PROMPTS:
            _answers_in_threads([(each, prompt)])
    alone = [_answers_in_threads([(engine, prompt)])[0] for prompt in PROMPTS]
    assert [_answers_in_threads([(twin, prompt)])[0] for prompt in PROMPTS] == alone
    # Each engine on one thread (as each executor has its own), both at once.
    for pair in ([(engine, PROMPTS[0]), (twin, PROMPTS[1])],
                 [(engine, PROMPTS[1]), (twin, PROMPTS[0])]):
        together = _answers_in_threads(pair)
        assert together == [alone[PROMPTS.index(prompt)] for _, prompt in pair]
    assert twin.n_forward_passes > 0


def test_a_twin_of_another_format_is_refused(make_tiny_engine):
    engine = make_tiny_engine()
    with pytest.raises(ValueError, match='decode_weights differ: load an engine of its own'):
        engine.twin(dataclasses.replace(engine.engine_config, decode_weights='float16'))


def test_transformers_modules_have_no_twin(make_tiny_engine):
    engine = make_tiny_engine(forward='transformers')
    with pytest.raises(NotImplementedError, match='does not share its weights'):
        engine.twin(engine.engine_config)
