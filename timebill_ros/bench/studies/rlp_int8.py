"""The RLP's ONNX file in fp32 and after onnxruntime's dynamic int8 quantization, side by side.

    make predictor
    timebill predictor export --embedding float32 --onnx ~/.cache/timebill_ros/training/\
        HuggingFaceTB--SmolLM2-135M-Instruct__rlp.fp32.onnx
    timebill study rlp_int8 --out benchmarks/results/rlp_int8

Issue 14 asks for a smaller, faster ONNX (172 MB, mostly the 49k x 576 embedding table).
The int8 files are made by ``onnxruntime.quantization.quantize_dynamic`` (int8 weights;
activations quantized at run time; training.export.quantize_int8) from an fp32 export, next to it
(``..._rlp.fp32.int8-<i>.onnx``), in four variants (``VARIANTS``; the last, embedding only, is
what ``make predictor`` ships): MatMul and Gather weights (the embedding table included)
per tensor, the same per channel, MatMul only (the embedding stays fp32) and the embedding
only (the layers stay fp32). All are opened as the server opens its
predictor (``OnnxRlpPredictor.load``, ``predictor.threads``), then:
1. size on disk;
2. accuracy on the RLP's test split (the prompts chat-formatted as the server does): N^ at
   N_max = N_model against the measured length (MAE) and the share of prompts where a
   variant gives the same N^ as fp32;
3. t_Predict at N_p = 32 ... 2048 tokens: the sessions alternate call by call, median of
   ``--repeats`` calls each.
"""

import argparse
import json
import pathlib
import statistics
import time

LENGTHS = (32, 128, 512, 1024, 2048)


# Keyword arguments of training.export.quantize_int8 per variant.
VARIANTS = {'int8': {}, 'int8 per-channel': {'per_channel': True},
            'int8 MatMul only (fp32 embedding)': {'op_types': ['MatMul']},
            'int8 embedding only (fp32 MatMul)': {'op_types': ['Gather']}}


def run(out, repeats):
    """Measure; write DIR/rlp_int8.json and return the data."""
    import numpy as np

    from timebill_ros import params
    from timebill_ros.engine import model_source
    from timebill_ros.engine import LlmEngine
    from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.predictors.contract import default_onnx_path
    from timebill_ros.training.export import quantize_int8
    from timebill_ros.cli.predictor import DEFAULT_LENGTHS
    config = params.config_from_flat({})
    fp32 = default_onnx_path(model_source.model_key(config.engine)).with_suffix('.fp32.onnx')
    if not fp32.is_file():
        raise SystemExit(f'no fp32 RLP at {fp32}: run `make predictor` and then `timebill '
                         f'predictor export --embedding float32 --onnx {fp32}`')
    files, quantize_s = {'fp32': fp32}, {}
    for index, (name, options) in enumerate(VARIANTS.items()):
        files[name] = fp32.with_name(fp32.name.replace('.onnx', f'.int8-{index}.onnx'))
        started = time.perf_counter()
        quantize_int8(fp32, files[name], **options)
        quantize_s[name] = time.perf_counter() - started
    engine = LlmEngine.load(config.engine, config.eviction)
    threads = config.predictor.threads
    predictors = {name: OnnxRlpPredictor.load(path, threads=threads)
                  for name, path in files.items()}
    test = load_examples(DEFAULT_LENGTHS)['test']
    n_model = test[0].n_model
    ids = [engine.encode(e.prompt) for e in test]
    n_hat = {name: [p.predict(e.prompt, x, n_model) for e, x in zip(test, ids)]
             for name, p in predictors.items()}
    truth = [e.n_tokens for e in test]
    rng = np.random.default_rng(0)
    timing = {name: {} for name in predictors}
    for n_p in LENGTHS:
        x = rng.integers(100, 1000, size=n_p)
        for name in predictors:
            timing[name][n_p] = []
        for _ in range(repeats):
            for name, predictor in predictors.items():
                start = time.perf_counter()
                predictor.run(x)
                timing[name][n_p].append(time.perf_counter() - start)
    data = {'threads': threads, 'quantize_s': quantize_s, 'repeats': repeats,
            'size_mb': {name: path.stat().st_size / 1e6 for name, path in files.items()},
            'test_prompts': len(test), 'n_model': n_model, 'truth': truth, 'n_hat': n_hat,
            't_predict_ms': {name: {str(n): 1e3 * statistics.median(v) for n, v in t.items()}
                             for name, t in timing.items()}}
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'rlp_int8.json').write_text(json.dumps(data, indent=1))
    return data


def report(data):
    """Return the markdown of a run."""
    truth = data['truth']

    def mae(values):
        return statistics.mean(abs(a - b) for a, b in zip(values, truth))

    base = data['t_predict_ms']['fp32']
    lines = ['# RLP ONNX: fp32 vs dynamic int8 (issue 14)', '',
             'Command: `timebill study rlp_int8 --out benchmarks/results/rlp_int8`', '',
             'onnxruntime `quantize_dynamic` (QInt8 weights) took '
             + ', '.join(f'{s:.1f} s ({n})' for n, s in data['quantize_s'].items())
             + f'; sessions with {data["threads"]} intra-op thread(s) (predictor.threads); '
             f'{data["test_prompts"]} test-split prompts, N_model {data["n_model"]}; '
             f't_Predict: medians of {data["repeats"]} calls, the files alternating call by '
             'call; in brackets the ratio to fp32.', '',
             '| file | size MB | MAE tokens (test) | same N^ as fp32 | '
             + ' | '.join(f't_Predict ms @{n}' for n in base) + ' |',
             '|---|---|---|---|' + '---|' * len(base)]
    for name, t in data['t_predict_ms'].items():
        same = sum(a == b for a, b in zip(data['n_hat']['fp32'], data['n_hat'][name]))
        lines.append(f'| {name} | {data["size_mb"][name]:.0f} | {mae(data["n_hat"][name]):.1f} '
                     f'| {same}/{len(truth)} | '
                     + ' | '.join(f'{v:.1f} ({v / base[n]:.2f})' for n, v in t.items()) + ' |')
    return '\n'.join(lines) + '\n'


def main():
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='benchmarks/results/rlp_int8')
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--report-only', action='store_true')
    args = parser.parse_args()
    path = pathlib.Path(args.out) / 'rlp_int8.json'
    data = json.loads(path.read_text()) if args.report_only else run(args.out, args.repeats)
    text = report(data)
    (pathlib.Path(args.out) / 'rlp_int8.md').write_text(text)
    print(text)


if __name__ == '__main__':
    main()
