"""One decoding step's GEMM by weight type: bytes a second against weights a second.

    timebill study decode_types FILE.gguf [FILE.gguf ...] [--threads 2] [--out DIR]
        [--baseline REV | --baseline-cflags FLAGS] [--stream] [--rows M]

For every weight type a file holds, its largest matrix (the token embedding only where the
type has no other), multiplied by one activation row with the kernels' decoding GEMM
(``gemm``, M = 1) on ``--threads`` threads: median ms of 30 calls, the file's bytes read a
second and weights a second. Beside them the machine's copy bandwidth (read + write). A type
whose GB/s sits far below the copy bandwidth while its weights a second match the other
types' is bound by the arithmetic of dequantizing, not by memory. Writes decode_types.json
(every call's seconds) and decode_types.md into --out.

``--rows M`` (M > 1) times the prefill's GEMM (``gemm_tiled``) on M activation rows instead:
a prompt chunk of M tokens (weights a second: the matrix's, not times M).

``--baseline REV``: the kernels of git revision REV built beside this checkout's, each call of
one alternating with a call of the other on the same matrix and activations: the two columns
and their ratio come from one run. ``--stream``: a call multiplies every matrix of the file of
that type and shape (all layers' ffn_gate, ...), more bytes than the L3 cache holds, as a
decoding step reads them; without it one matrix is called again and again, and one of up to
~30 MB may be served by a 32 MiB L3 cache, not by memory.

``--baseline-cflags FLAGS``: the baseline is this checkout's kernels built with FLAGS added
(e.g. ``-mno-avx512vnni`` for the fp32 decoding path, ``-DTB_PF_AHEAD=0 -DTB_PF_LOC=0`` for
the prefetch before 2026-11-29), to time one choice of the source against another.
"""

import argparse
import pathlib
import shlex
import statistics
import time

from timebill_ros.bench.kernel_builds import baseline_kernels
from timebill_ros.bench.rows import saved_or_measured


def matrices(path, stream=False):
    """Return [(tensor name, type name, qtype, [packed blocks], K, N, file bytes)], one a type.

    Each type's largest matrix (the token embedding only where the type has no other); with
    ``stream``, every matrix of the file of that type and shape (a pass reads them all: more
    than the L3 cache holds, as a decoding step streams the weights from memory).
    """
    import numpy as np
    import torch
    from gguf import GGUFReader

    from timebill_ros.engine import kernels
    gemm = kernels.load()
    tensors = [t for t in GGUFReader(str(path)).tensors
               if t.tensor_type.name in kernels.QTYPES and len(t.shape) == 2]
    by_type = {}
    for t in tensors:
        name = t.tensor_type.name
        key = (t.name != 'token_embd.weight', int(t.n_elements))
        if name not in by_type or key > by_type[name][0]:
            by_type[name] = (key, t)
    out = []
    for name, (_, t) in sorted(by_type.items()):
        qtype, k, n = kernels.QTYPES[name], int(t.shape[0]), int(t.shape[1])
        same = [u for u in tensors if stream and u.tensor_type.name == name
                and tuple(u.shape) == tuple(t.shape)] or [t]
        packs = [gemm.pack(torch.from_numpy(np.ascontiguousarray(u.data)), qtype, k)
                 for u in same]
        out.append((t.name, name, qtype, packs, k, n, int(t.data.nbytes)))
    return out


BURST = 5  # calls of one build timed back to back


