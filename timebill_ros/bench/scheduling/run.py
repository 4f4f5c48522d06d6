"""Running the scheduling benchmark: settings, the servers, the traces, and the verb's flags."""

import contextlib
import datetime
import json
import pathlib
import shlex
import statistics
import sys
import tempfile
import time

from timebill_ros.bench.rows import pick, result_fields
from timebill_ros.bench.scheduling.capacity import (CAPACITY_SAMPLE, budget_bases, calibrate,
                                                    calibration_fit_pct, measure_capacity)
from timebill_ros.bench.scheduling.methods import method_params, selected_methods
from timebill_ros.bench.scheduling.metrics import NO_RESULT, cell_metrics
from timebill_ros.bench.scheduling.report import write_outputs
from timebill_ros.bench.scheduling.workload import (DEFAULT_LENGTHS, GOALS, MAX_PROMPT_TOKENS,
                                                    N_MAX, SLACK, SUBSETS, load_pool,
                                                    make_subsets, make_trace,
                                                    predicted_service_s, subset_stats,
                                                    trace_seed)
from timebill_ros.bench.server_process import rotate, start_servers
from timebill_ros.server.overrun import POLICY_CODES
from timebill_ros.server.status import POLICY_KILL

LOADS = (0.5, 0.8, 1.0, 1.2)
REPEATS = 2
QUICK = {'subsets': ('large',), 'loads': (0.8, 1.2), 'goals': 12, 'repeats': 1,
         'methods': ('fifo', 'up')}
RESULT_GRACE_S = 120.0  # beyond the longest budget of a trace, seconds
# The result columns of a goal row, as they read when the goal got no result.
NO_RESULT_FIELDS = {'status': NO_RESULT, 'status_name': 'NO_RESULT', 'deadline_met': False,
                    'total_s': 0.0, 'queue_s': 0.0, 'prefill_s': 0.0, 'decode_s': 0.0,
                    'response_tokens': 0, 'predicted_tokens': 0, 'uncertainty_tokens': 0,
                    'eviction_ratio': 0.0, 'executor': '', 'schedule_s': None,
                    'batch_size': 0, 'predict_s': 0.0, 'at_admission': False,
                    'infeasible': False}


def _resolve(args):
    """Return the run's settings: explicit options, else --quick's, else the defaults."""
    quick = bool(getattr(args, 'quick', False))

    def option(value, name, default):
        if value not in (None, ''):
            return value
        return QUICK[name] if quick else default

    def floats(text):
        return tuple(float(x) for x in text.split(',')) if isinstance(text, str) else text

    subsets = option(args.subsets, 'subsets', SUBSETS)
    subsets = tuple(s.strip() for s in subsets.split(',')) if isinstance(subsets, str) \
        else tuple(subsets)
    slack = floats(args.slack) if args.slack else SLACK
    if len(slack) != 2 or not 0 < slack[0] <= slack[1]:
        raise ValueError(f'--slack needs two factors 0 < low <= high, got {args.slack!r}')
    return {'subsets': tuple(s for s in SUBSETS if s in subsets),
            'loads': floats(option(args.loads, 'loads', LOADS)),
            'goals': int(option(args.goals, 'goals', GOALS)),
            'repeats': int(option(args.repeats, 'repeats', REPEATS)),
            'methods': selected_methods(option(args.methods, 'methods', ())),
            'slack': slack}


def missing_predictor(config=None):
    """Return why the servers would run without the RLP (text), or None when it is there."""
    from timebill_ros import params
    from timebill_ros.predictors.contract import predictor_files
    config = config or params.config_from_flat({})
    if config.predictor.kind != 'rlp':
        return None
    path = predictor_files(config)['RLP']
    if path.expanduser().is_file():
        return None
    return f'no RLP at {path} (make predictor builds it)'


