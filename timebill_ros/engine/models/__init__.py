"""One module per architecture family of GGUF files, behind one small interface.

Each family module has ``spec(gguf) -> DecoderSpec`` (base.py): what it changes in the shared
decoder. A new family is one new file and one line in ``ARCHITECTURES``.
"""

import torch

from timebill_ros.engine.models import gemma3, llama, phi3, qwen2, qwen3
from timebill_ros.engine.models.base import DecoderSpec, GgufDecoder

# general.architecture -> the family module reading it.
ARCHITECTURES = {'llama': llama, 'qwen2': qwen2, 'qwen3': qwen3, 'gemma3': gemma3,
                 'phi3': phi3}

__all__ = ['ARCHITECTURES', 'DecoderSpec', 'GgufDecoder', 'load_decoder']


def load_decoder(gguf, device=None, dtype=None) -> GgufDecoder:
    """Return the decoder of ``gguf`` (a GgufFile); ValueError naming an unknown family.

    device / dtype: None keeps the file's blocks for the CPU kernels; a device (``cuda``)
    holds the weights dequantized there in ``dtype`` (a torch dtype, default float32).
    """
    family = ARCHITECTURES.get(gguf.arch)
    if family is None:
        raise ValueError(f'{gguf.path.name}: architecture {gguf.arch!r} is not supported '
                         f'(supported: {", ".join(ARCHITECTURES)})')
    if device is None:
        return GgufDecoder(gguf, family.spec(gguf))
    return GgufDecoder(gguf, family.spec(gguf), device, dtype or torch.float32)