def measure(path, threads, baseline=None, calls=30, stream=False, n_rows=1):
    """Return [row] of one file: each type's matrix, every call's seconds.

    baseline: another build of the kernels, called alternately with this one on the same
    activation row (its seconds in ``baseline_seconds``). stream: a call is one pass over
    the type's matrices of that shape (``matrices``), its seconds divided by their number.
    n_rows: activation rows a call; more than one calls the prefill GEMM (``gemm_tiled``).
    """
    import torch

    from timebill_ros.engine import kernels
    gemm = kernels.load()
    torch.set_num_threads(threads)
    rows = []
    for tensor, type_name, qtype, packs, k, n, nbytes in matrices(path, stream):
        x = torch.randn(n_rows, k)

        def call(build):
            multiply = build.gemm if n_rows == 1 else build.gemm_tiled
            for packed in packs:
                out = multiply(x, packed, qtype, n, False)
            return out
        builds = [('seconds', gemm)] + ([('baseline_seconds', baseline)] if baseline else [])
        outputs = [call(build) for _, build in builds]  # warm-up
        row = dict(file=pathlib.Path(path).name, tensor=tensor, type=type_name, k=k, n=n,
                   rows=n_rows,
                   bytes=nbytes, matrices=len(packs), **{key: [] for key, _ in builds})
        if baseline:  # the same layout assumed: the two builds' answers side by side
            row['max_abs_difference'] = float((outputs[0] - outputs[1]).abs().max())
            row['max_abs_output'] = float(outputs[1].abs().max())
        for _ in range(calls // BURST):
            for key, build in builds:
                # Each build's pool spins 2 ms after a call (SPIN_US), then sleeps: untimed
                # calls of this build until the other's has gone to sleep, then a burst of
                # timed calls back to back, as a decoding step makes them (a sleep instead
                # halved both builds' speed on the VM: its idle cores wake slowly).
                switched = time.perf_counter()
                while time.perf_counter() - switched < 0.004:
                    call(build)
                for _ in range(BURST):
                    start = time.perf_counter()
                    call(build)
                    row[key].append((time.perf_counter() - start) / len(packs))
        rows.append(row)
        print(f'{pathlib.Path(path).name} {tensor} {type_name} {n}x{k}: '
              f'{statistics.median(row["seconds"]) * 1e3:.3f} ms', flush=True)
    return rows


def table(rows, bandwidth_gbs, baseline=None) -> str:
    """Return the Markdown table of the medians (with the baseline's, when measured)."""
    extra = (f' | ms at {baseline} | ours / {baseline} | largest difference / largest output'
             if baseline else '')
    lines = [f'Copy bandwidth (read + write): {bandwidth_gbs:.1f} GB/s.', '',
             '| file | tensor | type | N x K | matrices a call | bytes a weight | ms a matrix '
             f'(median) | GB/s read | G weights/s{extra} |',
             '|---|---|---|---|---|---|---|---|---|' + ('---|---|---|' if baseline else '')]
    for r in rows:
        seconds, weights = statistics.median(r['seconds']), r['n'] * r['k']
        line = (f'| {r["file"]} | {r["tensor"]} | {r["type"]} | {r["n"]} x {r["k"]} | '
                f'{r.get("matrices", 1)} | {r["bytes"] / weights:.4f} | {seconds * 1e3:.3f} | '
                f'{r["bytes"] / seconds / 1e9:.1f} | {weights / seconds / 1e9:.1f} |')
        if baseline:
            old = statistics.median(r['baseline_seconds'])
            line += (f' {old * 1e3:.3f} | {seconds / old:.2f} | '
                     f'{r["max_abs_difference"] / r["max_abs_output"]:.1e} |')
        lines.append(line)
    return '\n'.join(lines)


def main(argv=None):
    """Measure (or, with ``--report``, re-table) and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('files', nargs='*')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--stream', action='store_true',
                        help="a call: every matrix of the type and shape (beyond the L3 cache)")
    parser.add_argument('--rows', type=int, default=1,
                        help='activation rows a call; > 1 times the prefill GEMM (gemm_tiled)')
    parser.add_argument('--out', default='benchmarks/results/decode_types')
    parser.add_argument('--report', action='store_true',
                        help="only rewrite decode_types.md from --out's decode_types.json")
    group = parser.add_mutually_exclusive_group()
    group.add_argument('--baseline', metavar='REV',
                       help="time git revision REV's kernels beside this checkout's")
    group.add_argument('--baseline-cflags', metavar='FLAGS',
                       help="time this checkout's kernels built with FLAGS beside them")
    args = parser.parse_args(argv)
    label = args.baseline or (f'`{args.baseline_cflags}`' if args.baseline_cflags else None)
    out = pathlib.Path(args.out)

    def measured():
        from timebill_ros.bench.engine import copy_bandwidth_gbs
        from timebill_ros.engine import kernels
        baseline = (baseline_kernels(args.baseline) if args.baseline else
                    kernels.load(extra_cflags=tuple(shlex.split(args.baseline_cflags)))
                    if args.baseline_cflags else None)
        rows = [row for path in args.files for row in measure(
            pathlib.Path(path).expanduser(), args.threads, baseline, stream=args.stream,
            n_rows=args.rows)]
        return dict(threads=args.threads, bandwidth_gbs=copy_bandwidth_gbs(), rows=rows,
                    baseline=label)
    command = ('timebill study decode_types ' + ' '.join(
        pathlib.Path(f).name for f in args.files) + f' --threads {args.threads}'
        + (f' --baseline {args.baseline}' if args.baseline else '')
        + (f" --baseline-cflags='{args.baseline_cflags}'" if args.baseline_cflags else '')
        + (' --stream' if args.stream else '') + (f' --rows {args.rows}' if args.rows > 1 else ''))
    data = saved_or_measured(out / 'decode_types.json', args.report, measured, command)
    n_rows = data['rows'][0].get('rows', 1) if data['rows'] else 1
    gemm = 'decoding GEMM' if n_rows == 1 else f'prefill GEMM on {n_rows} rows'
    text = (f'# The {gemm} by weight type ({data["threads"]} threads)\n\n'
            f'Host {data["host"]} ({data["machine"]}), {data["date"]}; command: '
            f'`{data["command"]}`; raw: decode_types.json; this table: `'
            f'timebill study decode_types --report --out {out}`.\n\n'
            + table(data['rows'], data['bandwidth_gbs'], data.get('baseline')) + '\n')
    (out / 'decode_types.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