def goal_row(result, info):
    """Return one goal's row: ``info`` (the trace's columns) and its result's columns.

    ``result`` None (not accepted, or no result in time): NO_RESULT_FIELDS, and ``info``'s
    message. ``at_admission``: N^ was predicted while the goal queued (its run reused it).
    """
    row = dict(info)
    if result is None:
        row.update(NO_RESULT_FIELDS)
        return row
    fields = result_fields(result)
    fields['at_admission'] = fields['predictor'].endswith('(at admission)')
    row.update(pick(fields, (*NO_RESULT_FIELDS, 'message')))
    return row


def play_trace(client, goals, n_max=N_MAX, policy=POLICY_KILL):
    """Send ``goals`` ([{prompt, arrival_s, budget_s}]) at their arrival times; wait for all.

    Returns [(sent_s, Instruct.Result or None, note)] in the order of ``goals``; sent_s is
    the send time relative to the trace's start. Under Kill a result comes by the longest
    budget; under Skip-Next a running goal finishes late, so a result may take up to the sum
    of the budgets.
    """
    from timebill_ros.ros.client import make_goal
    handles = []
    start = time.monotonic()
    for goal in goals:
        time.sleep(max(0.0, start + goal['arrival_s'] - time.monotonic()))
        sent_s = time.monotonic() - start
        handles.append((sent_s, client.send(make_goal(
            goal['prompt'], budget_s=goal['budget_s'], max_new_tokens=n_max, policy=policy))))
    timeout_s = max(g['budget_s'] for g in goals) + RESULT_GRACE_S
    if policy != POLICY_KILL:
        timeout_s += sum(g['budget_s'] for g in goals)
    out = []
    for sent_s, handle in handles:
        if handle is None or not handle.accepted:
            out.append((sent_s, None, 'not accepted'))
            continue
        try:
            result, _ = client.result(handle, timeout_s=timeout_s)
        except TimeoutError as exc:
            out.append((sent_s, None, str(exc)))
            continue
        out.append((sent_s, result, ''))
    return out


def _runnable(methods, progress):
    """Return (runnable [(name, server parameters)], skipped {name: why}, notes {name: note})."""
    runnable, skipped, notes = [], {}, {}
    for name, flat in methods:
        server_flat, note = method_params(name, flat)
        if server_flat is None:
            progress(f'method {name} skipped: the server refuses its parameters {flat}: {note}')
            skipped[name] = f'parameters {flat} refused: {note}'
            continue
        if note:
            progress(f'method {name}: {note}')
            notes[name] = note
        runnable.append((name, server_flat))
        if server_flat.get('offload.enabled'):
            notes[name] = ('a second executor (offload.device / offload.threads) that also '
                           'takes the other executor\'s goals while that one is busy: more '
                           'capacity than the single-executor capacity the loads refer to.')
    return runnable, skipped, notes


