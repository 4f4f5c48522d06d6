"""The server as a process: lifecycle and responsiveness (issue 10, items 4 and 6).

``timebill serve`` runs as a subprocess - the production path: ``factory.build_service``, a
start-up few-shot calibration, the params YAML - on ``slow_model`` saved to disk with the
real SmolLM2 tokenizer; the client runs in this process, as a planner would in its own.
SIGINT and SIGTERM arrive with one goal decoding and three queued; goal and cancel responses
and /diagnostics are measured while a goal decodes. ``destroy_node()`` is tested in this
process with a held goal and three queued.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
import pytest
from rclpy.parameter import Parameter
from ros_helpers import (COEFFS, GatedEngine, goal_msg, node_and_client, R, SpinningActionClient,
                         wait_for, wait_future)
import yaml

from timebill_ros.action import Instruct
from timebill_ros.msg import ServerStats
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.ros.client import client_session
from timebill_ros.server.service import TimeBillService

# Keys an operator's rqt_runtime_monitor / aggregator rules rely on (ros/diagnostics.py).
DIAGNOSTIC_KEYS = {'active_goals', 'queue_depth', 'busy', 'completion_rate', 'deadline_misses',
                   'misses_total', 'consecutive_misses', 'firm_met', 'total_goals',
                   'kill_latency_max_ms', 'wcet_coverage', 'speed_factor', 'wcet_margin'}
EXIT_BOUND_S = 5.0  # the bound from the signal to the process's exit, s
LONG_TOKENS = 3000  # N_max of the decoding goal: it decodes for seconds on this model


@pytest.fixture(scope='module')
def server_files(tmp_path_factory, smollm2_tokenizer, slow_model):
    """Return a function: stats_period_s -> (params YAML, cache dir).

    The server runs ``slow_model`` saved to disk; one cache for all (the first start
    calibrates).
    """
    root = tmp_path_factory.mktemp('process')
    model_dir = root / 'tiny-llama-256'
    slow_model.save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    (root / 'cache').mkdir()

    def make(stats_period_s):
        params = {'/**': {'ros__parameters': {
            # No loop guard: the long goal is slow_model's endless cycle, decoding for seconds.
            'engine': {'model_path': str(model_dir), 'max_new_tokens': 8,
                       'max_model_new_tokens': LONG_TOKENS, 'threads': 1,
                       'loop_guard': False},
            'predictor': {'kind': 'fallback'},
            'timing': {'max_calibration_s': 30.0, 'warm_up': False,
                       'state_file': str(root / 'online.yaml')},
            'queue': {'max_depth': 4},
            'stats': {'period_s': stats_period_s},
        }}}
        params_file = root / f'params_{stats_period_s}.yaml'
        params_file.write_text(yaml.safe_dump(params))
        return params_file, root / 'cache'
    return make


@contextlib.contextmanager
def _served(files, node_name):
    """Yield (server process, its stderr file, a spinning InstructClient, what it heard).

    heard: 'queue_depths' from ~/stats, 'diagnostics' as (monotonic s, DiagnosticArray) of
    this server. The server is killed on exit if still alive.
    """
    params_file, cache_dir = files
    env = dict(os.environ, TIMEBILL_CACHE=str(cache_dir), PYTHONUNBUFFERED='1')
    stderr = open(cache_dir.parent / f'{node_name}.stderr', 'w+', encoding='utf-8')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'timebill_ros.cli', 'serve', '--params', str(params_file),
         '--node-name', node_name], env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    heard = {'queue_depths': [], 'diagnostics': []}
    try:
        with client_session(f'/{node_name}/instruct', 'process_client') as client:
            client.create_subscription(
                ServerStats, f'/{node_name}/stats',
                lambda msg: heard['queue_depths'].append(msg.queue_depth), 10)
            client.create_subscription(
                DiagnosticArray, '/diagnostics',
                lambda msg: heard['diagnostics'].append((time.monotonic(), msg))
                if msg.status[0].name == f'{node_name}: deadlines' else None, 10)
            assert client.wait_for_server(180), 'the server did not start'
            yield proc, stderr, client, heard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()


def _long_goal(client):
    """Send a 3000-token goal; return (handle, result future) once it decodes."""
    decoding = threading.Event()
    handle = wait_future(client.action.send_goal_async(
        goal_msg('Count slowly.', 600, max_new_tokens=LONG_TOKENS),
        feedback_callback=lambda msg: msg.feedback.tokens_generated and decoding.set()))
    result = handle.get_result_async()
    assert decoding.wait(60), 'the long goal never decoded'
    return handle, result


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_a_signal_ends_every_goal_and_the_process_exits_cleanly(server_files, signum):
    node_name = f'lifecycle_{signal.Signals(signum).name.lower()}'
    with _served(server_files(0.1), node_name) as (proc, stderr, client, heard):
        results = [_long_goal(client)[1]]
        for i in range(3):
            handle = wait_future(client.action.send_goal_async(goal_msg(f'Queued {i}.', 600)))
            assert handle.accepted
            results.append(handle.get_result_async())
        wait_for(lambda: heard['queue_depths'][-1:] == [3], 30, 'three goals never queued')
        assert not results[0].done(), 'the decoding goal ended before the signal'
        sent_s = time.monotonic()
        proc.send_signal(signum)
        responses = [wait_future(future, timeout=EXIT_BOUND_S) for future in results]
        exit_code = proc.wait(timeout=EXIT_BOUND_S + 5)
        exit_s = time.monotonic() - sent_s
        stderr.seek(0)
        log = stderr.read()
    print(f'{node_name}: exit {exit_code} after {exit_s:.2f} s; results: '
          f'{[(r.status, r.result.status, r.result.message) for r in responses]}')
    assert exit_code == 0, log[-3000:]
    assert exit_s < EXIT_BOUND_S, log[-3000:]
    assert 'Traceback' not in log and 'terminate called' not in log, log[-3000:]
    for response in responses:
        assert response.status == GoalStatus.STATUS_ABORTED
        assert response.result.status == R.FAILED
    # Its feedback said it was decoding; the phase it was stopped in is decode or predictor
    # (the predictor's result is awaited between decoding steps).
    assert responses[0].result.message.startswith('server shut down during ')
    for response in responses[1:]:
        assert 'still queued' in response.result.message


def percentile(values, q):
    """Return the ``q`` quantile (0-1) of ``values``, upper nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.999999))]


