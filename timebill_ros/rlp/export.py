"""Export a trained RLP to ONNX (dynamic sequence length) and check it against torch.

The ONNX file carries what the server needs to turn its output into N^ as metadata
(``timebill.*`` keys): the kind (classification / regression), B, N_model, L, the training
N_p and the target model key. The server refuses a file whose model key is not its model's.
"""

import json
import pathlib
from typing import Dict, Sequence

import numpy as np
import torch

from timebill_ros.timing import model as timing_model

INPUT_NAME = 'input_ids'
OUTPUT_NAME = 'output'
META_PREFIX = 'timebill.'
MAX_EXPORT_TOKENS = 8192


def default_onnx_path(model_key: str, cache_dir=None) -> pathlib.Path:
    """Return where ``timebill predictor train --export`` puts the RLP of ``model_key``."""
    return pathlib.Path(timing_model.cache_root(cache_dir)) / 'rlp' / f'{model_key}__rlp.onnx'


def rlp_metadata(model, model_key: str) -> Dict[str, str]:
    """Return the metadata stored in the ONNX file of ``model`` (string values)."""
    return {
        'kind': 'regression' if model.bucket_tokens is None else 'classification',
        'bucket_tokens': str(model.bucket_tokens or 0), 'n_model': str(model.n_model),
        'n_layers': str(len(model.net.layers)), 'max_input_tokens': str(model.max_input_tokens),
        'model_key': model_key, 'name': model.name,
        'readout': getattr(model, 'readout', 'argmax')}


def export_onnx(model, path, model_key: str) -> pathlib.Path:
    """Write ``model.net`` as ONNX to ``path``: input ``input_ids`` (1, n) int64 -> (1, C)."""
    import onnx
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = model.net.eval()
    example = torch.tensor([model.input_ids('Is the door open? Answer yes or no.')])
    n_tokens = torch.export.Dim('n_tokens', min=1, max=MAX_EXPORT_TOKENS)
    tmp = path.with_suffix('.tmp.onnx')
    torch.onnx.export(net, (example,), str(tmp), dynamo=True, input_names=[INPUT_NAME],
                      output_names=[OUTPUT_NAME], dynamic_shapes={'input_ids': {1: n_tokens}},
                      external_data=False, verbose=False)
    proto = onnx.load(str(tmp))
    for key, value in rlp_metadata(model, model_key).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = META_PREFIX + key, value
    onnx.save(proto, str(path))
    tmp.unlink()
    path.with_suffix('.json').write_text(json.dumps(rlp_metadata(model, model_key), indent=1))
    return path


def read_metadata(session) -> Dict[str, str]:
    """Return the ``timebill.*`` metadata of an onnxruntime session, prefix stripped."""
    props = session.get_modelmeta().custom_metadata_map
    return {k[len(META_PREFIX):]: v for k, v in props.items() if k.startswith(META_PREFIX)}


def max_abs_difference(model, session, id_lists: Sequence[Sequence[int]]) -> float:
    """Return the largest |torch - onnxruntime| output difference over the given prompts."""
    worst = 0.0
    model.net.eval()
    with torch.inference_mode():
        for ids in id_lists:
            tensor = torch.tensor([list(ids)], dtype=torch.long)
            expected = model.net(tensor).numpy()
            got = session.run([OUTPUT_NAME], {INPUT_NAME: tensor.numpy()})[0]
            worst = max(worst, float(np.abs(expected - got).max()))
    return worst
