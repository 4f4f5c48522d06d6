"""RT-LM's offload threshold tau (Eq. 4): the k-quantile of predicted lengths on training data.

The predictions are made once, when the RLP is exported (``timebill predictor train
--export``, :func:`timebill_ros.training.export.export_train_lengths`), and stored beside the
ONNX file as ``<file>.lengths.json``: N^ of each of a fixed sample of training prompts, read
without an N_max (``null`` where the RLP says its top bucket, ">= N_model"). At start-up the
server only caps them at its N_max and takes the quantile: no corpus, no model work.
"""

import json
import math
import pathlib

import numpy as np

MAX_PROMPTS = 200  # a deterministic sample of the training split is enough for a quantile


def lengths_path(model_file) -> pathlib.Path:
    """Return the file of the training predictions stored beside ``model_file``."""
    return pathlib.Path(f'{model_file}.lengths.json')


def _stamp(model_file) -> dict:
    """Return what ties a lengths file to its ONNX file: its size and mtime."""
    stat = pathlib.Path(model_file).stat()
    return {'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def write_train_lengths(model_file, lengths) -> pathlib.Path:
    """Store N^ of the training sample (tokens; None = the top bucket) beside ``model_file``."""
    lengths = [None if n is None or math.isinf(n) else int(n) for n in lengths]
    if not lengths:
        raise ValueError('need at least one training prediction')
    path = lengths_path(model_file)
    path.write_text(json.dumps({'stamp': _stamp(model_file), 'n_hat_tokens': lengths}))
    return path


def read_train_lengths(model_file):
    """Return the stored N^ list of ``model_file`` (None = top bucket).

    ValueError when the file is stale (made for another ONNX file) or malformed.
    """
    path = lengths_path(model_file)
    saved = json.loads(path.read_text())
    if not isinstance(saved, dict):
        raise ValueError(f'{path} holds a {type(saved).__name__}, not an object')
    if saved.get('stamp') != _stamp(model_file):
        raise ValueError(f'{path} was made for another version of {model_file}')
    lengths = saved.get('n_hat_tokens')
    if (not isinstance(lengths, list) or not lengths
            or any(n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0)
                   for n in lengths)):
        raise ValueError(f'{path}: n_hat_tokens must be a non-empty list of token counts '
                         '(or null)')
    return lengths


def offload_threshold(predictor, quantile, n_max, model_file=None, log=print):
    """Return tau, tokens: the ``quantile`` of N^ (capped at ``n_max``) over training prompts.

    predictor: the LengthPredictor the server runs. model_file: its ONNX file, beside which
    the export stored the training predictions. Without them (fallback predictor, no file,
    missing or stale predictions) tau is infinity: no goal is offloaded by its uncertainty.
    """
    if not 0 < quantile < 1:
        raise ValueError(f'quantile must be in (0, 1), got {quantile!r}')
    if getattr(predictor, 'name', '').startswith('fallback'):
        log('offload threshold: the fallback predictor says N_max for every goal, so no '
            'goal is offloaded by its uncertainty (tau = infinity)')
        return float('inf')
    try:
        stored = read_train_lengths(model_file)
    except (TypeError, OSError, ValueError, KeyError) as exc:
        log(f'offload threshold: no training predictions beside {model_file} ({exc}); no goal '
            'is offloaded by its uncertainty (tau = infinity). Re-export the RLP with '
            '`timebill predictor train --export` to store them')
        return float('inf')
    lengths = [n_max if n is None else min(n, n_max) for n in stored]
    tau = float(np.quantile(lengths, quantile))
    log(f'offload threshold tau = {tau:.0f} tokens ({quantile:.2f}-quantile of N^ over '
        f'{len(lengths)} training prompts)')
    return tau
