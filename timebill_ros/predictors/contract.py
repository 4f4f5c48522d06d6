"""The ONNX file contract between the trainer (``training/export.py``) and the server.

An RLP file takes ``input_ids`` (1, N_p) int64 and gives ``output``; a prefill readout file
takes ``pooled`` (1, 2 x L x hidden) float32, the pooled layer states, and gives ``output``.
Both carry ``timebill.*`` metadata (kind, B, N_model, readout, target model key, ...), and
both live in the cache by default (``<cache>/rlp/<model key>__rlp.onnx`` and
``__readout.onnx``). The server reads only what is here; it never imports the trainer.
"""

import pathlib
from typing import Dict

from timebill_ros import paths

INPUT_NAME = 'input_ids'
POOLED_NAME = 'pooled'  # the prefill readout's input: pooled layer states (1, 2 x L x hidden)
OUTPUT_NAME = 'output'
META_PREFIX = 'timebill.'


def default_onnx_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return where ``timebill predictor train --export`` puts the RLP of ``model_key``."""
    return pathlib.Path(paths.cache_root(cache_dir)) / 'rlp' / f'{model_key}__rlp.onnx'


def load_for(kind, path, predictor_config, model_key, **kwargs):
    """Return ``kind.load(path, **kwargs)`` with the config's threads and provider.

    kind: a predictor class with ``load`` (the RLP, a readout). ValueError when the file was
    trained for another model than ``model_key`` ('': any).
    """
    loaded = kind.load(path, threads=predictor_config.threads,
                       provider=predictor_config.provider, **kwargs)
    if model_key and loaded.model_key != model_key:
        raise ValueError(f'{path} was trained for model {loaded.model_key!r}, '
                         f'not {model_key!r}')
    return loaded


def default_readout_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return where ``timebill predictor readout --export`` puts the prefill readout."""
    return pathlib.Path(paths.cache_root(cache_dir)) / 'rlp' / f'{model_key}__readout.onnx'


def default_decode_readout_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return where ``timebill predictor decode-readout --export`` puts the decode readout."""
    return (pathlib.Path(paths.cache_root(cache_dir)) / 'rlp'
            / f'{model_key}__decode_readout.onnx')


def predictor_paths(predictor_config, model_key, cache_dir=None) -> Dict[str, pathlib.Path]:
    """Return {'RLP', 'readout', 'decode readout'} -> path: which predictor files load.

    predictor_config: a PredictorConfig; its ``model_file`` / ``readout_file`` /
    ``decode_readout_file`` when set, else the cache entries of ``model_key`` under
    ``cache_dir`` (None: the default cache).
    """
    return {'RLP': pathlib.Path(predictor_config.model_file
                                or default_onnx_path(model_key, cache_dir)),
            'readout': pathlib.Path(predictor_config.readout_file
                                    or default_readout_path(model_key, cache_dir)),
            'decode readout': pathlib.Path(
                predictor_config.decode_readout_file
                or default_decode_readout_path(model_key, cache_dir))}


def predictor_files(config, model_key=None) -> Dict[str, pathlib.Path]:
    """Return :func:`predictor_paths` of a ServerConfig: the files its server would load.

    model_key: the loaded engine's key; None = the key of ``config.engine`` (no model
    loaded).
    """
    if model_key is None:
        from timebill_ros.engine import model_source
        model_key = model_source.model_key(config.engine)
    return predictor_paths(config.predictor, model_key, config.engine.model_cache_dir or None)


def read_metadata(session) -> Dict[str, str]:
    """Return the ``timebill.*`` metadata of an onnxruntime session, prefix stripped."""
    props = session.get_modelmeta().custom_metadata_map
    return {k[len(META_PREFIX):]: v for k, v in props.items() if k.startswith(META_PREFIX)}
