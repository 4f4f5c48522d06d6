"""``timebill bench``, ``enginebench``, ``schedbench``, ``prefixbench``: the benchmarks.

Each benchmark's flags live beside it (``add_arguments`` in ``timebill_ros.bench.timebill``,
``.engine`` and ``.scheduling.run``).
"""


def cmd_enginebench(args, ros_args):
    """Decode / prefill speed and greedy agreement of each engine format, side by side."""
    from timebill_ros.bench.engine import run_enginebench
    return run_enginebench(args)


def cmd_schedbench(args, ros_args):
    """Scheduling policies (RT-LM) under Poisson load with deadlines, through the real node."""
    from timebill_ros.bench.scheduling.run import run_schedbench
    return run_schedbench(args)


def cmd_prefixbench(args, ros_args):
    """Follow-up questions over a shared context with and without prefix reuse."""
    from timebill_ros.bench.prefix import run_prefixbench
    return run_prefixbench(args)


def cmd_remotebench(args, ros_args):
    """Compare the node on a remote engine (llama.cpp, loopback) with client-side timeouts."""
    from timebill_ros.bench.remote import run_remotebench
    return run_remotebench(args)


def cmd_bench(args, ros_args):
    """Run the TimeBill benchmark through the real node."""
    from timebill_ros.bench.timebill import run_bench
    if args.breakdown:
        return _print_breakdown(args.breakdown)
    if args.report:  # only rewrite a run's tables, whichever workload made it
        return _report(args.report)
    if getattr(args, 'repeats', None):  # robot-context runs side by side
        from timebill_ros.bench.robot_repeats import report
        report(args.repeats, args.out)
        return 0
    if args.workload == 'robot-context':
        from timebill_ros.bench.robot_bench import run_robot_bench
        return run_robot_bench(args)
    return run_bench(args)


def _report(raw_path):
    """Rewrite the tables of the run whose raw rows are ``raw_path`` (either workload)."""
    import json
    import pathlib
    raw = json.loads(pathlib.Path(raw_path).read_text(encoding='utf-8'))
    if 'vanilla' in raw:  # a robot-context run (robot_bench_raw.json, robot_bench_k_raw.json)
        from timebill_ros.bench.robot_bench import report_from
        return report_from(raw_path)
    from timebill_ros.bench.reports import prompt_bench_report
    return prompt_bench_report(raw_path)


def _print_breakdown(raw_path):
    import json
    from timebill_ros.bench.timebill import breakdown_lines, predictor_breakdown
    table = predictor_breakdown(json.loads(open(raw_path, encoding='utf-8').read()))
    print('\n'.join(breakdown_lines(table)))
    return 0


def add_parser(sub):
    """Add the ``bench``, ``enginebench``, ``schedbench``, ``prefixbench``, ``remotebench``."""
    from timebill_ros.bench import engine, prefix, remote, robot_bench, timebill
    from timebill_ros.bench.scheduling import run as scheduling
    for name, func, module in (('bench', cmd_bench, timebill),
                               ('enginebench', cmd_enginebench, engine),
                               ('schedbench', cmd_schedbench, scheduling),
                               ('prefixbench', cmd_prefixbench, prefix),
                               ('remotebench', cmd_remotebench, remote)):
        parser = sub.add_parser(name, help=func.__doc__)
        module.add_arguments(parser)
        if name == 'bench':  # the robot-context workload's own flags
            robot_bench.add_arguments(parser)
        parser.set_defaults(func=func)
