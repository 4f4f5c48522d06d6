"""``timebill bench``: TimeBill vs Vanilla vs fixed eviction ratios, through the real node.

Protocol (after TimeBill Sec. 6.4, adapted to one CPU): a prompt set of varied lengths is
released as a periodic job stream. Each job's budget T is a fraction (``BUDGET_FRACTIONS``) of
that prompt's Vanilla estimate t^_e2e(N_x, alpha=0, N_max) from the calibrated time model;
the next job is released at the previous job's deadline, so an overrun under Skip-Next makes
the next jobs come due while it runs (they end SKIPPED). Each method has its own server
process (``timebill serve``, ``budget.mode`` / ``budget.fixed_alpha`` and its
``METHOD_PARAMS``); all run at once and each job stream runs on every method in turn, so a
drift of the machine's speed hits all methods alike.
The time model is calibrated afresh (start-up grid) at the start of the run and shared by all
servers, so budgets and alpha* use the machine's speed of the moment.
Score: ROUGE-L F1 of each response against the full-cache answer (Vanilla, no deadline);
jobs that do not complete score 0, as in the paper. Every method runs under Kill, Skip-Next
and Partial (the anytime policy: a truncated answer delivered on time is scored as it is).
``timebill`` predicts as the server does by default (predictor.kind=rlp: N^ read from the
goal's own prefill by the readout head, the RLP for nothing else here), ``timebill-rlp`` with
the RLP beside the prefill instead (``predictor.prefill_readout`` off; the same when no
readout is built), ``timebill-fallback`` the same pipeline with N^ = N_max; the fixed-ratio
methods run no predictor (as in the paper).
``--prompt-set rlp-test`` takes held-out prompts of the RLP corpus (test split) instead of the
robot prompt set, so the RLP is scored on prompts it never trained on.
"""

import contextlib
import functools
import json
import pathlib
import tempfile
import time

from timebill_ros import prompts
from timebill_ros.bench.rows import pick, result_fields
from timebill_ros.bench.server_process import rotate, start_servers
from timebill_ros.config import EngineConfig, ServerConfig
from timebill_ros.server.status import (COMPLETED, POLICY_KILL, POLICY_PARTIAL,
                                        POLICY_SKIP_NEXT)

BUDGET_FRACTIONS = (0.9, 1.0, 1.1, 1.25)
# (name, budget.mode, budget.fixed_alpha, predictor.kind)
METHODS = (('vanilla', 'fixed', 0.0, 'fallback'), ('alpha=0.25', 'fixed', 0.25, 'fallback'),
           ('alpha=0.5', 'fixed', 0.5, 'fallback'), ('alpha=0.75', 'fixed', 0.75, 'fallback'),
           ('alpha=0.95', 'fixed', 0.95, 'fallback'), ('timebill', 'timebill', 0.0, 'rlp'),
           ('timebill-fallback', 'timebill', 0.0, 'fallback'),
           ('timebill-fixed', 'timebill', 0.0, 'rlp'), ('timebill-clamp', 'timebill', 0.0, 'rlp'),
           ('timebill-rlp', 'timebill', 0.0, 'rlp'), ('timebill-online', 'timebill', 0.0, 'rlp'),
           ('timebill-online-prefill', 'timebill', 0.0, 'rlp'),
           ('timebill-online-decode', 'timebill', 0.0, 'rlp'))
# Server parameters of a method beyond its budget mode and predictor. ``timebill-fixed``
# decides as the server did before issue 9: the calibration as it is (no speed factor, no
# learned margin), no admission control and the paper's clamp of alpha* to alpha_max; it
# shows what the self-correcting model changes. ``timebill-clamp``: the self-correcting model
# with the paper's clamp (no EXPECTED fallback, alpha_max when nothing fits), to show what
# the two rules for goals that do not fit change. ``timebill-online``: alpha re-decided every
# ONLINE_CHECKPOINT_TOKENS tokens while the answer decodes (timing/checkpoint.py), with the
# server's default predictor; ``timebill-online-prefill`` / ``-decode``: the same with the
# decode readout off / on (what it adds; rows before 2026-11-30 08:40 UTC had it on by default,
# so their ``timebill-online`` read it).
ONLINE_CHECKPOINT_TOKENS = 16
PAPER_CLAMP = {'budget.expected_fallback': False, 'budget.keep_cache_when_hopeless': False}
METHOD_PARAMS = {'timebill-fixed': {'timing.online': False, 'admission.policy': 'none',
                                    **PAPER_CLAMP},
                 'timebill-clamp': PAPER_CLAMP,
                 'timebill-rlp': {'predictor.prefill_readout': False},
                 'timebill-online': {'budget.checkpoint_tokens': ONLINE_CHECKPOINT_TOKENS},
                 'timebill-online-prefill': {'budget.checkpoint_tokens': ONLINE_CHECKPOINT_TOKENS,
                                             'predictor.decode_readout': False},
                 'timebill-online-decode': {'budget.checkpoint_tokens': ONLINE_CHECKPOINT_TOKENS,
                                            'predictor.decode_readout': True}}