def test_goal_and_cancel_responses_and_diagnostics_while_a_goal_decodes(server_files):
    """While one goal decodes: goal and cancel responses p99 < 150 ms; /diagnostics ~1 Hz.

    The issue's bound is 50 ms; the margin is 3x for a loaded CI machine, and
    ``bench/studies/responsiveness.py`` reports the precise figures on the embedded model.
    """
    with _served(server_files(1.0), 'responsive') as (proc, stderr, client, heard):
        long_goal, long_result = _long_goal(client)
        goal_s, cancel_s = [], []
        start = time.monotonic()
        while len(goal_s) < 50 or time.monotonic() - start < 5.5:
            sent = time.monotonic()
            handle = wait_future(client.action.send_goal_async(goal_msg('Gripper open?', 600)))
            goal_s.append(time.monotonic() - sent)
            sent = time.monotonic()
            wait_future(handle.cancel_goal_async())
            cancel_s.append(time.monotonic() - sent)
            assert wait_future(handle.get_result_async()).status == GoalStatus.STATUS_CANCELED
        assert not long_result.done(), 'the long goal ended while the test measured'
        arrivals = [(t, m) for t, m in heard['diagnostics'] if t >= start]
        wait_future(long_goal.cancel_goal_async())
        assert wait_future(long_result).status == GoalStatus.STATUS_CANCELED
    intervals = [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])]
    print(f'\nwhile decoding: goal response p50 {percentile(goal_s, 0.5) * 1e3:.1f} ms '
          f'p99 {percentile(goal_s, 0.99) * 1e3:.1f} ms; cancel response p50 '
          f'{percentile(cancel_s, 0.5) * 1e3:.1f} ms p99 {percentile(cancel_s, 0.99) * 1e3:.1f}'
          f' ms ({len(goal_s)} each); /diagnostics intervals {[round(i, 2) for i in intervals]}')
    assert percentile(goal_s, 0.99) < 0.15
    assert percentile(cancel_s, 0.99) < 0.15
    assert len(intervals) >= 3
    assert all(0.5 < interval < 2.0 for interval in intervals), intervals
    keys = {kv.key for kv in arrivals[-1][1].status[0].values}
    assert DIAGNOSTIC_KEYS <= keys, DIAGNOSTIC_KEYS - keys


