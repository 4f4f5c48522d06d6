"""Loading: a model file (or a given model) -> a forward pass on a device, its tokenizer, EOS.

What LlmEngine serves (the session: prefill / evict / decode) comes from here, once:
- a ``.gguf`` file (``engine.model_path``, or the embedded SmolLM2 GGUF on the CPU) on its own
  blocks (engine/models), or dequantized on a GPU as static CUDA-graph steps;
- a transformers model (given, a directory, or the converted embedded GGUF) on the lean
  Llama forward or transformers' own modules, its step weights chosen by timing them
  (``decode_weights: auto``, engine/step_format.py).
"""

import dataclasses
import logging
import pathlib
from typing import Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from timebill_ros.config import EngineConfig
from timebill_ros.engine import kernels, model_source
from timebill_ros.engine.forward import Forward, avoid_cudnn_attention
from timebill_ros.engine.hf_forward import TransformersForward
from timebill_ros.engine.lean_llama import LeanLlamaForward, unsupported_reason
from timebill_ros.engine.step_format import choose_step_format, forward_step_s, PROBE_KV

DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
# One-token step weight formats (engine.decode_weights): int8 is weight-only, per output row.
STEP_DTYPES = dict(DTYPES, int8=torch.int8)
# The GGUF file's own blocks through the C++ kernels (engine/gguf_weights.py, engine/kernels).
GGUF_FORMAT = 'gguf'
# Chat templates' end-of-turn tokens; those the tokenizer knows count as EOS.
END_OF_TURN_TOKENS = ('<|im_end|>', '<|eot_id|>', '<|end|>', '<end_of_turn>')
# sdpa works with the hooks: they read the attention *inputs*, never the attention weights.
ATTN_IMPLEMENTATION = 'sdpa'


@dataclasses.dataclass
class LoadedModel:
    """What a load gives the engine.

    forward: the Forward every pass runs on. model: the transformers model, None for a
    GGUF served on its own blocks. engine_config: the config with ``auto`` choices resolved
    (``decode_weights``, ``prefill_dtype``), so calibration files key on them. vocab_size:
    token ids the model reads. eos_token_ids: ids that end an answer. gguf_file: the
    GgufFile served, or None. step_format_probe: s/step of each format ``decode_weights:
    auto`` timed (empty when named). gguf_skipped: why ``auto`` did not time ``gguf``, or
    None.
    """

    forward: Forward
    model: Optional[torch.nn.Module]
    tokenizer: object
    engine_config: EngineConfig
    vocab_size: int
    eos_token_ids: tuple
    gguf_file: Optional[object] = None
    step_format_probe: dict = dataclasses.field(default_factory=dict)
    gguf_skipped: Optional[str] = None


def load_model(engine_config: EngineConfig, model=None, tokenizer=None, step_blocks=None,
               transformers_model: bool = False) -> LoadedModel:
    """Load what ``engine_config`` names, using ``model`` / ``tokenizer`` where given.

    step_blocks: ``decode_weights: gguf``'s blocks for a given ``model`` (None: the embedded
    GGUF's). transformers_model: the embedded model as transformers modules even where it
    would be served from its GGUF (what the offline tools that train on them ask for).
    """
    gguf_path = (model_source.gguf_to_serve(engine_config, transformers_model)
                 if model is None else None)
    if gguf_path is not None:
        return _load_gguf(engine_config, gguf_path, tokenizer)
    return _load_transformers(engine_config, model, tokenizer, step_blocks)


