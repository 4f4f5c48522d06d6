"""``timebill latency measure|report|wcet``: latency grid, predictor report, WCET check."""

import dataclasses
import os

DEFAULT_OUT = 'benchmarks/results/latency'


def _engine(args):
    from timebill_ros.params import load_config
    from timebill_ros.engine import LlmEngine
    from timebill_ros.server.backends.local import resolved_engine
    config = load_config(args.params, args.set)
    engine = LlmEngine.load(config.engine, config.eviction)
    return resolved_engine(config, engine), engine


def cmd_measure(args, ros_args):
    """Measure the latency grid on the server's engine; write grid.json and grid.csv."""
    from timebill_ros.timing.design import GridDesign
    from timebill_ros.latency.harness import measure_grid
    from timebill_ros.timing.profiler import key_fields
    from timebill_ros.timing.model import now_iso
    config, engine = _engine(args)
    design = GridDesign()
    model_key, device, dtype, threads = key_fields(config.engine)
    meta = {'model_key': model_key, 'device': device, 'dtype': dtype, 'threads': threads,
            'created': now_iso(), 'design': {
                'id_n_in': design.id_n_in, 'heldout_n_in': design.heldout_n_in,
                'id_n_out': design.id_n_out, 'heldout_n_out': design.heldout_n_out,
                'probe_n_out': design.probe_n_out}}
    grid = measure_grid(engine, design.n_in_values, design.n_out_max, repeats=args.repeats,
                        cooldown_s=args.cooldown, seed=args.seed, meta=meta, progress=print)
    os.makedirs(args.out, exist_ok=True)
    grid.save(os.path.join(args.out, 'grid.json'))
    grid.save_csv(os.path.join(args.out, 'grid.csv'), design.n_out_values)
    print(f'saved {args.out}/grid.json and grid.csv ({grid.meta["wall_s"]:.0f} s)')
    return 0


def add_parser(sub):
    """Add the ``latency`` command and its subcommands to ``sub``."""
    parser = sub.add_parser('latency', help=__doc__)
    lsub = parser.add_subparsers(dest='latency_command', required=True)
    meas = lsub.add_parser('measure', help=cmd_measure.__doc__)
    meas.add_argument('--params', help='ROS 2 params YAML for the engine settings')
    meas.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE')
    meas.add_argument('--out', default=DEFAULT_OUT)
    meas.add_argument('--repeats', type=int, default=3)
    meas.add_argument('--cooldown', type=float, default=2.0, help='seconds before each run')
    meas.add_argument('--seed', type=int, default=0, help='seed of the measuring order')
    meas.set_defaults(func=cmd_measure)
    add_report_parsers(lsub)


def _calibrations(items):
    """Return {name: Calibration} from NAME=PATH items."""
    from timebill_ros.timing.model import Calibration
    out = {}
    for item in items:
        name, sep, path = item.partition('=')
        if not sep or not name or not path:
            raise SystemExit(f'--calibration expects NAME=PATH, got {item!r}')
        out[name] = Calibration.load(path)
    return out


def _hardware(grid_path, grid, config):
    """Return the grid's recorded Hardware, measuring (and recording) it when absent."""
    from timebill_ros.latency.grid import LatencyGrid
    from timebill_ros.latency.hardware import Hardware, measure_hardware
    from timebill_ros.engine import DTYPES
    if 'hardware' not in grid.meta:
        hw = measure_hardware(config.engine.device, DTYPES[config.engine.dtype])
        grid = LatencyGrid(grid.runs, {**grid.meta, 'hardware': dataclasses.asdict(hw)})
        grid.save(grid_path)
        print(f'measured hardware ({hw.measure_s:.1f} s), recorded in {grid_path}')
    return grid, Hardware(**grid.meta['hardware'])


