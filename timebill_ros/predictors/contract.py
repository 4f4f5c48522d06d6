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


def default_readout_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return where ``timebill predictor readout --export`` puts the prefill readout."""
    return pathlib.Path(paths.cache_root(cache_dir)) / 'rlp' / f'{model_key}__readout.onnx'


def predictor_files(config) -> Dict[str, pathlib.Path]:
    """Return {'RLP': path, 'readout': path}: the files a server of ``config`` would load.

    config: a ServerConfig; its ``predictor.model_file`` / ``readout_file`` when set, else
    the cache defaults of its engine's model key.
    """
    from timebill_ros.engine import model_source
    key = model_source.model_key(config.engine)
    cache = config.engine.model_cache_dir or None
    return {'RLP': pathlib.Path(config.predictor.model_file or default_onnx_path(key, cache)),
            'readout': pathlib.Path(config.predictor.readout_file
                                    or default_readout_path(key, cache))}


def read_metadata(session) -> Dict[str, str]:
    """Return the ``timebill.*`` metadata of an onnxruntime session, prefix stripped."""
    props = session.get_modelmeta().custom_metadata_map
    return {k[len(META_PREFIX):]: v for k, v in props.items() if k.startswith(META_PREFIX)}
