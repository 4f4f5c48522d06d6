"""The ``timebill`` command: serve, profile, send, demo, bench, schedbench, predictor, latency."""

import argparse
import sys


def _split_ros_args(argv):
    """Split argv at ``--ros-args``: (ours, ros args including the marker)."""
    if '--ros-args' in argv:
        i = argv.index('--ros-args')
        return argv[:i], argv[i:]
    return argv, []


def _load_config(params_file, overrides=()):
    from timebill_ros import params
    flat = params.load_yaml(params_file) if params_file else {}
    for item in overrides:
        name, _, raw = item.partition('=')
        flat[name] = _parse_value(raw)
    return params.config_from_flat(flat)


def _parse_value(raw):
    import yaml
    return yaml.safe_load(raw)


def cmd_serve(args, ros_args):
    """Start the timebill node (the same node launch/llm.launch.py starts)."""
    from timebill_ros.factory import build_service
    from timebill_ros.ros.node import TimeBillNode, spin
    if args.params:
        ros_args = (ros_args or ['--ros-args']) + ['--params-file', args.params]
    spin(lambda: TimeBillNode(build_service, node_name=args.node_name, freeze_heap=True),
         args=[sys.argv[0]] + ros_args)
    return 0


def cmd_profile(args, ros_args):
    """Profile prefill and decode-step times, fit Eq. 4, print the report, save the YAML."""
    from timebill_ros.engine import LlmEngine
    from timebill_ros.factory import resolved_engine
    from timebill_ros.latency.few_shot import few_shot_profile
    from timebill_ros.timing.profiler import ProfileGrid, format_report, profile
    from timebill_ros.timing.model import default_calibration_path
    config = _load_config(args.params, args.set)
    engine = LlmEngine.load(config.engine, config.eviction)
    config = resolved_engine(config, engine)
    limit = args.time_limit or None
    if args.few_shot:
        calibration = few_shot_profile(engine, engine_config=config.engine, time_limit_s=limit,
                                       max_tokens=min(args.max_tokens, 2048), progress=print)
    else:
        if args.quick:
            grid = ProfileGrid.startup_grid()
        else:
            grid = ProfileGrid.full_grid(engine.context_tokens, max_tokens=args.max_tokens)
        calibration = profile(engine, grid, time_limit_s=limit, progress=print)
    if not args.no_batch and engine.forward.max_batch > 1:
        import dataclasses
        from timebill_ros.timing.batch import probe_batches
        calibration = dataclasses.replace(
            calibration, batch_points=tuple(probe_batches(engine, progress=print)))
    print(format_report(calibration))
    # The calibration's own key (profiler.key_fields): the one the server looks up.
    out = args.out or default_calibration_path(calibration.key)
    calibration.save(out)
    print(f'saved {out}')
    return 0


def cmd_send(args, ros_args):
    """Send one goal and print feedback and the result."""
    from timebill_ros.ros.client import make_goal
    from timebill_ros.ros.session import client_session
    policy = {'default': 0, 'kill': 1, 'skip_next': 2, 'partial': 3}[args.policy]
    goal = make_goal(args.prompt, budget_s=args.budget, max_new_tokens=args.max_new_tokens,
                     policy=policy, system_prompt=args.system)
    with client_session(args.action) as client:
        if not client.wait_for_server(args.wait):
            print(f'no action server at {args.action}', file=sys.stderr)
            return 2
        result, _ = client.run(goal, on_feedback=lambda fb: print(fb.text, end='', flush=True))
    print()
    for field in ('status', 'message', 'response', 'prompt_tokens', 'response_tokens',
                  'predicted_tokens', 'pessimistic_tokens', 'eviction_ratio', 'deadline_met',
                  'truncated', 'infeasible', 'predictor'):
        print(f'{field}: {getattr(result, field)}')
    return 0


def cmd_demo(args, ros_args):
    """Start the server on the embedded model and run the planner-like demo client."""
    from timebill_ros.demo import run_demo
    return run_demo(params_file=args.params, wait_s=args.wait)


def cmd_enginebench(args, ros_args):
    """Decode / prefill speed and greedy agreement of each engine format, side by side."""
    from timebill_ros.enginebench import run_enginebench
    return run_enginebench(args)


def cmd_schedbench(args, ros_args):
    """Scheduling policies (RT-LM) under Poisson load with deadlines, through the real node."""
    from timebill_ros.schedbench import run_schedbench
    return run_schedbench(args)