def cmd_report(args, ros_args):
    """Score every predictor on a measured grid; write report.md/json and latency.png."""
    import torch
    from timebill_ros.engine import model_source
    from timebill_ros.params import load_config
    from timebill_ros.latency import report
    from timebill_ros.timing.design import GridDesign
    from timebill_ros.latency.grid import LatencyGrid
    from timebill_ros.latency.estimators.roofline import Architecture
    from timebill_ros.engine import DTYPES
    config = load_config(args.params, args.set)
    grid_path = os.path.join(args.out, 'grid.json')
    grid, hardware = _hardware(grid_path, LatencyGrid.load(grid_path), config)
    design = GridDesign(**{k: tuple(v) for k, v in grid.meta['design'].items()})
    value_bytes = torch.empty((), dtype=DTYPES[config.engine.dtype]).element_size()
    arch = Architecture.from_model_dir(model_source.resolve_model_dir(config.engine),
                                       value_bytes)
    data = report.build(grid, design, arch, hardware, _calibrations(args.calibration))
    print(report.write(data, design, args.out))
    report.plot(data, grid, design, arch, hardware, os.path.join(args.out, 'latency.png'))
    print(f'wrote {args.out}/report.md, report.json, latency.png')
    return 0


def cmd_wcet(args, ros_args):
    """Run held-out RLP prompts; print the share of goals over t^_WCET per k and calibration."""
    import json
    from timebill_ros.bench.timebill import rlp_test_prompts
    from timebill_ros.server.backends.local import build_predictor
    from timebill_ros.latency.wcet import exceed_table, run_goals, time_ratios
    config, engine = _engine(args)
    calibrations = _calibrations(args.calibration)
    if not calibrations:
        raise SystemExit('give at least one --calibration NAME=PATH')
    first = next(iter(calibrations.values()))
    predictor = build_predictor(config, engine, first.coefficients)
    goals = run_goals(engine, predictor, rlp_test_prompts(args.prompts), args.n_max,
                      progress=print)
    tables = {name: exceed_table(goals, cal.coefficients, args.n_max)
              for name, cal in calibrations.items()}
    lines = [f'{len(goals)} goals, N_max {args.n_max}, predictor {predictor.name}; cells: share '
             'of goals whose actual time exceeded t^_WCET (share with N > N^_W)', '',
             '| k | ' + ' | '.join(tables) + ' |', '|---|' + '---|' * len(tables)]
    for k in next(iter(tables.values())):
        cells = [f'{t[k][0]:.2f} ({t[k][1]:.2f})' for t in tables.values()]
        lines.append(f'| {k} | ' + ' | '.join(cells) + ' |')
    ratios = [time_ratios(goals, cal.coefficients) for cal in calibrations.values()]
    lines.append('| actual / t^_e2e(N_x, actual N): mean, p90, max | ' + ' | '.join(
        f'{m:.3f}, {p:.3f}, {x:.3f}' for m, p, x in ratios) + ' |')
    text = '\n'.join(lines) + '\n'
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, 'wcet.md'), 'w', encoding='utf-8') as stream:
        stream.write(text)
    with open(os.path.join(args.out, 'wcet_goals.json'), 'w', encoding='utf-8') as stream:
        json.dump({'n_max': args.n_max, 'predictor': predictor.name,
                   'calibrations': {n: c.coefficients.as_dict() for n, c in calibrations.items()},
                   'goals': [dataclasses.asdict(g) for g in goals]}, stream, indent=1)
    return 0


def _engine_args(parser):
    parser.add_argument('--params', help='ROS 2 params YAML for the engine settings')
    parser.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE')
    parser.add_argument('--out', default=DEFAULT_OUT)
    parser.add_argument('--calibration', action='append', default=[], metavar='NAME=PATH',
                        help='a calibration YAML to score (repeatable)')


def add_report_parsers(lsub):
    """Add ``report`` and ``wcet`` to the latency subcommands."""
    rep = lsub.add_parser('report', help=cmd_report.__doc__)
    _engine_args(rep)
    rep.set_defaults(func=cmd_report)
    wcet = lsub.add_parser('wcet', help=cmd_wcet.__doc__)
    _engine_args(wcet)
    wcet.add_argument('--prompts', type=int, default=32, help='held-out RLP test prompts')
    wcet.add_argument('--n-max', type=int, default=128, help='N_max of every goal, tokens')
    wcet.set_defaults(func=cmd_wcet)