def run_schedbench(args, progress=print, argv=None):
    """Run the benchmark; write its outputs under ``args.out``.

    With ``args.from_json`` only re-make the md, png and calibration report of a saved run.
    """
    out_dir = pathlib.Path(args.out)
    if args.from_json:
        data = json.loads(pathlib.Path(args.from_json).read_text())
        write_outputs(data, out_dir, progress)
        return 0
    argv = sys.argv[1:] if argv is None else argv
    started = time.monotonic()
    settings = _resolve(args)
    n_max = args.n_max
    pool = load_pool(args.lengths, settings['goals'], args.max_prompt_tokens,
                     split=getattr(args, 'pool', 'test'))
    subsets = make_subsets(pool, settings['goals'], args.seed, settings['subsets'])
    runnable, skipped, notes = _runnable(settings['methods'], progress)
    if not runnable:
        progress('no method can run')
        return 1
    missing = missing_predictor()
    if missing and not getattr(args, 'allow_fallback', False):
        progress(f'{missing}; without it every u_J is N_max and the uncertainty-aware methods '
                 'have nothing to go on (--allow-fallback runs anyway)')
        return 2

    from timebill_ros.timing.profiler import format_report
    batches = any(flat.get('scheduler.consolidation') or flat.get('scheduler.continuous')
                  for _, flat in runnable)
    calibration = calibrate(args.calibration, n_max, progress, batches)
    out_dir.mkdir(parents=True, exist_ok=True)
    calibration.save(out_dir / 'calibration.yaml')  # for --calibration of a later run
    coefficients = calibration.coefficients
    predicted = {name: [predicted_service_s(coefficients, e.n_prompt_tokens, e.n_tokens, n_max)
                        for e in items] for name, items in subsets.items()}
    meta = {'command': 'timebill ' + shlex.join(argv),
            'started': datetime.datetime.now().isoformat(timespec='seconds'),
            'seed': args.seed, 'goals': settings['goals'], 'loads': list(settings['loads']),
            'repeats': settings['repeats'], 'slack': list(settings['slack']), 'n_max': n_max,
            'max_prompt_tokens': args.max_prompt_tokens, 'budget_basis': args.budget_basis,
            'overrun': getattr(args, 'overrun', 'kill'),
            'pool': f'{len(pool)} held-out prompts ('
                    + ', '.join(f'{s} {sum(e.split == s for e in pool)}'
                                for s in ('test', 'val') if any(e.split == s for e in pool))
                    + f'), N_x <= {args.max_prompt_tokens or "any"}',
            'methods': [m[0] for m in runnable], 'skipped': skipped, 'notes': notes,
            'capacity_sample': args.capacity_sample,
            'calibration_report': format_report(calibration),
            'calibration_fit_pct': calibration_fit_pct(calibration),
            'subsets': {name: {'stats': subset_stats(items),
                               'predicted_mean_s': statistics.mean(predicted[name]),
                               'prompt_ids': [e.prompt_id for e in items]}
                        for name, items in subsets.items()}}
    for name, sub in meta['subsets'].items():
        st = sub['stats']
        progress(f'subset {name}: N mean {st["mean"]:.1f} sd {st["std"]:.1f} '
                 f'({st["min"]}-{st["max"]}), t^_e2e mean {sub["predicted_mean_s"]:.2f} s')
    rows, lags = [], []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        log_dir = out_dir / 'logs'
        log_dir.mkdir(parents=True, exist_ok=True)
        # Room for a whole trace: no goal is refused for queue depth.
        queue = {'queue.max_depth': max(16, settings['goals'])}
        clients = start_servers(servers, [(name, {**queue, **flat}) for name, flat in runnable],
                                calibration, tmp, n_max, log_dir, 'timebill_sched', progress)
        capacity_name, capacity_client = next(
            ((n, c) for n, c in clients if n == 'fifo'), clients[0])
        meta['capacity_method'] = capacity_name
        turn = 0
        for subset, items in subsets.items():
            progress(f'capacity of subset {subset} (on the {capacity_name} server)')
            capacity = measure_capacity(capacity_client, items, predicted[subset],
                                        args.capacity_sample, n_max, progress)
            meta['subsets'][subset]['capacity'] = capacity
            progress(f'  capacity {capacity["capacity_per_s"]:.3f} goals/s (service ~ '
                     f'{capacity["scale"]:.2f} t^_e2e + {capacity["overhead_s"]:.2f} s)')
            median = meta['subsets'][subset]['stats']['median']
            bases = budget_bases(predicted[subset], capacity, args.budget_basis)
            for repeat in range(settings['repeats']):
                for load in settings['loads']:
                    trace = make_trace(items, bases,
                                       load * capacity['capacity_per_s'], settings['slack'],
                                       trace_seed(args.seed, subset, repeat))
                    goals = [dict(g, prompt=items[g['index']].prompt) for g in trace]
                    for name, client in rotate(clients, turn):
                        progress(f'{subset} load {load:.2f} repeat {repeat} {name}: '
                                 f'{len(goals)} goals over {trace[-1]["arrival_s"]:.0f} s')
                        for goal, (sent_s, result, note) in zip(
                                goals, play_trace(client, goals, n_max,
                                                  POLICY_CODES[meta['overrun']])):
                            e = items[goal['index']]
                            lags.append(sent_s - goal['arrival_s'])
                            rows.append(goal_row(result, {
                                'subset': subset, 'load': load, 'repeat': repeat,
                                'method': name, 'prompt_id': e.prompt_id,
                                'category': e.category, 'n_x': e.n_prompt_tokens,
                                'n_tokens': e.n_tokens, 'short': e.n_tokens < median,
                                'predicted_s': predicted[subset][goal['index']],
                                'slack': goal['slack'], 'budget_s': goal['budget_s'],
                                'arrival_s': goal['arrival_s'], 'sent_s': sent_s,
                                'message': note}))
                        m = cell_metrics(rows[-len(goals):])
                        progress(f'  miss rate {m["miss_rate"]:.2f}, completed '
                                 f'{m["completed"]}/{m["goals"]}, resp mean (all) '
                                 f'{m["resp_mean_all"] or 0:.2f} s, makespan '
                                 f'{m["makespan_s"]:.0f} s')
                    turn += 1
    meta['send_lag_max_s'] = max(lags, default=None)
    meta['runtime_s'] = time.monotonic() - started
    write_outputs({'meta': meta, 'rows': rows}, out_dir, progress)
    return 0


