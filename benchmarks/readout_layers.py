"""Does the prefill readout gain from middle layers' states too? (issue 14's 40 % bar).

The server's readout reads the last decoder layer's states pooled over the prompt. This
pools the outputs of more layers the same way (unit-RMS rows, last position and mean), on
the target model's own forward over each whole chat-formatted prompt, and trains the same
readout head (ordinal, B = 64, median, 6 epochs, val picks the epoch) on each layer set,
several seeds each; it prints test MAE / R^2 on the family-held-out split beside the
constant mean's and the 40 % bar. Features are cached beside the server's
(``<cache>/rlp/<model>__layer_features.pt``; ~15 min on 2 cores the first time).

    python benchmarks/readout_layers.py [--layers 30;15,30;8,15,22,30] [--seeds 3] [--out FILE.md]
"""

import argparse
import pathlib
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from timebill_ros.cli import _load_config
from timebill_ros.engine import LlmEngine
from timebill_ros.rlp.dataset import load_examples
from timebill_ros.rlp.metrics import length_metrics
from timebill_ros.rlp.models.base import true_lengths
from timebill_ros.rlp.models.prefill_readout import PrefillReadoutModel
from timebill_ros.rlp.prefill_features import default_features_path, ids_key
from timebill_ros.timing.model import cache_root

LENGTHS = 'data/rlp/lengths_1024.jsonl'
ALL_LAYERS = (8, 15, 22, 30)  # decoder layer outputs kept (1-based; 30 = the last)


def _unit_pool(hidden, eps):
    x = hidden[0].float()
    unit = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return unit[-1], unit.mean(0)


def layer_features(engine, examples, path, log=print):
    """Return prompt id -> {layer: (last, mean)} of the unit-RMS outputs of ALL_LAYERS."""
    cache = torch.load(path, weights_only=True) if path.is_file() else {}
    model, eps = engine.model, engine.model.model.norm.variance_epsilon
    todo = [e for e in examples if e.prompt_id not in cache]
    start = time.perf_counter()
    for index, example in enumerate(todo, 1):
        ids = torch.tensor([engine.encode(example.prompt)])
        with torch.inference_mode():
            out = model.model(input_ids=ids, output_hidden_states=True)
        # hidden_states[k] is the k-th layer's output for k < 30; the last entry is after the
        # final norm, so layer 30 comes from the server's own pooled states instead.
        cache[example.prompt_id] = {
            layer: torch.cat(_unit_pool(out.hidden_states[layer], eps))
            for layer in ALL_LAYERS if layer < len(model.model.layers)}
        if index % 50 == 0 or index == len(todo):
            torch.save(cache, path)
            spent = time.perf_counter() - start
            log(f'{index}/{len(todo)} prompts, {spent:.0f} s, ETA '
                f'{spent / index * (len(todo) - index):.0f} s')
    return cache


class _Weights(nn.Module):
    """Stands in for the final norm: the per-channel weights the readout head learns."""

    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(weight)


def run(layer_sets, seeds, out):
    config = _load_config(None, [])
    engine = LlmEngine.load(config.engine, config.eviction)
    splits = load_examples(LENGTHS, 'family')
    examples = [e for split in splits.values() for e in split]
    root = pathlib.Path(cache_root(config.engine.model_cache_dir or None)) / 'rlp'
    middle = layer_features(engine, examples, root / f'{engine.model_key}__layer_features.pt')
    # Layer 30: the server's own pooled prefill states (timebill predictor readout).
    last = torch.load(default_features_path(engine.model_key, config.engine.model_cache_dir
                                            or None), weights_only=True)
    by_ids = {}
    for example in examples:
        by_ids[example.prompt_id] = last[ids_key(engine.encode(example.prompt),
                                                 engine.forward.name)][0]
    hidden = engine.model.config.hidden_size
    final_w = engine.model.model.norm.weight.detach().float()
    truth = true_lengths(splits['test'])
    constant = float(np.abs(truth - np.mean(true_lengths(splits['train']))).mean())
    lines = ['Regenerate: `python benchmarks/readout_layers.py`', '',
             f'Family view, test {len(truth)} prompts; constant mean MAE {constant:.1f}, '
             f'the 40 % bar {0.4 * constant:.1f} tokens. Mean (sd) over {seeds} seeds.', '',
             '| layers pooled | MAE | R^2 | MAE / constant |', '|---|---|---|---|']
    for layers in layer_sets:
        def feature(pid):
            parts = [by_ids[pid].view(2, hidden) if layer == 30
                     else middle[pid][layer].view(2, hidden) for layer in layers]
            return torch.cat([torch.cat([p[0] for p in parts]),
                              torch.cat([p[1] for p in parts])]).unsqueeze(0)
        features = {e.prompt_id: feature(e.prompt_id) for e in examples}
        weight = torch.cat([final_w if layer == 30 else torch.ones(hidden)
                            for layer in layers])
        maes, r2s = [], []
        for seed in range(seeds):
            target = SimpleNamespace(model=SimpleNamespace(layers=[None] * 30,
                                                           norm=_Weights(weight)))
            model = PrefillReadoutModel(target, features, seed=seed, log=lambda s: None)
            model.fit(splits['train'], splits['val'])
            metrics = length_metrics(truth, model.predict_tokens(splits['test']))
            maes.append(metrics['mae'])
            r2s.append(metrics['r2'])
        name = ','.join(map(str, layers))
        row = (f'| {name} | {statistics.mean(maes):.1f} ({statistics.pstdev(maes):.1f}) | '
               f'{statistics.mean(r2s):.3f} ({statistics.pstdev(r2s):.3f}) | '
               f'{statistics.mean(maes) / constant:.0%} |')
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
