"""One table of several ``timebill enginebench --model`` runs: ours against llama.cpp per file.

    timebill study enginebench_files_table DIR [DIR ...]
    timebill study enginebench_files_table --rounds FILE [FILE ...]

Each DIR holds a run's enginebench.json. Per file: decode ms/token at each KV length and prefill
seconds at each length, ours / llama.cpp (medians of the run's rounds) and their ratio; the
share of the prefill in the weight matrices at the longest length; resident memory after the
load; greedy answers identical to the fp32 reference (ours, llama.cpp). ``--rounds``: the
same medians from the per-round lines a run printed (``decode  timebill gguf  N_kv=  100:
94.8 ms/token``), for a run that ended before writing its JSON.
"""

import argparse
import collections
import json
import pathlib
import re
import statistics

ROUND = re.compile(r'(decode|prefill)\s+(timebill gguf|llama\.cpp \S+)\s+N_(?:kv|x)=\s*(\d+):'
                   r'\s+([\d.]+)')


def _pair(ours, llama, key, n, scale):
    a, b = (statistics.median(row[key][str(n)]) * scale for row in (ours, llama))
    return f'{a:.{1 if scale > 1 else 2}f} / {b:.{1 if scale > 1 else 2}f} ({a / b:.2f})'


def row(data) -> str:
    """Return one file's table row from a run's JSON."""
    rows = {r['name']: r for r in data['rows']}
    ours = rows['timebill gguf']
    llama = next(r for name, r in rows.items() if name.startswith('llama.cpp'))
    kvs = sorted(int(n) for n in ours['decode_s'])
    xs = sorted(int(n) for n in ours['prefill_s'])
    parts = ours.get('prefill_parts', {}).get(str(xs[-1]))
    share = f"{100 * parts['matrices'] / parts['total']:.0f} %" if parts else '-'
    memory = data['meta']['memory']

    def identical(r):
        return f"{sum(a['identical'] for a in r['agreement'])}/{len(r['agreement'])}"
    return (f"| {data['meta']['model']} ({memory['file_mb']:.0f} MiB) | "
            + ' | '.join(_pair(ours, llama, 'decode_s', n, 1e3) for n in kvs) + ' | '
            + ' | '.join(_pair(ours, llama, 'prefill_s', n, 1) for n in xs)
            + f" | {share} | +{memory['after_load_mb'] - memory['before_load_mb']:.0f} "
            f"({memory['after_load_mb']:.0f}) | {identical(ours)} | {identical(llama)} |")


def rounds_lines(path) -> list:
    """Return '<kind> <N>: ours / llama.cpp (ratio) [rounds]' medians of a run's printed rounds."""
    found = collections.defaultdict(list)
    for line in pathlib.Path(path).read_text().splitlines():
        match = ROUND.match(line)
        if match:
            who = 'ours' if match.group(2) == 'timebill gguf' else 'llama'
            found[(match.group(1), int(match.group(3)), who)].append(float(match.group(4)))
    lines = []
    for kind, n in sorted({(k, n) for k, n, _ in found}):
        ours, llama = found[(kind, n, 'ours')], found[(kind, n, 'llama')]
        if ours and llama:
            a, b = statistics.median(ours), statistics.median(llama)
            lines.append(f'{kind} {n}: {a:.2f} / {b:.2f} ({a / b:.2f}) [{len(ours)} rounds]')
    return lines


def main(argv=None) -> int:
    """Print the table of the runs in the given folders."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('dirs', nargs='+', type=pathlib.Path)
    parser.add_argument('--rounds', action='store_true',
                        help="the arguments are logs of a run's printed rounds")
    args = parser.parse_args(argv)
    if args.rounds:
        for path in args.dirs:
            print(f'{path}: ' + '; '.join(rounds_lines(path)))
        return 0
    runs = [json.loads((d / 'enginebench.json').read_text()) for d in args.dirs]
    first = {r['name']: r for r in runs[0]['rows']}['timebill gguf']
    kvs = sorted(int(n) for n in first['decode_s'])
    xs = sorted(int(n) for n in first['prefill_s'])
    decode = [f'decode @{n} KV ms/token: ours / llama.cpp (ratio)' for n in kvs]
    print('| file | ' + ' | '.join(decode) + ' | '
          + ' | '.join(f'prefill {n} tokens (s)' for n in xs)
          + f' | matrices in the {xs[-1]}-token prefill | resident after the load, MiB: '
          'added (in all) | greedy = fp32: ours | llama.cpp |')
    print('|' + '---|' * (len(kvs) + len(xs) + 5))
    for data in runs:
        print(row(data))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