def add_arguments(parser):
    """Add the flags of ``timebill schedbench`` to the argparse ``parser``."""
    parser.add_argument('--out', default='benchmarks/results/sched')
    parser.add_argument('--methods', default='',
                        help='comma list of fifo,edf,luf,muf,slack,up,up-1thread,up+offload, '
                        'up+consolidation,rt-lm,fifo+consolidation,fifo+continuous, and '
                        'up@ALPHA (up with scheduler.up_alpha ALPHA) (default all but '
                        'up@ALPHA)')
    parser.add_argument('--subsets', default='', help='comma list of small,medium,large '
                        '(default all)')
    parser.add_argument('--loads', default='',
                        help='offered loads x capacity, comma list (default 0.5,0.8,1.0,1.2)')
    parser.add_argument('--goals', type=int, default=None, help='goals a subset (default 24)')
    parser.add_argument('--repeats', type=int, default=None,
                        help='traces a cell, each with its own seed (default 2)')
    parser.add_argument('--slack', default='1.5,4.0',
                        help='budget = t^_e2e x a factor uniform in LOW,HIGH')
    parser.add_argument('--budget-basis', choices=('model', 'service'), default='model',
                        help='what the slack factor multiplies: t^_e2e of the calibration, or '
                        'the service time through the server fitted on the capacity sample')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--n-max', type=int, default=N_MAX, help='N_max of every goal, tokens')
    parser.add_argument('--max-prompt-tokens', type=int, default=MAX_PROMPT_TOKENS,
                        help='leave longer held-out prompts out of the pool (0 = keep all)')
    parser.add_argument('--capacity-sample', type=int, default=CAPACITY_SAMPLE,
                        help='goals a subset run alone to measure capacity')
    parser.add_argument('--calibration', default='', metavar='YAML',
                        help='use this calibration (timebill profile --out) instead of '
                        'profiling at the start')
    parser.add_argument('--lengths', default=DEFAULT_LENGTHS,
                        help='measured response lengths of the corpus prompts')
    parser.add_argument('--pool', choices=('test', 'val'), default='test',
                        help='prompts of the traces: the corpus\'s test split (the evaluation) '
                        'or its val split (to tune a parameter such as up@ALPHA on)')
    parser.add_argument('--quick', action='store_true',
                        help='smoke test: subset large, loads 0.8,1.2, 12 goals, 1 repeat, '
                        'methods fifo,up (explicit options still win)')
    parser.add_argument('--from-json', default='', metavar='RAW_JSON',
                        help='only re-make md, png and calibration report of a saved run')
    parser.add_argument('--overrun', choices=('kill', 'skip_next'), default='kill',
                        help='every goal\'s overrun policy: kill (a late goal ends at its '
                        'deadline) or skip_next (a running goal finishes late; goals that come '
                        'due in the queue meanwhile are SKIPPED)')
    parser.add_argument('--allow-fallback', action='store_true',
                        help='run even when the RLP is not built (u_J = N_max for every goal)')
