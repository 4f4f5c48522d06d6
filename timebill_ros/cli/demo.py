"""``timebill demo``: start the server on the embedded model, act as a planner, print a table.

The server runs as its own process (``timebill serve``), the planner here talks to it over
ROS 2 like any other client.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

from timebill_ros import prompts
from timebill_ros.server.status import STATUS_NAMES

KILL, SKIP_NEXT, PARTIAL = 1, 2, 3


def demo_goals():
    """Return [(label, prompt, budget_s, max_new_tokens, policy)] for the demo planner."""
    s = prompts.SHORT
    return [
        ('nav plan, generous', s[0][1], 20.0, 64, KILL),
        ('yes/no, generous', s[1][1], 10.0, 32, KILL),
        ('explain, tight', s[2][1], 2.0, 64, KILL),
        ('grasp steps, tight', s[3][1], 2.5, 96, KILL),
        ('grasp steps, tight, partial', s[3][1], 2.5, 96, PARTIAL),
        ('safety, generous', s[4][1], 10.0, 48, KILL),
        ('log summary 60 lines, generous', prompts.long_prompt(60, 1), 30.0, 64, KILL),
        ('log summary 60 lines, tight', prompts.long_prompt(60, 2), 4.0, 64, KILL),
        ('log summary 150 lines, tight', prompts.long_prompt(150, 3), 6.0, 64, KILL),
        ('impossible budget (infeasible)', prompts.long_prompt(150, 4), 0.05, 64, KILL),
        ('empty prompt (bad input)', '   ', 5.0, 32, KILL),
    ]


def burst_goals():
    """Return goals the planner sends at once: the first overruns under skip-next."""
    s = prompts.SHORT
    return [
        ('burst: long answer, skip-next', prompts.long_prompt(60, 5), 1.0, 96, SKIP_NEXT),
        ('burst: greeting, due soon', s[5][1], 1.5, 32, KILL),
        ('burst: yes/no, due soon', s[1][1], 2.0, 32, SKIP_NEXT),
    ]


def _start_server(params_file, log_path, node_name='timebill', extra_env=None):
    """Start ``timebill serve`` logging to ``log_path``; ``extra_env`` adds variables."""
    cmd = [sys.executable, '-m', 'timebill_ros.cli', 'serve', '--node-name', node_name]
    if params_file:
        cmd += ['--params', str(params_file)]
    log = open(log_path, 'w', encoding='utf-8')
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(extra_env or {})))


def _stop_server(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def served(params_file, log_path, wait_s=600.0, node_name='timebill'):
    """Run ``timebill serve`` as its own process; yield a client connected to it.

    ``node_name``: the server node's name (its action is ``/<node_name>/instruct``), so that
    several servers can run side by side. Raises RuntimeError when the server exits or does
    not come up within wait_s seconds. On exit the server gets SIGINT (clean shutdown) and
    its exit code is printed.
    """
    from timebill_ros.ros.session import client_session
    proc = _start_server(params_file, log_path, node_name)
    try:
        with client_session(f'/{node_name}/instruct', f'{node_name}_client') as client:
            start = time.monotonic()
            while not client.wait_for_server(5.0):
                if proc.poll() is not None or time.monotonic() - start > wait_s:
                    raise RuntimeError(f'server did not come up; see {log_path}')
            yield client
    finally:
        print(f'server exited with code {_stop_server(proc)}')


def _row(label, budget_s, result):
    from timebill_ros.ros.conversions import duration_to_s
    name = STATUS_NAMES.get(result.status, f'UNKNOWN({result.status})')
    return (f'{label:34s} {budget_s:7.2f} {result.prompt_tokens:5d} '
            f'{result.predicted_tokens:4d} {result.predictor[:8]:8s} '
            f'{duration_to_s(result.predict_time) * 1e3:6.0f} '
            f'{duration_to_s(result.predicted_wcet):8.2f} {result.eviction_ratio:6.2f} '
            f'{name:10s} {duration_to_s(result.total_time):7.2f} '
            f'{"yes" if result.deadline_met else "no":>4s}  {result.message}')


def _report(client, label, budget_s, handle):
    """Wait for one goal's result and print its row; return 1 when none came, else 0."""
    try:
        if handle is None or not handle.accepted:
            raise RuntimeError('goal was not accepted')
        result, _ = client.result(handle, timeout_s=300.0)
    except (RuntimeError, TimeoutError) as exc:
        print(f'{label:34s} no result: {exc}')
        return 1
    print(_row(label, budget_s, result), flush=True)
    return 0


def _run_goals(client, goals, together):
    """Send goals one after the other (or all at once); return how many got no result."""
    from timebill_ros.ros.client import make_goal
    failures, pending = 0, []
    for label, prompt, budget_s, n_max, policy in goals:
        goal = make_goal(prompt, budget_s=budget_s, max_new_tokens=n_max, policy=policy)
        pending.append((label, budget_s, client.send(goal)))
        if not together:
            failures += _report(client, *pending.pop())
    return failures + sum(_report(client, *item) for item in pending)


def run_demo(params_file=None, wait_s=600.0):
    """Run the demo; return 0 when every goal got a result, 1 otherwise."""
    log_dir = pathlib.Path('log')
    log_dir.mkdir(exist_ok=True)
    log_path = log_dir / 'demo_server.log'
    print(f'starting the timebill server (log: {log_path}); first start converts the '
          'embedded model and calibrates the time model, which takes a minute or two')
    try:
        with served(params_file, log_path, wait_s) as client:
            print(f'{"goal":34s} {"budget":>7s} {"N_x":>5s} {"N^":>4s} {"N^ from":8s} '
                  f'{"t_pred":>6s} {"WCET^":>8s} {"alpha*":>6s} '
                  f'{"status":10s} {"total":>7s} {"met":>4s}  message')
            failures = _run_goals(client, demo_goals(), together=False)
            failures += _run_goals(client, burst_goals(), together=True)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 1 if failures else 0


def cmd_demo(args, ros_args):
    """Start the server on the embedded model and run the planner-like demo client."""
    return run_demo(params_file=args.params, wait_s=args.wait)


def add_parser(sub):
    """Add the ``demo`` command to ``sub``."""
    demo = sub.add_parser('demo', help=cmd_demo.__doc__)
    demo.add_argument('--params', help='params YAML for the server')
    demo.add_argument('--wait', type=float, default=600.0, help='seconds to wait for start-up')
    demo.set_defaults(func=cmd_demo)
