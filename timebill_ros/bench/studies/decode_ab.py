"""The engine's decoding of a GGUF file on this checkout's kernels against another revision's.

    timebill study decode_ab FILE.gguf --baseline REV [--kv 100 1000] [--rounds 6]
        [--steps 32] [--threads 2] [--rope-direct] [--out DIR] [--report]

One engine loads the file once. Each round, for each N_kv, prefills N_kv random tokens and
decodes ``--steps`` tokens greedily, once on this checkout's kernels and once on REV's (every
engine object's ``kernels`` switched: bench/kernel_builds.py), the order alternating round by
round: the two columns and their ratio come from one run, on the whole step as a goal runs it
(the weights streamed from memory, where bench/studies/decode_types.py times one matrix that
the L3 cache may hold). Also counts the steps where both builds chose the same token. Writes
decode_ab.json (every round) and decode_ab.md into --out.

``--rope-direct``: a third column, this checkout's kernels with each step computing its RoPE
rows (torch's cos / sin: an OpenMP region a step) instead of looking them up in the decoder's
tables (engine/models/rope_table.py), in the same rounds.

Every build's ``decoder_step`` calls are timed too (one a layer a step; ~1 us of Python
each, alike in every build): a second table sets each build's first layer beside the median
of its other layers (a step that opens an OpenMP region pays for it there).
"""

import argparse
import pathlib
import statistics
import time

from timebill_ros.bench.kernel_builds import baseline_kernels, use_kernels
from timebill_ros.bench.rows import saved_or_measured


ROPE_DIRECT = 'ours, RoPE computed a step'


class LayerTimes:
    """A kernels module whose ``decoder_step`` calls (one a layer a step) are timed."""

    def __init__(self, module):
        """Time ``module``'s decoder_step; every other attribute is the module's."""
        self.module, self.seconds = module, []

    def __getattr__(self, name):
        """Return the module's attribute ``name``."""
        return getattr(self.module, name)

    def decoder_step(self, *args):
        """Run and time one layer of a decoding step."""
        start = time.perf_counter()
        out = self.module.decoder_step(*args)
        self.seconds.append(time.perf_counter() - start)
        return out

    def per_layer(self, n_layers: int) -> list:
        """Return each layer's median seconds over the steps timed (then forget them)."""
        steps = len(self.seconds) // n_layers
        times = [statistics.median(self.seconds[i::n_layers][:steps]) for i in range(n_layers)]
        self.seconds = []
        return times


def measure(path, baseline_rev, kvs, rounds, steps, threads, rope_direct=False):
    """Return [row]: one a (round, N_kv, build), ms/token and the greedy tokens."""
    import torch

    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine, kernels
    from timebill_ros.engine.models import GgufDecoder
    from timebill_ros.engine.stopping import StopCriteria
    torch.manual_seed(0)
    engine = LlmEngine.load(EngineConfig(model_path=str(path), threads=threads),
                            EvictionConfig())
    decoder = engine.forward
    if not isinstance(decoder, GgufDecoder):
        raise ValueError(f'{path}: not served by the GGUF decoder')
    tables = decoder.rope.tables
    # name -> (kernels, RoPE tables: the decoder's, or None: computed in each step)
    builds = {'ours': (LayerTimes(kernels.load()), tables),
              baseline_rev: (LayerTimes(baseline_kernels(baseline_rev)), tables)}
    if rope_direct:
        builds[ROPE_DIRECT] = (builds['ours'][0], None)
    rows = []
    for round_idx in range(rounds + 1):  # round 0: warm-up, not kept
        for n_kv in kvs:
            ids = engine.random_ids(n_kv)
            names = list(builds) if round_idx % 2 else list(builds)[::-1]
            for name in names:
                module, decoder.rope.tables = builds[name]
                if not use_kernels(engine.forward, module):
                    raise ValueError(f'{path}: no kernels to switch (not a GGUF forward?)')
                state = engine.prefill(list(ids), StopCriteria())
                out = engine.decode(state, steps + 1, StopCriteria(),
                                    on_tokens=lambda n, text: None, feedback_every=4)
                per_token = out.decode_s / (len(out.token_ids) - 1)
                print(f'round {round_idx} N_kv={n_kv} {name}: {per_token * 1e3:.1f} ms/token',
                      flush=True)
                if round_idx:
                    rows.append(dict(round=round_idx, n_kv=n_kv, build=name,
                                     s_per_token=per_token, tokens=list(out.token_ids),
                                     layer_s=module.per_layer(decoder.n_layers)))
                module.seconds = []
    use_kernels(engine.forward, builds['ours'][0].module)
    decoder.rope.tables = tables
    return rows


