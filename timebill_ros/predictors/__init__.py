"""Response-length predictors (N^, Eq. 2)."""

from timebill_ros import plugins
from timebill_ros.predictors.base import LengthPredictor
from timebill_ros.predictors.fallback import FallbackPredictor


def make_predictor(predictor_config, model_key='', prefill_s=None, cache_dir=None, log=print):
    """Build the predictor named by ``predictor_config.kind`` (its ``from_config``).

    The registry: the LengthPredictor classes of this package named in
    plugins.NAMES['length predictor']. For ``rlp``: the ONNX file of ``predictor.model_file``
    (or the cache entry of ``model_key``) with prompt compression against ``prefill_s``
    (N_x tokens -> seconds). If it cannot be built, log why and return the fallback, whose
    name carries the reason (results then say ``fallback (rlp unavailable: ...)``).
    """
    kinds = plugins.load('length predictor', LengthPredictor)
    kind = plugins.choose('length predictor', kinds, predictor_config.kind)
    try:
        return kind.from_config(predictor_config, model_key, prefill_s, cache_dir, log)
    except Exception as exc:  # the server must still serve: fall back, say why
        reason = f'{type(exc).__name__}: {exc}'
        log(f'{kind.name.upper()} unavailable, using the fallback N^ = N_max: {reason}')
        fallback = FallbackPredictor()
        fallback.name = f'fallback ({kind.name} unavailable: {reason})'
        return fallback


def make_readout(predictor_config, model_key='', cache_dir=None, log=print, n_layers=None):
    """Return the prefill readout of ``predictor_config`` (PrefillReadout), or None.

    None when ``kind`` is not rlp or ``prefill_readout`` is off; also when the file cannot be
    loaded or reads layers beyond ``n_layers`` (the model's, when given), after logging why
    (the RLP then predicts beside the prefill, as without it).
    """
    if predictor_config.kind != 'rlp' or not predictor_config.prefill_readout:
        return None
    from timebill_ros.predictors.prefill_readout import PrefillReadout
    from timebill_ros.predictors.contract import load_for, predictor_paths
    path = predictor_paths(predictor_config, model_key, cache_dir)['readout']
    try:
        readout = load_for(PrefillReadout, path, predictor_config, model_key)
        if n_layers is not None and max(readout.pool_layers) > n_layers:
            raise ValueError(f'{path} reads layers {readout.pool_layers}, the model has '
                             f'{n_layers}')
    except Exception as exc:  # the server must still serve: the RLP predicts, say why
        log(f'prefill readout unavailable, N^ from the RLP beside the prefill: '
            f'{type(exc).__name__}: {exc}')
        return None
    log(f'prefill readout loaded from {path}: {readout.time_s * 1e3:.2f} ms a call')
    readout.decode = _decode_readout(predictor_config, model_key, cache_dir, log, readout)
    return readout


def _decode_readout(predictor_config, model_key, cache_dir, log, prefill):
    """Return the decode readout that reads at checkpoints beside ``prefill``, or None.

    None when ``decode_readout`` is off or its file is missing (said in the log), or the
    file cannot be loaded, is another model's or reads other prompt layers than ``prefill``
    (the engine pools only those; logged).
    """
    if not predictor_config.decode_readout:
        return None
    from timebill_ros.predictors.contract import load_for, predictor_paths
    from timebill_ros.predictors.decode_readout import DecodeReadout
    path = predictor_paths(predictor_config, model_key, cache_dir)['decode readout']
    if not path.is_file():
        log(f'no decode readout at {path}: checkpoints read the prefill readout')
        return None
    try:
        readout = load_for(DecodeReadout, path, predictor_config, model_key)
        if readout.pool_layers != prefill.pool_layers:
            raise ValueError(f'it reads prompt layers {readout.pool_layers}, the prefill '
                             f'readout {prefill.pool_layers}')
    except Exception as exc:  # the server must still serve: checkpoints read the prefill's
        log(f'decode readout at {path} unavailable: {type(exc).__name__}: {exc}')
        return None
    log(f'decode readout loaded from {path}: {readout.time_s * 1e3:.2f} ms a call')
    return readout


__all__ = ['LengthPredictor', 'FallbackPredictor', 'make_predictor', 'make_readout']
