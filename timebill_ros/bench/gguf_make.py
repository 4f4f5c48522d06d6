"""A Q4_K-dominant GGUF to measure on, made the way a user's file is made (issue 59).

    python -m timebill_ros.bench.gguf_make [--layers N] [--out DIR]

The files we had fall back to Q5_0 under llama.cpp's K-quant recipes: their hidden sizes (576,
640) are no multiple of 256. A robot's Qwen2.5 / Llama 3.2 at 1-3B is mostly Q4_K and Q6_K.
This writes a random-weight ``qwen2`` model at Qwen2.5-1.5B's sizes (hidden 1536, FFN 8960, 12
query and 2 key/value heads of 128; every matrix width a multiple of 256) in F16 with gguf's
writer, tensor by tensor (a 1.5B model never sits in memory), with the embedded SmolLM2's
tokenizer (49,152 tokens, its chat template), then quantizes it with llama.cpp's own quantizer
to Q4_K_M (``llama_model_quantize``, llama-cpp-python: ``make llama``). Files are cached under
``<cache>/models`` by their sizes and seed; the F16 intermediate is deleted.

Random weights: normal(0, 0.02) matrices as transformers initialises them, RMSNorm weights
1 + normal(0, 0.1), biases normal(0, 0.02): answers are meaningless tokens, but every step
runs the model's real arithmetic at its real sizes, which is what speed and exactness need.
"""

import argparse
import ctypes
import dataclasses
import pathlib
import sys

import numpy as np

QUANT_FTYPES = ('Q4_K_M', 'Q4_K_S', 'Q5_K_M', 'Q6_K', 'Q8_0')


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes of a ``qwen2`` model (counts; widths in weights)."""

    hidden: int = 1536
    ffn: int = 8960
    heads: int = 12
    kv_heads: int = 2
    head_dim: int = 128
    layers: int = 28
    context: int = 32768

    def __post_init__(self):
        """Check that every size is a positive int and the heads fill ``hidden``."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f'{field.name} must be an int > 0, got {value!r}')
        if self.heads * self.head_dim != self.hidden or self.heads % self.kv_heads:
            raise ValueError(f'heads {self.heads} x head_dim {self.head_dim} must equal hidden '
                             f'{self.hidden}, and kv_heads {self.kv_heads} divide heads')

    def matrix_weights(self, vocab: int) -> int:
        """Return how many weights the model's matrices hold, the embedding included."""
        kv = self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden * (self.hidden + kv) + 3 * self.hidden * self.ffn
        return self.layers * per_layer + vocab * self.hidden


def tensor_plan(dims: Dims, vocab: int):
    """Yield (GGUF name, shape as numpy has it: (rows N, K) or (n,)) of every tensor, in order.

    Qwen2's tied embedding: no ``output.weight`` (llama.cpp then reads ``token_embd``).
    """
    kv = dims.kv_heads * dims.head_dim
    yield 'token_embd.weight', (vocab, dims.hidden)
    yield 'output_norm.weight', (dims.hidden,)
    for i in range(dims.layers):
        blk = f'blk.{i}.'
        yield blk + 'attn_norm.weight', (dims.hidden,)
        yield blk + 'attn_q.weight', (dims.hidden, dims.hidden)
        yield blk + 'attn_q.bias', (dims.hidden,)
        yield blk + 'attn_k.weight', (kv, dims.hidden)
        yield blk + 'attn_k.bias', (kv,)
        yield blk + 'attn_v.weight', (kv, dims.hidden)
        yield blk + 'attn_v.bias', (kv,)
        yield blk + 'attn_output.weight', (dims.hidden, dims.hidden)
        yield blk + 'ffn_norm.weight', (dims.hidden,)
        yield blk + 'ffn_gate.weight', (dims.ffn, dims.hidden)
        yield blk + 'ffn_up.weight', (dims.ffn, dims.hidden)
        yield blk + 'ffn_down.weight', (dims.hidden, dims.ffn)


def random_tensor(name: str, shape, rng: np.random.Generator) -> np.ndarray:
    """Return the random weights of one tensor: F32 norms and biases, F16 matrices."""
    if len(shape) == 1:
        mean = 1.0 if name.endswith('norm.weight') else 0.0
        spread = 0.1 if name.endswith('norm.weight') else 0.02
        return (mean + spread * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)


