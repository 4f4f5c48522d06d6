"""Does the prefill readout gain from middle layers' states? (issue 14's 40 % bar).

The engine pools the outputs of layers 8, 15, 22 and 30 over each whole chat-formatted
prompt during its own prefill (engine.forward.HiddenPool, as the server's readout reads
them); the same readout head (ordinal, B = 64, median, 6 epochs, val picks the epoch) is
trained on each layer set, with several seeds each, and scored on the family-held-out test
split beside the constant mean and the 40 % bar. The features are cached with the server's
(training/prefill_features.py; ~15 min on 2 cores the first time).

    timebill study readout_layers [--layers "30;22,30;15,30;8,15,22,30"] [--seeds 3]
        [--out FILE.md]
"""

import argparse
import pathlib
import statistics

import numpy as np

from timebill_ros.params import load_config
from timebill_ros.engine import LlmEngine
from timebill_ros.training.dataset import load_examples
from timebill_ros.training.metrics import length_metrics
from timebill_ros.training.heads.base import true_lengths
from timebill_ros.training.heads.prefill_readout import PrefillReadoutModel
from timebill_ros.training.prefill_features import default_features_path, prefill_features
from timebill_ros.training.target import final_norm_weight

LENGTHS = 'data/rlp/lengths_1024.jsonl'
ALL_LAYERS = (8, 15, 22, 30)  # decoder layers pooled once (1-based; 30 = the last)


def _subset(pooled, layers, hidden):
    """Cut the [last x ALL_LAYERS, mean x ALL_LAYERS] states down to ``layers``."""
    rows = pooled.view(2, len(ALL_LAYERS), hidden)
    keep = [ALL_LAYERS.index(n) for n in layers]
    return rows[:, keep].reshape(1, -1)


def run(layer_sets, seeds, out):
    config = load_config(None, [])
    engine = LlmEngine.load(config.engine, config.eviction)
    splits = load_examples(LENGTHS, 'family')
    examples = [e for split in splits.values() for e in split]
    pooled = prefill_features(engine, examples, default_features_path(
        engine.model_key, config.engine.model_cache_dir or None), layers=ALL_LAYERS)
    hidden = engine.model.config.hidden_size
    truth = true_lengths(splits['test'])
    constant = float(np.abs(truth - np.mean(true_lengths(splits['train']))).mean())
    lines = ['Regenerate: `timebill study readout_layers`', '',
             f'Family view, test {len(truth)} prompts; constant mean MAE {constant:.1f}, '
             f'the 40 % bar {0.4 * constant:.1f} tokens. Mean (sd) over {seeds} seeds.', '',
             '| layers pooled | MAE | R^2 | MAE / constant |', '|---|---|---|---|']
    for layers in layer_sets:
        features = {pid: _subset(states, layers, hidden) for pid, states in pooled.items()}
        maes, r2s = [], []
        for seed in range(seeds):
            model = PrefillReadoutModel(final_norm_weight(engine), engine.n_layers, features,
                                        seed=seed, pool_layers=layers, log=lambda line: None)
            model.fit(splits['train'], splits['val'])
            metrics = length_metrics(truth, model.predict_tokens(splits['test']))
            maes.append(metrics['mae'])
            r2s.append(metrics['r2'])
        row = (f'| {",".join(map(str, layers))} | {statistics.mean(maes):.1f} '
               f'({statistics.pstdev(maes):.1f}) | {statistics.mean(r2s):.3f} '
               f'({statistics.pstdev(r2s):.3f}) | {statistics.mean(maes) / constant:.0%} |')
        print(row, flush=True)
        lines.append(row)
    text = '\n'.join(lines) + '\n'
    print(text)
    if out:
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(out).write_text(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--layers', default='30;22,30;15,30;8,15,22,30',
                        help='layer sets, ;-separated, each a comma list of 8/15/22/30')
    parser.add_argument('--seeds', type=int, default=3)
    parser.add_argument('--out', default='')
    args = parser.parse_args()
    sets = [tuple(int(x) for x in part.split(',')) for part in args.layers.split(';')]
    for layers in sets:
        if not set(layers) <= set(ALL_LAYERS):
            raise ValueError(f'layers must be among {ALL_LAYERS}, got {layers!r}')
    run(sets, args.seeds, args.out)


if __name__ == '__main__':
    main()
