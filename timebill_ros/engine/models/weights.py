"""A GGUF file's matrices kept as the file's own blocks, multiplied without an fp32 model copy.

:class:`Matrix` holds one (N, K) weight: quantized types packed once for the C++ kernels
(engine/kernels, K-quants included, as the file holds them), F32 / F16 / BF16 as a torch tensor of
the file's dtype. A product of a few rows (a decoding step: at most ``GEMM_ROWS`` rows) runs the
kernels on the blocks; a longer one (a prefill chunk) dequantizes the matrix into a temporary
fp32 tensor (``unpack_rows``, bit-exact to gguf's dequantization) and multiplies with torch's
GEMM, so at most one matrix is ever held in fp32, for the length of one call. That GEMM may run
in bf16 (``gemm_dtype``, a prefill's choice: engine.prefill_dtype; :func:`_split_linear`), which
CPUs with bf16 dot products (AVX512-BF16, AMX, Arm BF16) run ~4x faster than fp32 FMA (the
dequantization and the bf16 copy still cost: engine.prefill_dtype auto times both paths).
Inside :func:`weights_held` the dequantized weights are kept instead and reused by later calls
(a prefill layer by layer: one layer's matrices for all its chunks).

:class:`DenseMatrix` is the same weight for a GPU (or the CPU's dense path): the file's blocks
dequantized once at load by gguf's own dequantization (exact), then held on the device in one
dtype (fp32, fp16 or bf16); every product is one torch GEMM there in that dtype, its fp32 input
rounded to it and its output returned as fp32.
"""

import contextlib
import functools
import threading
import time
import warnings
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from timebill_ros.engine import kernels

# Products of at most this many rows run on the blocks; more rows dequantize the matrix once
# for the call and run torch's fp32 GEMM (compute-bound there).
GEMM_ROWS = 16
# An fp32 prefill on blocks runs the kernels' GEMM on the blocks (True) or torch's GEMM on a
# dequantized fp32 copy of each matrix (False: what it did before; benchmarks compare the two).
TILED_PREFILL = True
DENSE_TYPES = {'F32': torch.float32, 'F16': torch.float16, 'BF16': torch.bfloat16}
BLOCK_TYPES = tuple(kernels.QTYPES)
SUPPORTED_TYPES = tuple(DENSE_TYPES) + BLOCK_TYPES
# engine.prefill_dtype auto picks bf16 GEMMs when they run at least this many times faster.
BF16_MIN_SPEEDUP = 1.5
# This thread's kept GEMM weights inside weights_held(): {(id(matrix), dtype): weight}.
_HELD = threading.local()


@contextlib.contextmanager
def weights_held():
    """Keep each matrix's dequantized GEMM weight from its first call to the end of the block.

    Per thread (twin engines share the matrices): what a block holds is what it multiplied,
    freed when it ends. A prefill by layer holds one layer's matrices across its chunks, where
    a chunk at a time dequantized every matrix again for each chunk (3.2 of 8.9 s of a
    3.5k-token prefill in 128-token chunks, embedded model, 2 x86 cores).
    """
    outer = getattr(_HELD, 'weights', None)
    _HELD.weights = {}
    try:
        yield
    finally:
        _HELD.weights = outer