def cmd_bench(args, ros_args):
    """Run the TimeBill benchmark through the real node."""
    from timebill_ros.bench import run_bench
    if args.breakdown:
        return _print_breakdown(args.breakdown)
    return run_bench(args)


def _print_breakdown(raw_path):
    import json
    from timebill_ros.bench import predictor_breakdown
    table = predictor_breakdown(json.loads(open(raw_path, encoding='utf-8').read()))
    print('| jobs | N^ | ROUGE-L rlp / fallback | on time rlp / fallback | '
          'mean alpha* rlp / fallback |\n|---|---|---|---|---|')
    for group, row in table.items():
        label = 'N^ < N_max' if group == 'short' else 'N^ = N_max'
        print(f"| {row['jobs']} | {label} | {row['rouge_l'][0]:.3f} / {row['rouge_l'][1]:.3f} | "
              f"{row['done'][0]:.2f} / {row['done'][1]:.2f} | "
              f"{row['alpha'][0]:.2f} / {row['alpha'][1]:.2f} |")
    return 0


def build_parser():
    """Return the argparse parser of the ``timebill`` command."""
    parser = argparse.ArgumentParser(prog='timebill', description=__doc__)
    sub = parser.add_subparsers(dest='command', required=True)
    serve = sub.add_parser('serve', help=cmd_serve.__doc__)
    serve.add_argument('--params', help='ROS 2 params YAML (e.g. config/llm.yaml)')
    serve.add_argument('--node-name', default='timebill')
    serve.set_defaults(func=cmd_serve)
    prof = sub.add_parser('profile', help=cmd_profile.__doc__)
    prof.add_argument('--params', help='ROS 2 params YAML for the engine settings')
    prof.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE')
    prof.add_argument('--out', help='calibration YAML (default: the per-user cache entry)')
    mode = prof.add_mutually_exclusive_group()
    mode.add_argument('--quick', action='store_true', help='the small start-up grid')
    mode.add_argument('--few-shot', action='store_true',
                      help='five probes, Eq. 4 fitted to them (SimFLi budget; ~15 s on CPU)')
    prof.add_argument('--max-tokens', type=int, default=4096,
                      help='largest N_x / N_kv (few-shot: at most 2048)')
    prof.add_argument('--time-limit', type=float, default=0.0,
                      help='seconds; skip measurements that would exceed it (0 = none)')
    prof.add_argument('--no-batch', action='store_true',
                      help='skip the batched-decoding probes (B = 1, 2, 4, 8)')
    prof.set_defaults(func=cmd_profile)
    send = sub.add_parser('send', help=cmd_send.__doc__)
    send.add_argument('prompt')
    send.add_argument('--budget', type=float, default=5.0, help='time budget, seconds')
    send.add_argument('--max-new-tokens', type=int, default=0)
    send.add_argument('--policy', choices=('default', 'kill', 'skip_next', 'partial'),
                      default='default')
    send.add_argument('--system', default='')
    send.add_argument('--action', default='/timebill/instruct')
    send.add_argument('--wait', type=float, default=30.0, help='seconds to wait for the server')
    send.set_defaults(func=cmd_send)
    demo = sub.add_parser('demo', help=cmd_demo.__doc__)
    demo.add_argument('--params', help='params YAML for the server')
    demo.add_argument('--wait', type=float, default=600.0, help='seconds to wait for start-up')
    demo.set_defaults(func=cmd_demo)
    bench = sub.add_parser('bench', help=cmd_bench.__doc__)
    bench.add_argument('--out', default='benchmarks/results')
    bench.add_argument('--quick', action='store_true', help='fewer prompts')
    bench.add_argument('--prompt-set', choices=('robot', 'rlp-test'), default='robot',
                       help='robot prompts, or held-out test prompts of the RLP corpus')
    bench.add_argument('--n-max', type=int, default=48, help='N_max of every goal, tokens')
    bench.add_argument('--fractions', default='',
                       help='comma list of budget fractions T / t^_e2e (default 0.9,1,1.1,1.25)')
    bench.add_argument('--breakdown', metavar='RAW_JSON',
                       help='only print the RLP-vs-fallback breakdown of a bench_raw.json')
    bench.add_argument('--prompts', type=int, default=0,
                       help='with --prompt-set rlp-test: how many held-out prompts')
    bench.add_argument('--methods', default='',
                       help='comma list of methods (vanilla is always run); default all')
    bench.set_defaults(func=cmd_bench)
    engine_bench = sub.add_parser('enginebench', help=cmd_enginebench.__doc__)
    engine_bench.add_argument('--out', default='benchmarks/results/engine')
    engine_bench.add_argument('--threads', type=int, default=0, help='0 = torch default')
    engine_bench.add_argument('--rounds', type=int, default=3)
    engine_bench.add_argument('--steps', type=int, default=16, help='decoding steps a round')
    engine_bench.add_argument('--quick', action='store_true',
                              help='KV 100/1000, prefill 128/512, 2 prompts')
    engine_bench.add_argument('--from-json', default='', metavar='JSON',
                              help='only re-make the table and plot of a saved run')
    engine_bench.set_defaults(func=cmd_enginebench)
    sched = sub.add_parser('schedbench', help=cmd_schedbench.__doc__)
    sched.add_argument('--out', default='benchmarks/results/sched')
    sched.add_argument('--methods', default='',
                       help='comma list of fifo,edf,luf,muf,slack,up,up-1thread,up+offload, '
                            'up+consolidation,rt-lm,fifo+consolidation,fifo+continuous, and '
                            'up@ALPHA (up with scheduler.up_alpha ALPHA) (default all but '
                            'up@ALPHA)')
    sched.add_argument('--subsets', default='', help='comma list of small,medium,large '
                       '(default all)')
    sched.add_argument('--loads', default='',
                       help='offered loads x capacity, comma list (default 0.5,0.8,1.0,1.2)')
    sched.add_argument('--goals', type=int, default=None, help='goals a subset (default 24)')
    sched.add_argument('--repeats', type=int, default=None,
                       help='traces a cell, each with its own seed (default 2)')
    sched.add_argument('--slack', default='1.5,4.0',
                       help='budget = t^_e2e x a factor uniform in LOW,HIGH')
    sched.add_argument('--budget-basis', choices=('model', 'service'), default='model',
                       help='what the slack factor multiplies: t^_e2e of the calibration, or '
                       'the service time through the server fitted on the capacity sample')
    sched.add_argument('--seed', type=int, default=0)
    sched.add_argument('--n-max', type=int, default=128, help='N_max of every goal, tokens')
    sched.add_argument('--max-prompt-tokens', type=int, default=1024,
                       help='leave longer held-out prompts out of the pool (0 = keep all)')
    sched.add_argument('--capacity-sample', type=int, default=6,
                       help='goals a subset run alone to measure capacity')
    sched.add_argument('--calibration', default='', metavar='YAML',
                       help='use this calibration (timebill profile --out) instead of '
                       'profiling at the start')
    sched.add_argument('--lengths', default='data/rlp/lengths.jsonl',
                       help='measured response lengths of the corpus prompts')
    sched.add_argument('--pool', choices=('test', 'val'), default='test',
                       help='prompts of the traces: the corpus\'s test split (the evaluation) '
                       'or its val split (to tune a parameter such as up@ALPHA on)')
    sched.add_argument('--quick', action='store_true',
                       help='smoke test: subset large, loads 0.8,1.2, 12 goals, 1 repeat, '
                       'methods fifo,up (explicit options still win)')
    sched.add_argument('--from-json', default='', metavar='RAW_JSON',
                       help='only re-make md, png and calibration report of a saved run')
    sched.add_argument('--overrun', choices=('kill', 'skip_next'), default='kill',
                       help='every goal\'s overrun policy: kill (a late goal ends at its '
                       'deadline) or skip_next (a running goal finishes late; goals that come '
                       'due in the queue meanwhile are SKIPPED)')
    sched.add_argument('--allow-fallback', action='store_true',
                       help='run even when the RLP is not built (u_J = N_max for every goal)')
    sched.set_defaults(func=cmd_schedbench)
    from timebill_ros.rlp import cli as rlp_cli
    rlp_cli.add_parser(sub)
    from timebill_ros.latency import cli as latency_cli
    latency_cli.add_parser(sub)
    return parser


def main(argv=None):
    """Entry point of the ``timebill`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, ros_args = _split_ros_args(argv)
    args = build_parser().parse_args(ours)
    return args.func(args, ros_args)


if __name__ == '__main__':
    sys.exit(main())
