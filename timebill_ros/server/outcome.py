"""How a goal run ends: the terminal status, finish reason and message of its JobResult.

The goal run (server/goal_run.py) reads the clock and calls these with what happened; the
overrun policy (server/overrun/) says what a late or stopped goal becomes.
"""

from timebill_ros.engine import stopping
from timebill_ros.server import status

# The finish_reason of each engine stop reason, and how a COMPLETED message says it.
FINISH_OF_STOP = {
    stopping.EOS: status.FINISH_EOS, stopping.MAX_TOKENS: status.FINISH_LENGTH,
    stopping.STOP_STRING: status.FINISH_STOP, stopping.REPETITION: status.FINISH_REPETITION,
    stopping.DEADLINE: status.FINISH_DEADLINE, stopping.CANNOT_FINISH: status.FINISH_DEADLINE,
    stopping.CANCELED: status.FINISH_CANCELED}
STOP_WORDS = {stopping.EOS: 'end of answer', stopping.STOP_STRING: 'stop string',
              stopping.REPETITION: 'the answer repeated itself; cut where the loop began'}


def failed(result, exc, phase):
    """Record a model or predictor fault ``exc`` during ``phase`` as a FAILED result."""
    result.status = status.FAILED
    result.message = f'engine error: {type(exc).__name__}: {exc}'
    result.response = ''
    result.stop_phase = phase


def stopped(job, result, reason, phase, now_s):
    """Fill the result of a goal stopped by ``reason`` (engine.stopping) during ``phase``.

    now_s: the service clock once the stopped work has drained (the kill latency's end).
    """
    result.stop_phase = phase
    if reason == stopping.CANCELED:
        if job.cancel_reason == 'shutdown':
            result.status = status.FAILED
            result.message = f'server shut down during {phase}'
        else:
            result.status = status.CANCELED
            result.message = f'canceled during {phase}'
        return
    result.status = status.KILLED
    result.kill_latency_s = now_s - job.deadline_s
    no_text = ' (no text yet to return)' if job.policy.keeps_text() else ''
    if reason == stopping.DEADLINE:
        result.message = f'killed at the deadline during {phase}{no_text}'
    else:
        result.message = (f'killed during {phase}, {job.deadline_s - now_s:.3f} s before the '
                          'deadline: the time model says it can no longer finish'
                          f'{no_text}')


def _stopped_for_time(out):
    return out.stop_reason in (stopping.DEADLINE, stopping.CANNOT_FINISH)


def ends_stopped(job, out):
    """Return True when decoding's end ``out`` is a stop (:func:`stopped`), not an answer.

    A cancel, or a stop for time where the goal's policy keeps no text.
    """
    return out.stop_reason == stopping.CANCELED or (
        _stopped_for_time(out) and not job.policy.keeps_text())


def decoded(job, result, out, late_s):
    """Fill the result of a goal whose decoding ended with an answer ``out`` (DecodeResult).

    late_s: seconds past the deadline at the end (<= 0: on time). For an ``out`` that
    :func:`ends_stopped`, call :func:`stopped` instead.
    """
    stopped_for_time = _stopped_for_time(out)
    result.stop_phase = 'decode'
    if late_s > 0 and job.policy.discards_late(late_s):
        result.status = status.KILLED
        result.kill_latency_s = late_s
        result.message = f'finished {late_s:.3f} s after the deadline; response discarded'
        return
    result.status = status.COMPLETED
    result.response = out.text
    result.deadline_met = late_s <= 0
    result.finish_reason = FINISH_OF_STOP.get(out.stop_reason, status.FINISH_LENGTH)
    when = 'on time' if late_s <= 0 else f'{late_s:.3f} s late ({job.policy.name})'
    if stopped_for_time:
        result.truncated = True
        why = ('at the deadline' if out.stop_reason == stopping.DEADLINE
               else 'the next token could not arrive before the deadline')
        how = f'truncated after {len(out.token_ids)} tokens: {why}'
    else:
        how = STOP_WORDS.get(out.stop_reason, 'max_new_tokens reached')
    result.message = f'completed ({how}), {when}'
    if job.grammar is not None and out.stop_reason != stopping.EOS:
        # Only EOS follows a whole document: any other ending leaves a valid prefix.
        result.message += '; json_schema: the JSON document is incomplete'
    if job.infeasible:
        result.message += f'; {job.admission_note}'
