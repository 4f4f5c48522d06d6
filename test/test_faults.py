"""Faults at each point of the run loop, in each scheduler mode: one terminal state per goal.

A fault (the engine raising in a prefill, a decoding step, an eviction, while a goal joins a
batch; the admission recheck raising for a goal leaving the queue) ends the goals it hits
FAILED with ``ERROR_INTERNAL``; every other goal ends in its own state; the service goes on
serving, and comes back idle. Goals are held in their decode phase so that the others queue
behind them (and batch, in the batching modes) whatever this machine's speed.
"""

import concurrent.futures
import time

import pytest

from test_service import hold_first, LONG, make_service, PromptLengthPredictor, submit  # noqa
from timebill_ros.config import BudgetConfig, SchedulerConfig
from timebill_ros.engine.decode_batch import DecodeBatch
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest

MODES = {
    'fifo': dict(),
    'consolidation': dict(scheduler=SchedulerConfig(consolidation=True, batch_size=4)),
    'continuous': dict(scheduler=SchedulerConfig(continuous=True, batch_size=4)),
    'offload': dict(tau_tokens=8),
}
# Every goal evicts half of its prompt KV, so that the eviction runs.
HALF = BudgetConfig(mode='fixed', fixed_alpha=0.5)
PROMPTS = ('Count to 12.', 'Count to 3.', 'Count to 14.')


class Fault:
    """Raise from the ``nth`` call of a wrapped function on (once); count the calls."""

    def __init__(self, nth=1):
        self.nth, self.calls, self.fired = nth, 0, False

    def wrap(self, function):
        def faulty(*args, **kwargs):
            self.calls += 1
            if self.calls == self.nth:
                self.fired = True
                raise RuntimeError('injected fault')
            return function(*args, **kwargs)
        return faulty


def _engines(service):
    return [executor.runner.engine for executor in service.executors]


def _inject(service, point, fault, monkeypatch):
    if point in ('prefill', 'evict'):
        for engine in _engines(service):
            monkeypatch.setattr(engine, point, fault.wrap(getattr(engine, point)))
    elif point == 'decode':  # a goal alone, or a batch's shared step
        for engine in _engines(service):
            monkeypatch.setattr(engine, 'decode', fault.wrap(engine.decode))
        monkeypatch.setattr(DecodeBatch, 'step', fault.wrap(DecodeBatch.step))
    elif point == 'join':
        monkeypatch.setattr(DecodeBatch, 'join', fault.wrap(DecodeBatch.join))
    elif point == 'dequeue':
        for executor in service.executors:
            monkeypatch.setattr(executor, 'on_dequeue', fault.wrap(executor.on_dequeue))
    else:
        raise ValueError(point)


def _run_held(service, prompts):
    """Hold a first goal in its decode phase, queue ``prompts``, release; return recorders."""
    first = hold_first(service)
    recorders = [submit(service, GoalRequest(p, budget_s=LONG)) for p in prompts]
    for rec in recorders:
        try:
            rec.job.prediction.result(timeout=30)
        except concurrent.futures.CancelledError:  # the goal already ended (an idle executor)
            pass
    first.release.set()
    return [first] + recorders


def _check_one_result_each(service, recorders):
    for rec in recorders:
        rec.wait()
    time.sleep(0.05)  # a second result would come now
    assert [len(rec.results) for rec in recorders] == [1] * len(recorders)
    results = [rec.results[0] for rec in recorders]
    for result in results:
        assert result.status in (status.COMPLETED, status.FAILED), result.message
        if result.status == status.FAILED:
            assert result.error_code == status.ERROR_INTERNAL
            assert 'injected fault' in result.message
    deadline = time.monotonic() + 30
    while not service.idle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.idle, 'a goal still holds the service'
    return results


@pytest.mark.parametrize('point', ['prefill', 'decode', 'evict', 'join', 'dequeue'])
@pytest.mark.parametrize('mode', list(MODES))
def test_a_fault_ends_its_goals_once_and_the_service_serves_on(
        make_service, mode, point, monkeypatch):  # noqa: F811 (the fixture, imported)
    service = make_service(predictor=PromptLengthPredictor(), budget=HALF,
                           decode_weights='float32', **MODES[mode])
    fault = Fault(nth=2)  # the second call: the held first goal's went through
    _inject(service, point, fault, monkeypatch)
    results = _check_one_result_each(service, _run_held(service, PROMPTS))
    assert fault.fired or (point == 'join' and mode in ('fifo', 'offload')), \
        'the fault point was never reached'
    if fault.fired:
        assert any(r.status == status.FAILED for r in results)
    monkeypatch.undo()
    after = submit(service, GoalRequest('Say hi.', budget_s=LONG)).wait()
    assert after.status == status.COMPLETED, after.message


def test_a_joiner_ends_when_the_batch_fails_after_it_joined(
        make_service, monkeypatch):  # noqa: F811 (the fixture, imported)
    """Continuous batching: a fault once a goal has joined ends the joiner too (it was lost).

    The admission recheck raises for the second joiner, after the first joined: the batch's
    run fails as a whole, and every goal it held ends FAILED, the joiners with the rest.
    """
    service = make_service(predictor=PromptLengthPredictor(), decode_weights='float32',
                           scheduler=SchedulerConfig(continuous=True, batch_size=4))
    fault = Fault(nth=2)
    executor = service.executors[0]
    monkeypatch.setattr(executor, 'on_dequeue', fault.wrap(executor.on_dequeue))
    recorders = _run_held(service, PROMPTS[:2])
    results = _check_one_result_each(service, recorders)
    assert fault.fired
    assert [r.status for r in results] == [status.FAILED] * 3