def _timebill_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith('timebill-')]


@contextlib.contextmanager
def _in_process(namespace, tiny_model, tokenizer):
    """Yield (server node, action client, GatedEngine, results ended) in this process.

    ``ended`` lists every JobResult the service delivered.
    """
    built, ended = {}, []

    def factory(config, log):
        built['engine'] = GatedEngine(config.engine, config.eviction, model=tiny_model,
                                      tokenizer=tokenizer)
        service = TimeBillService(config, built['engine'], FallbackPredictor(), COEFFS,
                                  log=log)
        real_submit = service.submit

        def submit(request, on_feedback, on_done, **kwargs):
            return real_submit(request, on_feedback,
                               lambda result: (ended.append(result), on_done(result)),
                               **kwargs)

        service.submit = submit
        return service

    overrides = [Parameter('engine.max_new_tokens', value=8)]
    with node_and_client(factory, namespace, overrides, f'{namespace}_client') as graph:
        server, client, _ = graph
        try:
            action = SpinningActionClient(client, Instruct, f'/{namespace}/timebill/instruct')
            assert action.wait_for_server(timeout_sec=20)
            yield server, action, built['engine'], ended
        finally:
            built['engine'].gate.set()


def test_destroy_node_with_live_goals_ends_them_and_stops_every_thread(
        tiny_model, smollm2_tokenizer):
    """One goal held in its prefill, three queued; destroy_node() ends all four."""
    assert _timebill_threads() == [], 'a server thread of an earlier test is still alive'
    graph = _in_process('destroy', tiny_model, smollm2_tokenizer)
    with graph as (server, action, engine, ended):
        assert _timebill_threads() != []
        engine.gate.clear()
        handles = [wait_future(action.send_goal_async(goal_msg())) for _ in range(4)]
        assert engine.waiting.wait(30), 'the first goal did not reach its prefill'
        wait_for(lambda: server.service.queue_depth == 3, 30, 'three goals never queued')
        server.destroy_node()
        engine.gate.set()  # too late to run: the goal was canceled for shutdown
        wait_for(lambda: _timebill_threads() == [], 10, f'alive: {_timebill_threads()}')
        wait_for(lambda: len(ended) == 4, 10, f'{len(ended)} of 4 goals ended')
        assert all(h.accepted for h in handles)
        assert [r.status for r in ended] == [R.FAILED] * 4
        assert server.goals.jobs == {}


def test_a_goal_behind_a_dead_executor_thread_ends_failed(tiny_model, smollm2_tokenizer):
    """The execute callback's wait has a timeout: a dead server thread fails its goal.

    The executor thread is made to leave its loop after the goal it runs (as an uncaught
    error would end it); the goal queued behind it would otherwise wait forever.
    """
    with _in_process('dead', tiny_model, smollm2_tokenizer) as (server, action, engine, _):
        engine.gate.clear()
        first = wait_future(action.send_goal_async(goal_msg()))
        assert engine.waiting.wait(30), 'the first goal did not reach its prefill'
        second = wait_future(action.send_goal_async(goal_msg()))
        wait_for(lambda: server.service.queue_depth == 1, 30, 'the second goal never queued')
        server.service.executors[0]._stop.set()
        engine.gate.set()
        assert wait_future(first.get_result_async()).status == GoalStatus.STATUS_SUCCEEDED
        response = wait_future(second.get_result_async(), timeout=10)
        assert not server.service.healthy
        assert response.status == GoalStatus.STATUS_ABORTED
        assert response.result.status == R.FAILED
        assert 'server thread died' in response.result.message
