"""``timebill demo``: start the server on the embedded model, act as a planner, print a table.

The server runs as its own process (``timebill serve``), the planner here talks to it over
ROS 2 like any other client.
"""

import argparse
import pathlib
import sys

from timebill_ros import prompts
from timebill_ros.bench.rows import result_fields
from timebill_ros.bench.server_process import served
from timebill_ros.server.status import POLICY_KILL, POLICY_PARTIAL, POLICY_SKIP_NEXT, STATUS_NAMES


def demo_goals():
    """Return [(label, prompt, budget_s, max_new_tokens, policy)] for the demo planner."""
    s = prompts.SHORT
    return [
        ('nav plan, generous', s[0][1], 20.0, 64, POLICY_KILL),
        ('yes/no, generous', s[1][1], 10.0, 32, POLICY_KILL),
        ('explain, tight', s[2][1], 2.0, 64, POLICY_KILL),
        ('grasp steps, tight', s[3][1], 2.5, 96, POLICY_KILL),
        ('grasp steps, tight, partial', s[3][1], 2.5, 96, POLICY_PARTIAL),
        ('safety, generous', s[4][1], 10.0, 48, POLICY_KILL),
        ('log summary 60 lines, generous', prompts.long_prompt(60, 1), 30.0, 64, POLICY_KILL),
        ('log summary 60 lines, tight', prompts.long_prompt(60, 2), 4.0, 64, POLICY_KILL),
        ('log summary 150 lines, tight', prompts.long_prompt(150, 3), 6.0, 64, POLICY_KILL),
        ('impossible budget (infeasible)', prompts.long_prompt(150, 4), 0.05, 64, POLICY_KILL),
        ('empty prompt (bad input)', '   ', 5.0, 32, POLICY_KILL),
    ]


def burst_goals():
    """Return goals the planner sends at once: the first overruns under skip-next."""
    s = prompts.SHORT
    return [
        ('burst: long answer, skip-next', prompts.long_prompt(60, 5), 1.0, 96, POLICY_SKIP_NEXT),
        ('burst: greeting, due soon', s[5][1], 1.5, 32, POLICY_KILL),
        ('burst: yes/no, due soon', s[1][1], 2.0, 32, POLICY_SKIP_NEXT),
    ]


def _row(label, budget_s, result):
    f = result_fields(result)
    name = STATUS_NAMES.get(f['status'], f'UNKNOWN({f["status"]})')
    return (f'{label:34s} {budget_s:7.2f} {f["prompt_tokens"]:5d} '
            f'{f["predicted_tokens"]:4d} {f["predictor"][:8]:8s} '
            f'{f["predict_s"] * 1e3:6.0f} '
            f'{f["predicted_wcet_s"]:8.2f} {f["eviction_ratio"]:6.2f} '
            f'{name:10s} {f["total_s"]:7.2f} '
            f'{"yes" if f["deadline_met"] else "no":>4s}  {f["message"]}')


def _report(label, budget_s, pending):
    """Wait for one goal's result and print its row; return 1 when none came, else 0."""
    try:
        result = pending.result(timeout_s=300.0)
    except (RuntimeError, TimeoutError) as exc:
        print(f'{label:34s} no result: {exc}')
        return 1
    print(_row(label, budget_s, result), flush=True)
    return 0


def _run_goals(llm, goals, together):
    """Send goals one after the other (or all at once); return how many got no result.

    llm: a TimebillClient (the planner's client, as in examples/ask.py).
    """
    failures, pending = 0, []
    for label, prompt, budget_s, n_max, policy in goals:
        pending.append((label, budget_s, llm.send(prompt, budget_s, max_new_tokens=n_max,
                                                  policy=policy)))
        if not together:
            failures += _report(*pending.pop())
    return failures + sum(_report(*item) for item in pending)


def run_demo(params_file=None, wait_s=600.0, build_predictors=True):
    """Run the demo; return 0 when every goal got a result, 1 otherwise.

    build_predictors: afterwards, start building a missing RLP / readout in the background
    (after the demo, so that neither the server's first calibration nor the demo's goals share
    the CPU with the training).
    """
    log_dir = pathlib.Path('log')
    log_dir.mkdir(exist_ok=True)
    log_path = log_dir / 'demo_server.log'
    print(f'starting the timebill server (log: {log_path}); first start converts the '
          'embedded model and calibrates the time model, which takes a minute or two')
    try:
        with served(params_file, log_path, wait_s) as node:
            from timebill_ros.ros.client import TimebillClient
            llm = TimebillClient.attached(node)
            print(f'{"goal":34s} {"budget":>7s} {"N_x":>5s} {"N^":>4s} {"N^ from":8s} '
                  f'{"t_pred":>6s} {"WCET^":>8s} {"alpha*":>6s} '
                  f'{"status":10s} {"total":>7s} {"met":>4s}  message')
            failures = _run_goals(llm, demo_goals(), together=False)
            failures += _run_goals(llm, burst_goals(), together=True)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    if build_predictors:
        from timebill_ros.cli.predictor_build import start_background_build
        from timebill_ros.params import load_config
        common = ['--params', params_file] if params_file else []
        print(start_background_build(load_config(params_file), common))
    return 1 if failures else 0


def cmd_demo(args, ros_args):
    """Start the server on the embedded model and run the planner-like demo client."""
    return run_demo(params_file=args.params, wait_s=args.wait,
                    build_predictors=args.build_predictors)


def add_parser(sub):
    """Add the ``demo`` command to ``sub``."""
    demo = sub.add_parser('demo', help=cmd_demo.__doc__)
    demo.add_argument('--params', help='params YAML for the server')
    demo.add_argument('--wait', type=float, default=600.0, help='seconds to wait for start-up')
    demo.add_argument('--build-predictors', action=argparse.BooleanOptionalAction, default=True,
                      help='afterwards, build a missing RLP / readout in the background')
    demo.set_defaults(func=cmd_demo)