def _load_gguf(config: EngineConfig, path, tokenizer) -> LoadedModel:
    """Serve the GGUF file at ``path`` on its own blocks (engine/models).

    No transformers model is built; the tokenizer and chat template come from the file.
    ``decode_weights`` becomes ``gguf`` (what every step runs) and ``prefill_dtype`` what
    ``auto`` resolved to. On another device (a GPU) the same decoder holds the weights
    dequantized there in ``engine.dtype`` and decodes on static buffers as CUDA graphs
    (engine/models/static_step.py); ``decode_weights`` then names that dtype. The same dense
    decoder runs on the CPU when ``decode_weights`` names a dtype (float32, float16,
    bfloat16): what the GPU runs, without the kernels (tests, the GPU check's CPU dry run).
    The device memory the weights take is logged.
    """
    from timebill_ros.engine.gguf.file import GgufFile
    from timebill_ros.engine.gguf.tokenizer import build_tokenizer
    from timebill_ros.engine.models import load_decoder
    from timebill_ros.engine.models.weights import prefill_dtype
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    gguf_file = GgufFile(path)
    device = torch.device(config.device)
    dense = config.decode_weights in DTYPES  # a dense dtype named (on the CPU too)
    if device.type == 'cpu' and not dense:
        forward = load_decoder(gguf_file)
        gemm_dtype = prefill_dtype(config.prefill_dtype)
        forward.prefill_dtype = getattr(torch, gemm_dtype)
        step_format = GGUF_FORMAT
    else:
        avoid_cudnn_attention(device)  # before any timed pass
        step_format = config.decode_weights if dense else config.dtype
        forward = load_decoder(gguf_file, device, DTYPES[step_format])
        forward.static_steps.max_bytes = int(config.step_buffers_mb * 1e6)
        forward.static_steps.warm()  # one-row graphs up to 4k KV, before any timing
        gemm_dtype = config.prefill_dtype
        _log_device_memory(path, device, forward.weight_bytes)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(gguf_file)
    return LoadedModel(
        forward=forward, model=None, tokenizer=tokenizer, vocab_size=forward.vocab_size,
        eos_token_ids=eos_token_ids(None, tokenizer, gguf_file), gguf_file=gguf_file,
        engine_config=dataclasses.replace(config, decode_weights=step_format,
                                          prefill_dtype=gemm_dtype))


def _load_transformers(config: EngineConfig, model, tokenizer, step_blocks) -> LoadedModel:
    """Serve a transformers model (given, a directory, or the converted embedded GGUF)."""
    if config.prefill_dtype != 'auto':
        raise ValueError(f'engine.prefill_dtype {config.prefill_dtype!r} applies to a '
                         '.gguf model_path; a transformers model prefills in engine.dtype '
                         '(leave prefill_dtype auto)')
    # The embedded GGUF, loaded here (not a model a caller built): decode_weights gguf's
    # blocks are its weights.
    embedded = model is None and not config.model_path
    if model is None or tokenizer is None:
        model_dir = model_source.resolve_model_dir(config)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        if model is None:
            model = _load_transformers_model(model_dir, config)
    model = model.eval()
    loaded = LoadedModel(forward=None, model=model, tokenizer=tokenizer, engine_config=config,
                         vocab_size=int(model.get_input_embeddings().num_embeddings),
                         eos_token_ids=eos_token_ids(model, tokenizer))
    avoid_cudnn_attention(next(model.parameters()).device)  # before any timed pass
    if config.decode_weights == 'auto' and _lean_chosen(model, config):
        _choose_step_format(loaded, embedded)
    else:
        loaded.forward = make_forward(model, config, step_blocks)
    return loaded


def _choose_step_format(loaded: LoadedModel, embedded: bool) -> None:
    """Resolve ``decode_weights: auto`` by timing steps (engine/step_format.py).

    ``loaded.engine_config`` then names the chosen format, so calibration files key on it.
    """
    config, model = loaded.engine_config, loaded.model

    def make(name):
        return make_forward(model, dataclasses.replace(config, decode_weights=name))

    token_ids = random_ids(loaded.tokenizer, loaded.vocab_size, PROBE_KV)
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    formats = ('float32', 'float16')
    loaded.gguf_skipped = ('the model was given by the caller' if not embedded
                           else gguf_unusable_reason(model, config))
    if loaded.gguf_skipped is None:
        formats += (GGUF_FORMAT,)
    with torch.inference_mode():
        chosen, loaded.forward, loaded.step_format_probe = choose_step_format(
            make, lambda forward: forward_step_s(forward, token_ids), formats)
    loaded.engine_config = dataclasses.replace(config, decode_weights=chosen)