def table(data) -> str:
    """Return the Markdown table: medians of ms/token per N_kv and build, ours over each."""
    others = [name for name in data.get('builds', ['ours', data['baseline']]) if name != 'ours']
    head = f'| N_kv | ours ms/token (median of {data["rounds"]}) |'
    rule = '|---|---|'
    for name in others:
        head += (f' {name} ms/token | ours / {name} | rounds ours faster | same greedy token '
                 'as ours, steps |')
        rule += '---|---|---|---|'
    lines = [head, rule]
    for n_kv in data['kvs']:
        by = {name: {r['round']: r for r in data['rows']
                     if r['n_kv'] == n_kv and r['build'] == name} for name in ['ours'] + others}
        ours = statistics.median(r['s_per_token'] for r in by['ours'].values())
        line = f'| {n_kv} | {ours * 1e3:.1f} |'
        for name in others:
            other = statistics.median(r['s_per_token'] for r in by[name].values())
            faster = sum(by['ours'][k]['s_per_token'] < by[name][k]['s_per_token']
                         for k in by['ours'])
            same = sum(a == b for k in by['ours']
                       for a, b in zip(by['ours'][k]['tokens'], by[name][k]['tokens']))
            total = sum(len(r['tokens']) for r in by['ours'].values())
            line += (f' {other * 1e3:.1f} | {ours / other:.3f} | {faster} of {len(by["ours"])}'
                     f' | {same} of {total} |')
        lines.append(line)
    if all('layer_s' in row for row in data['rows']):
        lines += ['', layer_table(data, ['ours'] + others)]
    return '\n'.join(lines)


def layer_table(data, builds) -> str:
    """Return the Markdown table of each build's first decoder layer against its others.

    Per round, each layer's median ``decoder_step`` call over the round's steps; the table
    gives the medians over rounds of the first layer's and of the other layers' median.
    """
    lines = ['One layer\'s `decoder_step` call, ms (median over the rounds of each round\'s '
             'median over its steps):', '',
             '| N_kv | build | first layer | the other layers (median) |', '|---|---|---|---|']
    for n_kv in data['kvs']:
        for name in builds:
            rows = [r for r in data['rows'] if r['n_kv'] == n_kv and r['build'] == name]
            first = statistics.median(r['layer_s'][0] for r in rows)
            rest = statistics.median(statistics.median(r['layer_s'][1:]) for r in rows)
            lines.append(f'| {n_kv} | {name} | {first * 1e3:.2f} | {rest * 1e3:.2f} |')
    return '\n'.join(lines)


def main(argv=None):
    """Measure (or, with ``--report``, re-table) and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('file', nargs='?')
    parser.add_argument('--baseline', metavar='REV', help='the git revision compared')
    parser.add_argument('--kv', type=int, nargs='+', default=[100, 1000])
    parser.add_argument('--rounds', type=int, default=6)
    parser.add_argument('--steps', type=int, default=32)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--rope-direct', action='store_true',
                        help='also time steps that compute their RoPE rows (no tables)')
    parser.add_argument('--out', default='benchmarks/results/decode_ab')
    parser.add_argument('--report', action='store_true',
                        help="only rewrite decode_ab.md from --out's decode_ab.json")
    args = parser.parse_args(argv)
    if not args.report and not (args.file and args.baseline):
        parser.error('FILE and --baseline are needed to measure')
    out = pathlib.Path(args.out)

    def measured():
        path = pathlib.Path(args.file).expanduser()
        rows = measure(path, args.baseline, args.kv, args.rounds, args.steps, args.threads,
                       args.rope_direct)
        return dict(file=path.name, baseline=args.baseline, kvs=args.kv, rounds=args.rounds,
                    steps=args.steps, threads=args.threads,
                    builds=list(dict.fromkeys(row['build'] for row in rows)), rows=rows)
    command = (f'timebill study decode_ab {pathlib.Path(args.file or "").name} '
               f'--baseline {args.baseline} --kv {" ".join(map(str, args.kv))} '
               f'--rounds {args.rounds} --steps {args.steps} --threads {args.threads}'
               + (' --rope-direct' if args.rope_direct else ''))
    data = saved_or_measured(out / 'decode_ab.json', args.report, measured, command)
    text = (f'# Decoding {data["file"]}: this revision\'s kernels against {data["baseline"]}\'s '
            f'({data["threads"]} threads, {data["steps"]} tokens a round)\n\n'
            f'Host {data["host"]} ({data["machine"]}), {data["date"]}; command: '
            f'`{data["command"]}`; raw: decode_ab.json; this table: `'
            f'timebill study decode_ab --report --out {out}`.\n\n' + table(data) + '\n')
    (out / 'decode_ab.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
