"""What ends or shapes a goal's answer by its content: stop strings, loop guard, sampling.

The deadline and cancel criteria are the overrun policy's (server/overrun/) and the goal
run.s (server/goal_run.py); these come from the goal's own options and ``engine`` settings.
"""

from timebill_ros.engine import stopping
from timebill_ros.engine.grammar import CLOSE_RESERVE_TOKENS
from timebill_ros.engine.sampling import Sampler


def _loop_guard(engine_config):
    return stopping.LoopGuard(engine_config.loop_guard_max_period,
                              engine_config.loop_guard_min_repeats,
                              engine_config.loop_guard_min_span)


def answer_criteria(job, engine, engine_config):
    """Return the criteria that end ``job``'s answer by its content: stop strings, loop guard.

    engine: the LlmEngine (its tokenizer: stop strings match the decoded text).
    """
    criteria = []
    if job.request.stop:
        tokenizer = engine.tokenizer
        criteria.append(stopping.StopStrings(
            job.request.stop,
            lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True)))
    # Not under a schema: a cut would break the document; its maxItems / maxLength and
    # max_new_tokens bound it (docs/answers.md).
    if engine_config.loop_guard and job.grammar is None:
        criteria.append(_loop_guard(engine_config))
    return criteria


def sampler_for(job, engine, engine_config):
    """Return ``job``'s token picker (schema mask, Sampler), or None: greedy (default).

    engine: the LlmEngine (its schema compiler, for a json_schema goal).
    """
    sampling, grammar = job.sampling, job.grammar
    inner = None
    if sampling is not None and not (sampling.greedy and sampling.repetition_penalty == 1):
        inner = Sampler(sampling)
    if grammar is not None:
        n_max = job.n_max
        guard = _loop_guard(engine_config) if engine_config.loop_guard else None
        return engine.schemas.constrain(
            grammar, inner, close_after=n_max - min(CLOSE_RESERVE_TOKENS, n_max // 4),
            loop_guard=guard)
    return inner