def random_ids(tokenizer, vocab_size: int, n_tokens: int) -> list:
    """Return ``n_tokens`` reproducible random ids below ``vocab_size``, no special token."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    special = [t for t in tokenizer.all_special_ids if 0 <= t < vocab_size]
    allowed[special] = False
    candidates = allowed.nonzero().squeeze(1)
    generator = torch.Generator().manual_seed(n_tokens)
    picks = torch.randint(len(candidates), (n_tokens,), generator=generator)
    return candidates[picks].tolist()


def _log_device_memory(path, device: torch.device, weight_bytes: int) -> None:
    """Log (stderr) the device memory a GGUF file's dense weights take, MB."""
    allocated = (torch.cuda.memory_allocated(device) if device.type == 'cuda' else 0) / 1e6
    logging.getLogger('timebill_ros.engine').warning(
        '%s on %s: weights %.1f MB, %.1f MB allocated on the device', pathlib.Path(path).name,
        device, weight_bytes / 1e6, allocated)


def _lean_chosen(model, engine_config: EngineConfig) -> bool:
    """Return True when ``engine.forward`` puts ``model`` on the lean forward."""
    if engine_config.forward == 'transformers':
        return False
    return engine_config.forward == 'lean' or unsupported_reason(model) is None


def make_forward(model, engine_config: EngineConfig, step_blocks=None) -> Forward:
    """Return the forward pass ``engine_config.forward`` names for ``model``.

    step_blocks: the GGUF blocks of ``decode_weights: gguf`` (None: the embedded GGUF's).

    ``auto``: the lean forward when the model is Llama-family, else transformers'.
    ``engine.decode_weights`` applies to the lean forward only (``auto`` is resolved by
    :func:`load_model` before this; here it means the model's dtype).
    """
    if not _lean_chosen(model, engine_config):
        return TransformersForward(model)
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f'engine.forward is lean, but {reason}')
    if engine_config.decode_weights == GGUF_FORMAT:
        if step_blocks is None:
            step_blocks = _gguf_step_blocks(model, engine_config)
        return LeanLlamaForward(model, None, step_blocks)
    return LeanLlamaForward(model, STEP_DTYPES.get(engine_config.decode_weights))


def gguf_unusable_reason(model, engine_config: EngineConfig) -> Optional[str]:
    """Return why ``decode_weights: gguf`` cannot run ``model`` here, or None when it can.

    It needs the embedded GGUF model in fp32 on the CPU and the kernels built for this CPU
    (a C++ compiler at the first start; engine/kernels).
    """
    if engine_config.model_path:
        return 'the model is a transformers directory (engine.model_path), not the GGUF'
    if model.dtype != torch.float32 or model.device.type != 'cpu':
        return f'the model runs in {model.dtype} on {model.device}, the kernels in fp32 on a CPU'
    try:
        kernels.load()
    except RuntimeError as exc:
        return str(exc)
    return None


def _gguf_step_blocks(model, engine_config: EngineConfig) -> dict:
    """Return the GGUF step blocks of ``decode_weights: gguf`` (the embedded model only)."""
    from timebill_ros.engine.gguf_weights import read_step_blocks
    if engine_config.model_path:
        raise ValueError('engine.decode_weights gguf reads the embedded GGUF model; '
                         f'engine.model_path is {engine_config.model_path!r}')
    return read_step_blocks(model_source.embedded_gguf_path(), model.config)


def _load_transformers_model(model_dir, engine_config: EngineConfig):
    """Load the causal LM of ``model_dir`` with the config's device, dtype and threads."""
    if engine_config.threads > 0:
        torch.set_num_threads(engine_config.threads)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPES[engine_config.dtype], attn_implementation=ATTN_IMPLEMENTATION,
        local_files_only=True)
    return model.to(engine_config.device).eval()


def eos_token_ids(model, tokenizer, gguf_file=None) -> tuple:
    """Return the sorted EOS ids: model/generation config, tokenizer, end-of-turn tokens.

    model: a transformers model, or None for a GGUF file (``gguf_file``: its EOS / EOT ids).
    """
    ids = set()
    if model is not None:
        generation_config = getattr(model, 'generation_config', None)
        values = [getattr(generation_config, 'eos_token_id', None), model.config.eos_token_id]
    else:
        from timebill_ros.engine.gguf.tokenizer import eos_token_ids as gguf_eos_ids
        values = gguf_eos_ids(gguf_file)
    for value in values + [tokenizer.eos_token_id]:
        ids.update([value] if isinstance(value, int) else value or ())
    for token in END_OF_TURN_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return tuple(sorted(ids))