POLICIES = (('kill', POLICY_KILL), ('skip_next', POLICY_SKIP_NEXT),
            ('partial', POLICY_PARTIAL))
N_MAX = 48
RLP_TEST_PROMPTS = 8


def server_flat(method):
    """Return the server parameters of a METHODS entry beyond what every server gets."""
    name, mode, fixed_alpha, kind = method
    return {'budget.mode': mode, 'budget.fixed_alpha': fixed_alpha, 'predictor.kind': kind,
            **METHOD_PARAMS.get(name, {})}


def _rouge_l_scorer():
    """Return f(reference, candidate) -> ROUGE-L F1, with one scorer built for all calls."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(['rougeL'])
    return lambda reference, candidate: scorer.score(reference, candidate)['rougeL'].fmeasure


IDLE_POLL_S = 0.005  # how often an idle-eliding stream looks for the last result, s


def _stream(client, items, policy_code, n_max, elide_idle=False):
    """Release jobs periodically; return their results in order.

    elide_idle: when every job released so far has its result before the next release (the
    server is idle), release the next one at once and move the rest of the schedule up by
    the gap. The server sees the same jobs with the same budgets; only the wall time in
    which it had nothing to do goes.
    """
    from timebill_ros.ros.client import make_goal
    handles = []
    release = time.monotonic()
    for _, prompt, budget_s in items:
        while time.monotonic() < release:
            if elide_idle and all(client.finished(handle) for handle in handles):
                release = time.monotonic()
                break
            time.sleep(min(IDLE_POLL_S, max(0.0, release - time.monotonic())))
        goal = make_goal(prompt, budget_s=budget_s, max_new_tokens=n_max, policy=policy_code)
        handles.append(client.send(goal))
        release += budget_s
    return [client.result(handle, timeout_s=600.0)[0] for handle in handles]


# The columns of a job's row taken from its result as they are (its own: method, policy,
# fraction, prompt, budget_s; alpha = eviction_ratio; decided: a WCET was estimated).
RESULT_COLUMNS = ('prompt_tokens', 'predicted_tokens', 'response_tokens', 'predictor',
                  'deadline_met', 'truncated', 'message', 'prefill_s', 'decode_s', 'total_s')


def _row(name, policy, fraction, pname, budget_s, res):
    fields = result_fields(res)
    return {'method': name, 'policy': policy, 'fraction': fraction, 'prompt': pname,
            'budget_s': budget_s, 'status': fields['status'], 'response': fields['response'],
            'alpha': fields['eviction_ratio'], 'decided': fields['predicted_wcet_s'] > 0,
            **pick(fields, RESULT_COLUMNS)}


def _run_interleaved(clients, items_by_fraction, n_max):
    """Run every budget fraction under every policy, the methods' streams interleaved.

    clients: [(method name, client)]. Each (fraction, policy) stream runs on every method's
    server one after the other, the order rotated from stream to stream, so that the
    machine's drift (10-30 % within minutes on a shared machine) hits every method alike.
    Returns one row per job.
    """
    rows, turn = [], 0
    for fraction, items in items_by_fraction.items():
        for policy, code in POLICIES:
            order = rotate(clients, turn)
            turn += 1
            for name, client in order:
                for (pname, _, budget_s), res in zip(items,
                                                     _stream(client, items, code, n_max)):
                    rows.append(_row(name, policy, fraction, pname, budget_s, res))
                    print(f'  {name:15s} {policy:9s} T={fraction:.2f}x {pname:8s} '
                          f'N_x={res.prompt_tokens:5d} status={res.status} '
                          f'alpha={res.eviction_ratio:.2f}', flush=True)
    return rows


def _references(client, prompt_set, n_max):
    """Full-cache answers (Vanilla, generous deadline) used as ROUGE-L references."""
    from timebill_ros.ros.client import make_goal
    refs = {}
    for name, prompt in prompt_set:
        result, _ = client.run(make_goal(prompt, budget_s=600.0, max_new_tokens=n_max))
        refs[name] = result.response
    return refs


def _budgets(prompt_set, coefficients, engine, n_max, fractions=BUDGET_FRACTIONS):
    """Return {fraction: [(name, prompt, T seconds)]} from the Vanilla t^_e2e at N_max."""
    out = {}
    for fraction in fractions:
        out[fraction] = []
        for name, prompt in prompt_set:
            n_x = len(engine.encode(prompt))
            t_e2e = coefficients.prefill_s(n_x) + coefficients.decode_phase_s(n_x, 0.0, n_max)
            out[fraction].append((name, prompt, round(fraction * t_e2e, 3)))
    return out


def summarize(rows, refs):
    """Return [{method, policy, fraction, completion_rate, misses, rouge_l}] aggregated."""
    rouge_l = _rouge_l_scorer()
    groups = {}
    for row in rows:
        key = (row['method'], row['policy'], row['fraction'])
        groups.setdefault(key, []).append(row)
    table = []
    for (method, policy, fraction), items in groups.items():
        done = [r for r in items if r['status'] == COMPLETED and r['deadline_met']]
        scores = [rouge_l(refs[r['prompt']], r['response']) if r in done else 0.0
                  for r in items]
        decided = [r['alpha'] for r in items if r['decided']]
        table.append({'method': method, 'policy': policy, 'fraction': fraction,
                      'completion_rate': len(done) / len(items),
                      'misses': len(items) - len(done),
                      'rouge_l': sum(scores) / len(scores),
                      'mean_alpha': sum(decided) / len(decided) if decided else 0.0})
    return table


def write_report(table, out_dir, calibration_report):
    """Write results.md and results.png under out_dir."""
    lines = ['| policy | T / t^_e2e(vanilla) | method | completion rate | misses | '
             'ROUGE-L | mean alpha* (jobs that ran) |', '|---|---|---|---|---|---|---|']
    for r in sorted(table, key=lambda r: (r['policy'], r['fraction'], r['method'])):
        lines.append(f"| {r['policy']} | {r['fraction']:.2f} | {r['method']} | "
                     f"{r['completion_rate']:.2f} | {r['misses']} | {r['rouge_l']:.3f} | "
                     f"{r['mean_alpha']:.2f} |")
    text = '\n'.join(lines) + '\n\nTime model (ETE) fit:\n```\n' + calibration_report + '\n```\n'
    (out_dir / 'bench.md').write_text(text)
    _plot(table, out_dir / 'bench.png')
    return text


def _plot(table, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(POLICIES), figsize=(5 * len(POLICIES), 7), sharex=True)
    for col, (policy, _) in enumerate(POLICIES):
        for name, *_ in METHODS:
            pts = sorted((r['fraction'], r['completion_rate'], r['rouge_l']) for r in table
                         if r['method'] == name and r['policy'] == policy)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            axes[0][col].plot(xs, [p[1] for p in pts], marker='o', label=name)
            axes[1][col].plot(xs, [p[2] for p in pts], marker='o', label=name)
        axes[0][col].set_title(f'{policy}: completion rate')
        axes[1][col].set_title(f'{policy}: ROUGE-L vs full-cache answer')
        axes[1][col].set_xlabel('budget T / vanilla t^_e2e')
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def _selected_methods(names):
    if not names:
        return METHODS
    wanted = [n.strip() for n in names.split(',')]
    unknown = sorted(set(wanted) - {m[0] for m in METHODS})
    if unknown:
        raise ValueError(f'unknown method(s) {unknown}; known: {[m[0] for m in METHODS]}')
    # Vanilla first: its server also produces the full-cache reference answers.
    return [m for m in METHODS if m[0] in wanted or m[0] == 'vanilla']


def rlp_test_prompts(n=RLP_TEST_PROMPTS):
    """Return [(prompt_id, prompt)]: ``n`` test-split corpus prompts, one per category first.

    Deterministic: categories in corpus order, the first test prompt of each, then the
    second of each, ... until ``n``.
    """
    from timebill_ros.training.corpus import build_corpus
    by_category = {}
    for item in build_corpus():
        if item.split == 'test':
            by_category.setdefault(item.category, []).append(item)
    out, rank = [], 0
    while len(out) < n and any(len(v) > rank for v in by_category.values()):
        out += [(v[rank].prompt_id, v[rank].prompt) for v in by_category.values()
                if len(v) > rank][:n - len(out)]
        rank += 1
    return out


def _prompt_set(args):
    if args.prompt_set == 'rlp-test':
        return rlp_test_prompts(args.prompts or RLP_TEST_PROMPTS)
    return prompts.benchmark_prompts(quick=args.quick)


def fresh_calibration(n_max, prefill_dtype='auto', model_path=''):
    """Return (engine, calibration): the served engine and a start-up grid fit taken now.

    Taken in the same machine state as the runs (shared machines drift), it serves the
    benchmark process and every server it starts. prefill_dtype: ``engine.prefill_dtype`` of
    the engine it times (the servers' own). model_path: the GGUF file served ('' the
    embedded model).
    """
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.profiler import profile, startup_grid
    config = ServerConfig(engine=EngineConfig(max_new_tokens=n_max, prefill_dtype=prefill_dtype,
                                              model_path=model_path))
    engine = LlmEngine.load(config.engine, config.eviction)
    return engine, profile(engine, startup_grid(engine.context_tokens), progress=print)


def run_bench(args):
    """Run the benchmark; write bench.md, bench.png and bench_raw.json under args.out."""
    from timebill_ros.timing.profiler import format_report
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_max = args.n_max
    engine, calibration = fresh_calibration(n_max)
    prompt_set = _prompt_set(args)
    fractions = tuple(float(f) for f in args.fractions.split(',')) if args.fractions \
        else BUDGET_FRACTIONS
    items = _budgets(prompt_set, calibration.coefficients, engine, n_max, fractions)
    del engine
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        # Every method's server runs at once (an idle server takes no compute), so that
        # the streams of all methods can be interleaved.
        methods = [(m[0], server_flat(m)) for m in _selected_methods(args.methods)]
        clients = start_servers(servers, methods, calibration, tmp, n_max, tmp,
                                'timebill_bench', functools.partial(print, flush=True))
        refs = _references(dict(clients)['vanilla'], prompt_set, n_max)
        rows = _run_interleaved(clients, items, n_max)
    table = summarize(rows, refs)
    (out_dir / 'bench_raw.json').write_text(json.dumps({'rows': rows, 'refs': refs}, indent=1))
    print(write_report(table, out_dir, format_report(calibration)))
    return 0


def predictor_breakdown(raw, method='timebill', baseline='timebill-fallback', n_max=None):
    """Compare two methods job by job, split by whether ``method`` predicted N^ < N_max.

    raw: the ``bench_raw.json`` dict. Returns {group: {jobs, rouge_l, done, alpha}} with each
    value a (method, baseline) pair; groups ``short`` (N^ < N_max: the RLP changed alpha*) and
    ``n_max`` (N^ = N_max: both decided alike, differences are timing).
    """
    rouge_l = _rouge_l_scorer()
    refs = raw['refs']

    def key(row):
        return row['policy'], row['fraction'], row['prompt']

    ours = {key(r): r for r in raw['rows'] if r['method'] == method}
    base = {key(r): r for r in raw['rows'] if r['method'] == baseline}
    n_max = n_max or max(r['predicted_tokens'] for r in base.values())

    def done(row):
        return row['status'] == COMPLETED and row['deadline_met']

    def score(row):
        return rouge_l(refs[row['prompt']], row['response']) if done(row) else 0.0

    out = {}
    for group in ('short', 'n_max'):
        keys = [k for k, r in ours.items() if k in base
                and (r['predicted_tokens'] < n_max) == (group == 'short')]
        if not keys:
            continue
        out[group] = {'jobs': len(keys)}
        for name, fn in (('rouge_l', score), ('done', done), ('alpha', lambda r: r['alpha'])):
            out[group][name] = tuple(sum(fn(rows[k]) for k in keys) / len(keys)
                                     for rows in (ours, base))
    return out


def breakdown_lines(table):
    """Return the Markdown table of :func:`predictor_breakdown`'s groups, line by line."""
    lines = ['| jobs | N^ | ROUGE-L rlp / fallback | on time rlp / fallback | '
             'mean alpha* rlp / fallback |', '|---|---|---|---|---|']
    for group, row in table.items():
        label = 'N^ < N_max' if group == 'short' else 'N^ = N_max'
        lines.append(f"| {row['jobs']} | {label} | {row['rouge_l'][0]:.3f} / "
                     f"{row['rouge_l'][1]:.3f} | {row['done'][0]:.2f} / {row['done'][1]:.2f} | "
                     f"{row['alpha'][0]:.2f} / {row['alpha'][1]:.2f} |")
    return lines


def add_arguments(parser):
    """Add the flags of ``timebill bench`` to the argparse ``parser``."""
    parser.add_argument('--out', default='benchmarks/results')
    parser.add_argument('--workload', choices=('prompts', 'robot-context'), default='prompts',
                        help='prompts: a periodic stream of the prompt set (below); '
                        'robot-context: questions over warm long contexts (bench/robot_bench.py)')
    parser.add_argument('--quick', action='store_true', help='fewer prompts')
    parser.add_argument('--prompt-set', choices=('robot', 'rlp-test'), default='robot',
                        help='robot prompts, or held-out test prompts of the RLP corpus')
    parser.add_argument('--n-max', type=int, default=48, help='N_max of every goal, tokens')
    parser.add_argument('--fractions', default='',
                        help='comma list of budget fractions T / t^_e2e (default 0.9,1,1.1,1.25)')
    parser.add_argument('--breakdown', metavar='RAW_JSON',
                        help='only print the RLP-vs-fallback breakdown of a bench_raw.json')
    parser.add_argument('--prompts', type=int, default=0,
                        help='with --prompt-set rlp-test: how many held-out prompts')
    parser.add_argument('--methods', default='',
                        help='comma list of methods (vanilla is always run); default all')
