"""``engine.decode_weights: gguf``: one-token steps read the GGUF file's own blocks.

The embedded model's GGUF stores every decoder matrix as Q4_1 and the tied embedding / LM head
as Q8_0 (96 MB, against 540 MB of fp32 weights). transformers loads the same file dequantized
to fp32; this module reads the blocks themselves (the ``gguf`` package's reader) and maps them
onto the model's linear layers, so that the kernels (engine/kernels) multiply by exactly the
weights the fp32 model holds. transformers reorders the rows of the query and key matrices of
Llama-family GGUFs (llama.cpp's rotary layout); the same row order is applied to the blocks.

Blocks are kept as the file holds them: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and the K-quants
(Q4_K, Q5_K, Q6_K, the types most llama.cpp GGUFs use).
"""

import pathlib
from typing import Dict, Tuple

import numpy as np
import torch

from timebill_ros.engine.kernels import QTYPES
from timebill_ros.engine.models.base import rope_row_order

# GGUF tensor name (per layer) -> transformers module name.
LAYER_TENSORS = {
    'attn_q': 'self_attn.q_proj', 'attn_k': 'self_attn.k_proj', 'attn_v': 'self_attn.v_proj',
    'attn_output': 'self_attn.o_proj', 'ffn_gate': 'mlp.gate_proj', 'ffn_up': 'mlp.up_proj',
    'ffn_down': 'mlp.down_proj'}


def read_step_blocks(gguf_path, config) -> Dict[str, Tuple[int, torch.Tensor]]:
    """Return {module name: (kernel type id, blocks (N, row bytes) uint8)} of ``gguf_path``.

    The type id is the GGML one (kernels.QTYPES). config: the model's transformers config (heads,
    layers). Names are the model's (``model.layers.3.mlp.up_proj``, ``lm_head``). Matrices in
    a type the kernels do not read are left out (those layers keep the model's own weights).
    ValueError when the file does not hold the model's layers.
    """
    from gguf import GGUFReader
    reader = GGUFReader(pathlib.Path(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    heads = {'attn_q': config.num_attention_heads, 'attn_k': config.num_key_value_heads}
    out = {}
    for layer in range(config.num_hidden_layers):
        for short, module in LAYER_TENSORS.items():
            tensor = tensors.get(f'blk.{layer}.{short}.weight')
            if tensor is None:
                raise ValueError(f'{gguf_path} has no blk.{layer}.{short}.weight')
            order = rope_row_order(tensor.data.shape[0], heads[short]) if short in heads else None
            _add(out, f'model.layers.{layer}.{module}', tensor, order)
    head = tensors.get('output.weight') or tensors.get('token_embd.weight')
    if head is not None:
        _add(out, 'lm_head', head, None)
    return out


def _add(out, name, tensor, order):
    """Put ``tensor``'s blocks (rows in ``order``) under ``name`` when the kernels read it."""
    kind = tensor.tensor_type.name
    if kind not in QTYPES:
        return
    data = np.asarray(tensor.data)
    data = data[order] if order is not None else data
    out[name] = (QTYPES[kind], torch.from_numpy(np.array(data, copy=True, order='C')))
