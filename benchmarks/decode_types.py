"""One decoding step's GEMM by weight type: bytes a second against weights a second.

    python benchmarks/decode_types.py FILE.gguf [FILE.gguf ...] [--threads 2] [--out DIR]

For every weight type a file holds, its largest matrix (the token embedding only where the
type has no other), multiplied by one activation row with the kernels' decoding GEMM
(``gemm``, M = 1) on ``--threads`` threads: median ms of 30 calls, the file's bytes read a
second and weights a second. Beside them the machine's copy bandwidth (read + write). A type
whose GB/s sits far below the copy bandwidth while its weights a second match the other
types' is bound by the arithmetic of dequantizing, not by memory. Writes decode_types.json
(every call's seconds) and decode_types.md into --out.
"""

import argparse
import pathlib
import statistics
import time

from timebill_ros.bench.rows import saved_or_measured


def matrices(path):
    """Return [(tensor name, type name, qtype, packed blocks, K, N, file bytes)], one a type."""
    import numpy as np
    import torch
    from gguf import GGUFReader

    from timebill_ros.engine import kernels
    gemm = kernels.load()
    by_type = {}
    for t in GGUFReader(str(path)).tensors:
        name = t.tensor_type.name
        if name not in kernels.QTYPES or len(t.shape) != 2:
            continue
        key = (t.name != 'token_embd.weight', int(t.n_elements))
        if name not in by_type or key > by_type[name][0]:
            by_type[name] = (key, t)
    out = []
    for name, (_, t) in sorted(by_type.items()):
        qtype, k, n = kernels.QTYPES[name], int(t.shape[0]), int(t.shape[1])
        blocks = np.ascontiguousarray(t.data)
        out.append((t.name, name, qtype, gemm.pack(torch.from_numpy(blocks), qtype, k), k, n,
                    blocks.nbytes))
    return out


def measure(path, threads, calls=30):
    """Return [row] of one file: each type's matrix, every call's seconds."""
    import torch

    from timebill_ros.engine import kernels
    gemm = kernels.load()
    torch.set_num_threads(threads)
    rows = []
    for tensor, type_name, qtype, packed, k, n, nbytes in matrices(path):
        x = torch.randn(1, k)
        gemm.gemm(x, packed, qtype, n, False)  # warm-up
        seconds = []
        for _ in range(calls):
            start = time.perf_counter()
            gemm.gemm(x, packed, qtype, n, False)
            seconds.append(time.perf_counter() - start)
        rows.append(dict(file=pathlib.Path(path).name, tensor=tensor, type=type_name, k=k, n=n,
                         bytes=nbytes, seconds=seconds))
        print(f'{pathlib.Path(path).name} {tensor} {type_name} {n}x{k}: '
              f'{statistics.median(seconds) * 1e3:.3f} ms', flush=True)
    return rows


def table(rows, bandwidth_gbs) -> str:
    """Return the Markdown table of the medians."""
    lines = [f'Copy bandwidth (read + write): {bandwidth_gbs:.1f} GB/s.', '',
             '| file | tensor | type | N x K | bytes a weight | ms (median) | GB/s read | '
             'G weights/s |', '|---|---|---|---|---|---|---|---|']
    for r in rows:
        seconds, weights = statistics.median(r['seconds']), r['n'] * r['k']
        lines.append(f'| {r["file"]} | {r["tensor"]} | {r["type"]} | {r["n"]} x {r["k"]} | '
                     f'{r["bytes"] / weights:.4f} | {seconds * 1e3:.3f} | '
                     f'{r["bytes"] / seconds / 1e9:.1f} | {weights / seconds / 1e9:.1f} |')
    return '\n'.join(lines)


def main(argv=None):
    """Measure (or, with ``--report``, re-table) and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('files', nargs='*')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--out', default='benchmarks/results/decode_types')
    parser.add_argument('--report', action='store_true',
                        help="only rewrite decode_types.md from --out's decode_types.json")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)

    def measured():
        from timebill_ros.bench.engine import copy_bandwidth_gbs
        rows = [row for path in args.files for row in measure(
            pathlib.Path(path).expanduser(), args.threads)]
        return dict(threads=args.threads, bandwidth_gbs=copy_bandwidth_gbs(), rows=rows)
    command = ('python benchmarks/decode_types.py ' + ' '.join(
        pathlib.Path(f).name for f in args.files) + f' --threads {args.threads}')
    data = saved_or_measured(out / 'decode_types.json', args.report, measured, command)
    text = (f'# The decoding GEMM by weight type ({data["threads"]} threads)\n\n'
            f'Host {data["host"]} ({data["machine"]}), {data["date"]}; command: '
            f'`{data["command"]}`; raw: decode_types.json; this table: `python '
            f'benchmarks/decode_types.py --report --out {out}`.\n\n'
            + table(data['rows'], data['bandwidth_gbs']) + '\n')
    (out / 'decode_types.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
