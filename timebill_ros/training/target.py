"""The target LLM as transformers modules, what the RLP copies its first layers from.

The engine serves a GGUF file on its own blocks (no transformers model is built,
``engine.model`` is None); the RLP trains on transformers modules. For such a file this loads
transformers' fp32 model of the file's dequantized weights (``from_pretrained(gguf_file=)``,
the same reference enginebench compares against). The tokenizer stays the engine's: the RLP
reads the ids the server encodes (transformers' GGUF tokenizer gives other ids for Gemma 3).
"""

import pathlib

import torch


def load_target_model(engine):
    """Return the transformers model of ``engine``'s weights (fp32, eval).

    ``engine.model`` where the engine has one (the embedded model loaded with
    ``transformers_model=True``, a transformers directory); else the model of the GGUF file it
    serves. ValueError when transformers cannot read that file's architecture.
    """
    if engine.model is not None:
        return engine.model
    if engine.gguf_file is None:
        raise ValueError('the engine has neither a transformers model nor a GGUF file')
    path = pathlib.Path(engine.gguf_file.path)
    try:
        return transformers_model_of(path)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f'transformers cannot load {path.name} for the RLP: {exc}') from exc


def transformers_model_of(gguf_path):
    """Return transformers' fp32 model of the GGUF file's dequantized weights (eval).

    Also enginebench's reference for greedy agreement (bench/engine.py).
    """
    from transformers import AutoModelForCausalLM
    path = pathlib.Path(gguf_path).expanduser().resolve()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                local_files_only=True,
                                                dtype=torch.float32).eval()


def final_norm_weight(engine) -> torch.Tensor:
    """Return the final norm's multiplier (hidden,) fp32, as the served forward applies it.

    The prefill readout starts its per-channel weights from it. A GGUF file's norm holds the
    multiplier itself (Gemma's ``1 + weight`` included); a transformers Llama's is its weight.
    """
    if engine.model is not None:
        return engine.model.model.norm.weight.detach().float()
    return engine.forward.final_norm.detach().float()
