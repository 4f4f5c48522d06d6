"""RT-LM's offload threshold tau (Eq. 4): the k-quantile of predicted lengths on training data.

Computed once per predictor file, quantile and N_max, and cached as JSON beside the ONNX file
(``<file>.tau.json``), since it costs one prediction per training prompt (~50 ms each here).
"""

import json
import pathlib

import numpy as np

MAX_PROMPTS = 200  # a deterministic sample of the training split is enough for a quantile


def _train_prompts(max_prompts):
    """Return up to ``max_prompts`` training-split prompts of the RLP corpus, spread evenly."""
    from timebill_ros.rlp.corpus import build_corpus
    prompts = [item.prompt for item in build_corpus() if item.split == 'train']
    step = max(1, len(prompts) // max_prompts)
    return prompts[::step][:max_prompts]


def offload_threshold(predictor, encode, quantile, n_max, model_file=None, log=print,
                      max_prompts=MAX_PROMPTS):
    """Return tau, tokens: the ``quantile`` of N^ over the predictor's training prompts.

    predictor: a LengthPredictor. encode(prompt) -> input_ids (the server's chat template).
    n_max: the N_max the predictions are capped at, tokens. model_file: the predictor's
    file; tau is cached beside it (None: not cached).
    """
    if not 0 < quantile < 1:
        raise ValueError(f'quantile must be in (0, 1), got {quantile!r}')
    if getattr(predictor, 'name', '').startswith('fallback'):
        log('offload threshold: the fallback predictor says N_max for every goal, so no '
            'goal is offloaded by its uncertainty (tau = infinity)')
        return float('inf')
    cache, stamp = None, None
    if model_file is not None and pathlib.Path(model_file).is_file():
        stat = pathlib.Path(model_file).stat()
        cache = pathlib.Path(f'{model_file}.tau.json')
        stamp = {'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns, 'quantile': quantile,
                 'n_max': n_max, 'max_prompts': max_prompts}
        try:
            saved = json.loads(cache.read_text())
            if saved.get('stamp') == stamp:
                return float(saved['tau_tokens'])
        except (OSError, ValueError, KeyError):
            pass
    prompts = _train_prompts(max_prompts)
    lengths = [predictor.predict(p, encode(p), n_max) for p in prompts]
    tau = float(np.quantile(lengths, quantile))
    log(f'offload threshold tau = {tau:.0f} tokens ({quantile:.2f}-quantile of N^ over '
        f'{len(prompts)} training prompts)')
    if cache is not None:
        try:
            cache.write_text(json.dumps({'stamp': stamp, 'tau_tokens': tau,
                                         'n_prompts': len(prompts)}))
        except OSError as exc:
            log(f'warning: could not cache tau at {cache}: {exc}')
    return tau