def copy_tokenizer(writer, source_path) -> int:
    """Copy the ``tokenizer.*`` keys of the GGUF at ``source_path``; return its vocabulary size."""
    import gguf
    reader = gguf.GGUFReader(str(source_path))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith('tokenizer.'):
            continue
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub)
        if key == 'tokenizer.ggml.tokens':
            vocab = len(field.data)
    if not vocab:
        raise ValueError(f'{source_path} has no tokenizer.ggml.tokens to copy')
    return vocab


def write_random_f16(path, dims: Dims, seed: int, tokenizer_source) -> int:
    """Write a random-weight ``qwen2`` GGUF (F16 matrices) at ``path``; return its parameters.

    The header takes :func:`tensor_plan`'s shapes; then each tensor is drawn, in that order
    from one seeded generator, and streamed to the file.
    """
    import gguf
    writer = gguf.GGUFWriter(str(path), 'qwen2')
    writer.add_name(f'random qwen2 {dims.layers}x{dims.hidden} seed {seed}')
    writer.add_block_count(dims.layers)
    writer.add_context_length(dims.context)
    writer.add_embedding_length(dims.hidden)
    writer.add_feed_forward_length(dims.ffn)
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(writer, tokenizer_source)
    plan = list(tensor_plan(dims, vocab))
    for name, shape in plan:
        dtype = np.float32 if len(shape) == 1 else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    n_params = 0
    for name, shape in plan:
        tensor = random_tensor(name, shape, rng)
        writer.write_tensor_data(tensor)
        n_params += tensor.size
    writer.close()
    return n_params


def llama_quantize(source, target, ftype: str = 'Q4_K_M', threads: int = 2) -> None:
    """Quantize the GGUF ``source`` into ``target`` with llama.cpp's own quantizer.

    ftype: one of QUANT_FTYPES (llama.cpp's recipe names). Requantizing a quantized file is
    allowed (as ``llama-quantize --allow-requantize``). RuntimeError when llama.cpp fails.
    """
    if ftype not in QUANT_FTYPES:
        raise ValueError(f'ftype must be one of {QUANT_FTYPES}, got {ftype!r}')
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f'LLAMA_FTYPE_MOSTLY_{ftype}')
    params.allow_requantize = True
    params.nthread = int(threads)
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(),
                                            ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f'llama_model_quantize({source} -> {target}, {ftype}) returned '
                           f'{status}')


def q4k_file_name(dims: Dims, seed: int, ftype: str = 'Q4_K_M') -> str:
    """Return the cache file name of a random model of ``dims`` and ``seed``."""
    return (f'random-qwen2-{dims.layers}x{dims.hidden}-ffn{dims.ffn}-seed{seed}-'
            f'{ftype.lower()}.gguf')


def make_q4k_file(out, dims: Dims = Dims(), seed: int = 0, threads: int = 2,
                  say=print) -> pathlib.Path:
    """Return the Q4_K_M file of a random ``qwen2`` of ``dims`` in ``out`` (made if missing)."""
    from timebill_ros.engine.model_source import embedded_gguf_path
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / q4k_file_name(dims, seed)
    if target.is_file():
        return target
    f16 = target.with_suffix('.f16.tmp')
    part = target.with_suffix('.part')
    try:
        n_params = write_random_f16(f16, dims, seed, embedded_gguf_path())
        say(f'gguf_make: wrote {f16} ({n_params / 1e9:.2f} B parameters, '
            f'{f16.stat().st_size / 2 ** 30:.2f} GiB F16); quantizing to Q4_K_M')
        llama_quantize(f16, part, 'Q4_K_M', threads)
        part.replace(target)
    finally:
        f16.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return target


def main(argv=None) -> int:
    """Make the Q4_K-dominant file; print its path, size and tensor types."""
    from timebill_ros import paths
    from timebill_ros.engine.gguf.file import GgufFile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--layers', type=int, default=Dims().layers,
                        help="transformer blocks (default 28, Qwen2.5-1.5B's)")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=2, help="llama.cpp quantizer's threads")
    parser.add_argument('--out', default=str(pathlib.Path(paths.cache_root()) / 'models'))
    args = parser.parse_args(argv)
    path = make_q4k_file(pathlib.Path(args.out).expanduser(), Dims(layers=args.layers),
                         args.seed, args.threads)
    print(f'{path} ({path.stat().st_size / 2 ** 20:.0f} MiB): {GgufFile(path).describe()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