class Matrix:
    """One weight matrix W (N rows, K weights a row); ``x @ W^T`` on the file's blocks.

    data: the file's tensor, (N, row bytes) uint8 blocks or (N, K) floats; type_name: its GGML
    type; row_order: optional row permutation applied first (Llama's query / key rows);
    bias: optional (N,) fp32.
    """

    def __init__(self, data: np.ndarray, type_name: str, n_rows: int, k: int,
                 row_order: Optional[np.ndarray] = None, bias: Optional[np.ndarray] = None):
        """Keep ``data`` in the kernels' layout (blocks) or as a tensor (floats)."""
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(f'weight type {type_name} is not supported '
                             f'(supported: {", ".join(SUPPORTED_TYPES)})')
        self.n_rows, self.k, self.type_name = int(n_rows), int(k), type_name
        data = np.asarray(data)
        if row_order is not None:
            data = data[row_order]
        self.bias = None if bias is None else torch.from_numpy(np.array(bias, np.float32))
        self.packed = self.dense = self.kernels = None
        self.qtype = None
        if type_name in DENSE_TYPES:
            self._keep_dense(data, type_name)
        else:
            self._keep_blocks(data, type_name)

    def _keep_dense(self, data: np.ndarray, type_name: str) -> None:
        if type_name == 'BF16':
            raw = np.ascontiguousarray(data).view(np.int16).reshape(self.n_rows, self.k)
            self.dense = torch.from_numpy(raw.copy()).view(torch.bfloat16)
        else:
            self.dense = torch.from_numpy(np.array(data, copy=True).reshape(self.n_rows, self.k))
        self.nbytes = self.dense.numel() * self.dense.element_size()

    def _keep_blocks(self, data: np.ndarray, type_name: str) -> None:
        self.kernels = kernels.load()
        self.qtype, blocks = kernels.QTYPES[type_name], np.ascontiguousarray(data)
        with warnings.catch_warnings():  # a read-only view of the file: pack only reads it
            warnings.filterwarnings('ignore', message='The given NumPy array is not writable')
            blocks = torch.from_numpy(np.ascontiguousarray(blocks))
        self.packed = self.kernels.pack(blocks, self.qtype, self.k)
        self.nbytes = self.packed.numel()

    def __call__(self, x: torch.Tensor, gemm_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Return the input (..., K) fp32 times W^T, plus the bias: (..., N) fp32.

        gemm_dtype: the dtype of the GEMM that more than ``GEMM_ROWS`` rows take: float32
        runs the kernels' prefill GEMM on the blocks (``gemm_tiled``: no dequantized matrix; a
        row's result independent of the chunk), bfloat16 torch's GEMM on a bf16 copy
        (:func:`_split_linear`); fewer rows always run the decoding kernels in fp32.
        """
        rows = x.reshape(-1, self.k)
        if self.packed is not None and rows.shape[0] <= GEMM_ROWS:
            rows = rows.contiguous()
            parts = [self.kernels.gemm(rows[i:i + kernels.MAX_ROWS], self.packed, self.qtype,
                                       self.n_rows, False)
                     for i in range(0, rows.shape[0], kernels.MAX_ROWS)]
            y = parts[0] if len(parts) == 1 else torch.cat(parts)
            if self.bias is not None:
                y = y + self.bias
        elif self.packed is not None and gemm_dtype == torch.float32 and TILED_PREFILL:
            y = self.kernels.gemm_tiled(rows.contiguous(), self.packed, self.qtype,
                                        self.n_rows, False)
            if self.bias is not None:
                y = y + self.bias
        elif gemm_dtype == torch.float32:
            y = F.linear(rows, self._gemm_weight(gemm_dtype), self.bias)
        else:
            y = _split_linear(rows, self._gemm_weight(gemm_dtype))
            if self.bias is not None:
                y = y + self.bias
        return y.view(*x.shape[:-1], self.n_rows)

    def _gemm_weight(self, gemm_dtype: torch.dtype) -> torch.Tensor:
        """Return W in ``gemm_dtype``, (N, K): kept inside :func:`weights_held`, else made."""
        held = getattr(_HELD, 'weights', None)
        key = (id(self), gemm_dtype)
        if held is not None and key in held:
            return held[key]
        weight = self.dequantized()
        if gemm_dtype != torch.float32:
            weight = weight.to(gemm_dtype)
        if held is not None:
            held[key] = weight
        return weight

    def dequantized(self) -> torch.Tensor:
        """Return the whole matrix in fp32, (N, K): a temporary for one call (or the F32 data)."""
        if self.dense is not None:
            return self.dense if self.dense.dtype == torch.float32 else self.dense.float()
        return self.rows(torch.arange(self.n_rows))

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Return rows ``index`` (R,) as fp32 (R, K): an embedding lookup."""
        index = index.reshape(-1).to(torch.long).contiguous()
        if self.dense is not None:
            return self.dense[index].float()
        return self.kernels.unpack_rows(self.packed, self.qtype, self.k, self.n_rows, index)


def _split_linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Return rows (M, K) fp32 times weight (N, K) bf16 transposed, (M, N) fp32, in bf16 GEMMs.

    The rows go in as two bf16 parts (``high`` and the rest, ``low``: ~16 bits together), the
    weight rounded once (8 bits); each GEMM sums in fp32 and rounds its output to bf16. Two
    GEMMs at ~4.5x fp32's speed: ~2.2x. One GEMM of rounded rows changed 4 of 20 greedy
    answers of SmolLM2-135M Q4_K_M against the fp32 prefill's (held-out prompts, 32 tokens);
    the split rows changed none (docs/own_model.md).
    """
    high = rows.to(weight.dtype)
    low = (rows - high.float()).to(weight.dtype)
    return F.linear(high, weight).float() + F.linear(low, weight).float()


# CPU flags of bf16 dot products (x86's /proc/cpuinfo ``flags``, ARM's ``Features``): where none
# is present a bf16 GEMM is emulated and never beats fp32, so ``auto`` takes fp32 without a
# probe.
BF16_FLAGS = ('avx512_bf16', 'amx_bf16', 'avx_ne_convert', 'bf16')


@functools.lru_cache(maxsize=None)
def cpu_bf16_flags(cpuinfo: str = '/proc/cpuinfo') -> tuple:
    """Return the bf16 dot-product flags this CPU reports (empty where /proc is missing)."""
    try:
        with open(cpuinfo, encoding='utf-8', errors='replace') as stream:
            text = stream.read()
    except OSError:
        return ()
    flags = set()
    for line in text.splitlines():
        if line.split(':')[0].strip() in ('flags', 'Features'):
            flags.update(line.partition(':')[2].split())
    return tuple(flag for flag in BF16_FLAGS if flag in flags)


# The probe's matrix (N, K), its type and the rows of a prefill chunk it multiplies.
PROBE_SHAPE, PROBE_TYPE, PROBE_ROWS = (1024, 1024), GGMLQuantizationType.Q4_0, 256


@functools.lru_cache(maxsize=None)
def bf16_gemm_speedup() -> float:
    """Return how many times faster a bf16 prefill GEMM on blocks runs than the fp32 one here.

    A prefill chunk of 256 rows through a :class:`Matrix` of random Q4_0 blocks (1024, 1024)
    with each gemm_dtype, the best of 5 after a warm-up each: fp32, the kernels' GEMM on the
    blocks (``gemm_tiled``); bf16, the matrix dequantized, rounded to bf16 and multiplied in
    two bf16 GEMMs (:func:`_split_linear`). A bare bf16 against fp32 GEMM (~4x with AMX)
    left out the dequantization: on the Xeon VM (AMX) ``auto`` chose bf16 and the 1.4 B Q4_K
    file's prefill of 128 tokens took 5.2 s against 2.6 s in fp32 (2026-11-29).
    """
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(*PROBE_SHAPE, generator=generator) * 0.05
    matrix = Matrix(quants.quantize(weight.numpy(), PROBE_TYPE), PROBE_TYPE.name, *PROBE_SHAPE)
    x = torch.randn(PROBE_ROWS, PROBE_SHAPE[1], generator=generator)
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        matrix(x, dtype)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            matrix(x, dtype)
            times.append(time.perf_counter() - start)
        seconds[dtype] = min(times)
    return seconds[torch.float32] / max(seconds[torch.bfloat16], 1e-9)


@functools.lru_cache(maxsize=None)
def auto_prefill_dtype() -> tuple:
    """Return (``float32`` or ``bfloat16``, why) for ``engine.prefill_dtype: auto``, once.

    Without a bf16 dot-product flag: float32, no probe (the same choice every start). With
    one: bfloat16 when :func:`bf16_gemm_speedup` (the two prefill paths on blocks) >=
    BF16_MIN_SPEEDUP, a margin that keeps a choice near 1x from flipping between starts.
    """
    flags = cpu_bf16_flags()
    if not flags:
        return 'float32', 'no bf16 dot products on this CPU (no ' + ', '.join(BF16_FLAGS) + ')'
    speedup = bf16_gemm_speedup()
    dtype = 'bfloat16' if speedup >= BF16_MIN_SPEEDUP else 'float32'
    return dtype, (f'{", ".join(flags)} on this CPU; a bf16 prefill GEMM (dequantized) ran '
                   f'{speedup:.2f}x as fast as fp32 on the blocks (bfloat16 from '
                   f'{BF16_MIN_SPEEDUP}x)')


def prefill_dtype(name: str) -> str:
    """Resolve engine.prefill_dtype ``name`` to ``float32`` or ``bfloat16`` (see auto_...)."""
    if name == 'auto':
        return auto_prefill_dtype()[0]
    if name not in ('float32', 'bfloat16'):
        raise ValueError(f'prefill dtype must be auto, float32 or bfloat16, got {name!r}')
    return name


def dequantize(data: np.ndarray, type_name: str, n_rows: int, k: int) -> np.ndarray:
    """Return a file tensor's weights as fp32, (n_rows, k): gguf's own dequantization.

    data: the file's tensor (GgufFile.tensor): (N, row bytes) uint8 blocks or (N, K) floats
    (BF16 as uint16). The reference every other reading of the blocks is checked against.
    """
    if type_name not in SUPPORTED_TYPES:
        raise ValueError(f'weight type {type_name} is not supported '
                         f'(supported: {", ".join(SUPPORTED_TYPES)})')
    if type_name == 'BF16':
        raw = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
        weights = raw.view(np.float32)
    elif type_name in DENSE_TYPES:
        weights = np.asarray(data, dtype=np.float32)
    else:
        weights = quants.dequantize(np.ascontiguousarray(data), GGMLQuantizationType[type_name])
    return np.ascontiguousarray(weights, dtype=np.float32).reshape(int(n_rows), int(k))


class DenseMatrix:
    """One weight matrix W (N, K) dequantized once and held on ``device`` in ``dtype``.

    The same arguments as :class:`Matrix` (data, GGML type, N, K, row order, bias), plus the
    device and dtype. ``x @ W^T (+ bias)`` is one torch GEMM in ``dtype``. ``packed`` is None:
    the decoder never hands it to the CPU kernels.
    """

    packed = None

    def __init__(self, data: np.ndarray, type_name: str, n_rows: int, k: int,
                 row_order: Optional[np.ndarray] = None, bias: Optional[np.ndarray] = None,
                 device='cpu', dtype: torch.dtype = torch.float32):
        """Dequantize ``data`` (gguf's dequantization, exact) and move it to ``device``."""
        self.n_rows, self.k, self.type_name = int(n_rows), int(k), type_name
        data = np.asarray(data)
        if row_order is not None:
            data = data[row_order]
        weights = torch.from_numpy(dequantize(data, type_name, n_rows, k))
        self.weight = weights.to(device=device, dtype=dtype)
        self.bias = (None if bias is None else
                     torch.from_numpy(np.array(bias, np.float32)).to(device=device, dtype=dtype))
        self.nbytes = self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor, gemm_dtype: Optional[torch.dtype] = None):
        """Return ``x`` (..., K) times W^T plus the bias, (..., N), in ``x``'s dtype.

        The GEMM runs in the weight's dtype (fp32 sums): ``x`` is rounded to it first and
        the output comes back in ``x``'s dtype (fp32 activations, 16-bit weights).
        gemm_dtype: ignored.
        """
        return self.product(x).to(x.dtype)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x`` (..., K) times W^T plus the bias, (..., N), in the weight's dtype."""
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Return rows ``index`` (R,) as fp32 (R, K): an embedding lookup, on the device."""
        index = index.reshape(-1).to(device=self.weight.device, dtype=torch.long)
        return self.weight[index].float()
