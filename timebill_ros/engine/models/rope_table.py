"""RoPE's cos / sin rows of every position seen so far, computed once and looked up after.

Why a table: torch's ``cos`` / ``sin`` on a CPU call MKL's vector maths, whose threader opens
an OpenMP region for every call, even of one position's 128 angles. After a region libgomp's
workers spin for milliseconds on the cores the kernels' own threads decode on: the first layer
of every decoding step ran up to ~8 ms late on the 1.4 B Q4_K file (2 x86 cores; with the spinning
turned off, ``GOMP_SPINCOUNT``, it did not: benchmarks/results/rope_table/README.md). A decoding
step looks its rows up instead; the table grows (by doubling) when a position passes its end.

The rows are the same bits as computing the angles of those positions directly (elementwise
ops; test_gguf_models.py checks it), so a table changes no answer.

Shapes: P = positions held, D = head dim.
"""

import functools
import threading
from typing import Callable, Tuple

import torch

MIN_POSITIONS = 256  # rows of a new table (positions)


class RopeTable:
    """cos / sin of positions [0, P) of one RoPE base, grown on demand (CPU tensors).

    angles(positions (n,) int64) -> (cos, sin) each (n, D) fp32: the direct computation
    (Rope.angles with the base's inverse frequencies). Twin decoders share a table
    across threads: the two tensors are swapped as one pair, grown under a lock.
    """

    def __init__(self, angles: Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]):
        """Hold no rows until the first lookup."""
        self._angles = angles
        self._pair = None  # (cos (P, D), sin (P, D))
        self._lock = threading.Lock()

    @property
    def n_positions(self) -> int:
        """Positions the table holds (P)."""
        pair = self._pair
        return 0 if pair is None else pair[0].shape[0]

    def rows(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return cos, sin of ``positions`` (n,) int64 >= 0, each (n, D) fp32.

        A run of consecutive positions (a prefill, one goal's step) gets views of the rows;
        any other set is gathered. Plain Python on the positions: no torch op for a step.
        """
        ids = positions.reshape(-1).tolist()
        if not ids:
            raise ValueError('no positions to look up')
        first, last = min(ids), max(ids)
        if first < 0:
            raise ValueError(f'position {first} is negative')
        cos, sin = self._holding(last + 1)
        if ids == list(range(first, last + 1)):
            return cos[first:last + 1], sin[first:last + 1]
        return cos[positions], sin[positions]

    def _holding(self, n_needed: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return the (cos, sin) pair of at least ``n_needed`` positions (a power of two)."""
        pair = self._pair
        if pair is not None and pair[0].shape[0] >= n_needed:
            return pair
        with self._lock:
            held = self.n_positions
            if held < n_needed:
                size = max(MIN_POSITIONS, held)
                while size < n_needed:
                    size *= 2
                cos, sin = self._angles(torch.arange(held, size))
                if held:
                    cos, sin = torch.cat((self._pair[0], cos)), torch.cat((self._pair[1], sin))
                self._pair = (cos, sin)
            return self._pair


class Rope:
    """A decoder's rotary position angles: per-layer bases, inverse frequencies, cos / sin.

    spec: the decoder's ModelSpec (head_dim, rope_base, rope_base_local, rope_factors,
    rope_linear, is_sliding). device: where the angles are used. tabled: look rows up in a
    RopeTable per base (the CPU blocks path) instead of computing them in each pass (the
    dense path, whose CUDA graph replays the computation). D = head dim.
    """

    def __init__(self, spec, device: torch.device, tabled: bool):
        """Compute the inverse frequencies of each base; make the tables when ``tabled``."""
        self.spec = spec
        self.device = device
        self.inv_freq = {base: self.inverse_frequencies(base).to(device)
                         for base in {spec.rope_base, spec.rope_base_local} if base}
        self.tables = {base: RopeTable(functools.partial(self.angles, inv))
                       for base, inv in self.inv_freq.items()} if tabled else None

    def inverse_frequencies(self, base: float) -> torch.Tensor:
        """Return RoPE's inverse frequencies (D / 2,), as transformers computes them."""
        dim = self.spec.head_dim
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.spec.rope_factors is not None:
            inv = inv / torch.tensor(self.spec.rope_factors, dtype=torch.float32)
        return inv

    def base_of(self, layer_idx: int) -> float:
        """Return layer ``layer_idx``'s RoPE base (sliding layers may have their own)."""
        if self.spec.is_sliding(layer_idx) and self.spec.rope_base_local:
            return self.spec.rope_base_local
        return self.spec.rope_base

    def at(self, positions: torch.Tensor) -> dict:
        """Return {base: (cos, sin)} of ``positions`` (n,), each (n, D) fp32, once a pass.

        On the device: looked up in the tables when tabled, else computed (the same bits).
        """
        positions = positions.to(self.device)
        if self.tables is not None:
            return {base: table.rows(positions) for base, table in self.tables.items()}
        return {base: self.angles(inv, positions) for base, inv in self.inv_freq.items()}

    def angles(self, inv: torch.Tensor, positions: torch.Tensor):
        """Return cos, sin of ``positions`` (n,) for inverse frequencies ``inv``, (n, D)."""
        pos = positions.float()
        if self.spec.rope_linear != 1.0:
            pos = pos / self.spec.rope_linear
        # transformers' (D/2, 1) @ (1, n) matmul holds one product a value: the same bits as
        # the elementwise product, without a GEMM call (and its OpenMP region) a step.
        freqs = pos[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()
