"""Prefill on a GGUF file: the GEMM on the blocks, against a dequantized copy and llama.cpp.

    timebill study prefill_gemm FILE.gguf [FILE.gguf ...] [--tokens 128 512 2048]
        [--rounds 3] [--threads 2] [--out DIR]

For each file, in one process, rounds interleaved: ``engine.prefill`` of N random tokens from
an empty cache with the fp32 prefill on the blocks (``gemm_tiled``, models/weights.py:
TILED_PREFILL = True) and with each matrix dequantized into an fp32 copy for torch's GEMM
(TILED_PREFILL = False, the prefill before issue 59), and llama.cpp's ``eval`` of N random
tokens on the same file with the same threads. Prints medians and the ratios side by side;
writes prefill_gemm.json (every round's seconds) and prefill_gemm.md into --out.
"""

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import sys


def _engine(path, threads):
    from timebill_ros.config import EngineConfig, EvictionConfig
    from timebill_ros.engine import LlmEngine
    return LlmEngine.load(EngineConfig(model_path=str(path), threads=threads,
                                       prefill_dtype='float32'), EvictionConfig())


def measure(path, tokens, rounds, threads, say=print):
    """Return {row: {n_tokens: [seconds a round]}} of one file."""
    import torch

    from timebill_ros.bench.llama_cpp import LlamaCppEngine
    from timebill_ros.engine.models import weights
    from timebill_ros.timing.probes import EngineProbes
    engine = EngineProbes(_engine(path, threads))
    llama = LlamaCppEngine(threads, max(tokens) + 16, path)
    rows = {'blocks (gemm_tiled)': {}, 'dequantized copy': {}, 'llama.cpp': {}}
    with torch.inference_mode():
        engine.measure_prefill_s(min(tokens))  # warm-up: first-call costs out of the rounds
        for n in tokens:
            for _ in range(rounds):
                for name, tiled in (('blocks (gemm_tiled)', True), ('dequantized copy', False)):
                    weights.TILED_PREFILL = tiled
                    rows[name].setdefault(n, []).append(engine.measure_prefill_s(n))
                weights.TILED_PREFILL = True
                rows['llama.cpp'].setdefault(n, []).append(llama.prefill_s(n))
                say(f'{path.name} N={n}: ' + ', '.join(
                    f'{name} {times[n][-1]:.3f} s' for name, times in rows.items()))
    return rows


def table(results):
    """Return the Markdown table of every file's medians and ratios."""
    lines = ['| file | N tokens | on the blocks (s) | dequantized copy (s) | llama.cpp (s) | '
             'blocks / copy | blocks / llama.cpp |', '|---|---|---|---|---|---|---|']
    for name, rows in results.items():
        for n in rows['llama.cpp']:
            blocks, copy, llama = (statistics.median(rows[r][n]) for r in (
                'blocks (gemm_tiled)', 'dequantized copy', 'llama.cpp'))
            lines.append(f'| {name} | {n} | {blocks:.3f} | {copy:.3f} | {llama:.3f} | '
                         f'{blocks / copy:.2f} | {blocks / llama:.2f} |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('files', nargs='+', type=pathlib.Path)
    parser.add_argument('--tokens', type=int, nargs='+', default=[128, 512, 2048])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--out', type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    results = {path.name: measure(path, args.tokens, args.rounds, args.threads)
               for path in args.files}
    text = table(results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        command = 'timebill study prefill_gemm ' + ' '.join(
            sys.argv[1:] if argv is None else argv)
        meta = {'command': command, 'host': platform.node(),
                'date': datetime.datetime.now().isoformat(timespec='seconds'),
                'threads': args.threads, 'rounds': args.rounds}
        (args.out / 'prefill_gemm.json').write_text(json.dumps(
            {'meta': meta, 'results': results}, indent=1))
        (args.out / 'prefill_gemm.md').write_text(
            f"# Prefill GEMM\n\nCommand: `{command}`; host {meta['host']}, {meta['date']}, "
            f"{args.threads} threads, medians of {args.rounds} interleaved rounds.\n\n"
            + text + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
