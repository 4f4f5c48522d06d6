"""Table 1 for a model's own length predictors, as ``timebill predictor build`` made them.

    timebill study own_predictor --model FILE [--quick DIR] [--out DIR]

On the test split of the model's own collected lengths (prompts no predictor trained on):
the constant mean of the training lengths, the exported RLP (onnxruntime, as the node runs
it, N^ before the prefill) and the exported prefill readout (on the pooled prefill states
kept during collection, N^ after the prefill), each with MAE, RMSE and R^2 in tokens. With
``--quick DIR`` (a copy of the ``--prompts N`` build's ONNX files, taken before the full build
replaced them) the quick build's two predictors are rows too, on the same test prompts. The
build times come from the build log (its ``--- built:`` lines). Writes DIR/<model key>.md.
"""

import argparse
import pathlib
import platform
import sys
import time

import numpy as np


def _rows(model_path, quick_dir, cache_dir=''):
    from timebill_ros.cli.predictor_build import built_on, lengths_path, log_path
    from timebill_ros.predictors.contract import predictor_files
    from timebill_ros.config import EngineConfig, EvictionConfig, ServerConfig
    from timebill_ros.engine import LlmEngine
    from timebill_ros.predictors.onnx_rlp import OnnxRlpPredictor
    from timebill_ros.predictors.prefill_readout import PrefillReadout
    from timebill_ros.training.dataset import load_examples
    from timebill_ros.training.metrics import length_metrics
    from timebill_ros.training.prefill_features import default_features_path, ids_key
    import torch
    config = ServerConfig(engine=EngineConfig(model_path=str(model_path),
                                              model_cache_dir=cache_dir))
    engine = LlmEngine.load(config.engine, EvictionConfig())
    splits = load_examples(lengths_path(config))
    test, train = splits['test'], splits['train']
    truth = np.array([e.n_tokens for e in test], dtype=float)
    n_model = test[0].n_model
    features = torch.load(default_features_path(engine.model_key, cache_dir or None),
                          weights_only=True)
    files = predictor_files(config)
    sets = [('full build', files['RLP'], files['readout'])]
    if quick_dir:
        quick = pathlib.Path(quick_dir)
        sets.append(('quick build', quick / files['RLP'].name, quick / files['readout'].name))
    rows = [(f'constant mean ({len(train)} training prompts)', length_metrics(
        truth, np.full_like(truth, np.mean([e.n_tokens for e in train]))))]
    for label, rlp_path, readout_path in sets:
        rlp = OnnxRlpPredictor.load(rlp_path, provider='cpu')
        pred = [rlp.predict(e.prompt, engine.encode(e.prompt), n_model) for e in test]
        rows.append((f'RLP, {label} ({built_on(rlp_path)} training prompts)',
                     length_metrics(truth, np.array(pred))))
        readout = PrefillReadout.load(readout_path, provider='cpu')
        engine.pool_layers = readout.pool_layers
        pred = []
        for example in test:
            key = ids_key(engine.encode(example.prompt), engine.forward.name, readout.pool_layers)
            pred.append(readout.predict_bounds(features[key], n_model)[0])
        rows.append((f'prefill readout, {label} ({built_on(readout_path)} training prompts)',
                     length_metrics(truth, np.array(pred))))
    log = log_path(config)
    built = [line.split('--- built: ')[1].split('; log')[0]
             for line in (log.read_text().splitlines() if log.is_file() else ())
             if '--- built: ' in line]
    return engine.model_key, len(test), n_model, truth, rows, built


def _table(key, n_test, n_model, truth, rows, built, command):
    lines = [f'# Table 1 for {key}', '',
             f'Command: `{command}`; host {platform.node()} ({platform.machine()}), '
             f'{time.strftime("%Y-%m-%d %H:%M", time.gmtime())} UTC.', '',
             f'Test split: {n_test} prompts the predictors never trained on; their own lengths '
             f'mean {truth.mean():.1f} tokens, {int((truth >= n_model).sum())} at N_model = '
             f'{n_model}.', '',
             '| predictor | MAE (tokens) | RMSE (tokens) | R^2 | MAE / constant |',
             '|---|---|---|---|---|']
    constant = rows[0][1]['mae']
    for name, metrics in rows:
        lines.append(f"| {name} | {metrics['mae']:.1f} | {metrics['rmse']:.1f} | "
                     f"{metrics['r2']:.3f} | {metrics['mae'] / constant:.0%} |")
    lines += ['', 'Build times (the build log, oldest first): '
              + ('; '.join(built) if built else 'none logged')]
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', required=True, help='the .gguf file')
    parser.add_argument('--quick', default='', help='folder with the quick build\'s ONNX files')
    parser.add_argument('--out', default='benchmarks/results/own_predictor')
    parser.add_argument('--cache', default='', help='engine.model_cache_dir (default: the '
                        'user cache)')
    args = parser.parse_args(argv)
    key, n_test, n_model, truth, rows, built = _rows(pathlib.Path(args.model),
                                                     args.quick, args.cache)
    text = _table(key, n_test, n_model, truth, rows, built,
                  'timebill study own_predictor ' + ' '.join(sys.argv[1:]))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f'{key}.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
