"""Repack a GGUF file's K-quants (Q4_K, Q5_K, Q6_K) into the kernels' 32-weight formats.

A K-quant super-block holds 256 weights under one fp16 ``d`` (and ``dmin``) with 6-bit (Q4_K,
Q5_K: scale ``sc`` and minimum ``m`` per 32 weights) or int8 (Q6_K: scale per 16 weights)
sub-block scales. gguf's reference dequantization computes, in fp32,
``w = (d * sc) * q - dmin * m`` (Q6_K: ``(d * sc) * (q - 32)``). Repacking folds the scales
once, here, with the same fp32 products: each 32 weights get ``scale = d * sc`` and
``min = -(dmin * m)`` (exact: an fp16 times a 6- or 8-bit integer fits fp32's 24 bits), and
the kernels compute ``w = scale * code + min``: ``scale * code`` is exact too, so the one
rounding left is gguf's own and the weights are gguf's bit for bit (test_gguf_kernels.py).

Formats (engine/kernels/__init__.py, gguf_gemm.cpp), per 32 weights:

* Q4_K -> ``Q4_K_R`` (112): fp32 scale, fp32 min, 16 bytes of 4-bit codes (byte j: weight j in
  the low nibble, j + 16 in the high one, as Q4_1): 24 bytes, 0.75 a weight (Q4_K: 0.5625).
* Q5_K -> ``Q5_K_R`` (113): fp32 scale, fp32 min, 32 int8 codes 0..31: 40 bytes, 1.25 a weight
  (Q5_K: 0.6875).
* Q6_K -> ``Q6_K_R`` (114): fp32 scales of weights 0-15 and 16-31, 32 int8 codes -32..31: 40
  bytes, 1.25 a weight (Q6_K: 0.8203). Q6_K has no minimum, so none is stored: a generic
  scale-and-min-per-16 int8 format would take 48 bytes a block for the same weights.
"""

from typing import Optional, Tuple

import numpy as np

from timebill_ros.engine.kernels import Q4_K_R, Q5_K_R, Q6_K_R

QK_K = 256  # weights per super-block
QK = 32  # weights per repacked block
# GGML type id -> (name, repacked type id, bytes of one super-block).
SOURCES = {12: ('Q4_K', Q4_K_R, 144), 13: ('Q5_K', Q5_K_R, 176), 14: ('Q6_K', Q6_K_R, 210)}
GGML_IDS = {name: ggml_id for ggml_id, (name, _, _) in SOURCES.items()}  # 'Q4_K' -> 12


def repack(data: np.ndarray, ggml_type: int,
           k: Optional[int] = None) -> Tuple[int, np.ndarray]:
    """Return (kernel type id, blocks (N, K / 32 * block bytes) uint8) of K-quant rows.

    data: (N, row bytes) uint8, each row K / 256 super-blocks of GGML type ``ggml_type``
    (12, 13 or 14); k: the rows' weight count when known (checked). The result owns its memory.
    ValueError for another type, or when K is not a multiple of 256.
    """
    if ggml_type not in SOURCES:
        raise ValueError(f'GGML type {ggml_type} is not a K-quant the kernels read '
                         f'({", ".join(f"{n} = {t}" for t, (n, _, _) in SOURCES.items())})')
    name, qtype, sb_bytes = SOURCES[ggml_type]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2:
        raise ValueError(f'{name} blocks must be (N, row bytes), got shape {data.shape}')
    n_rows, row_bytes = data.shape
    if k is not None and k % QK_K:
        raise ValueError(f'K must be a multiple of {QK_K} for {name}, got {k}')
    if row_bytes % sb_bytes or (k is not None and row_bytes != k // QK_K * sb_bytes):
        raise ValueError(f'rows of {row_bytes} bytes are not whole {name} super-blocks of '
                         f'{sb_bytes} bytes ({QK_K} weights)'
                         + ('' if k is None else f' holding K = {k}'))
    blocks = data.reshape(-1, sb_bytes)  # one super-block a row
    if ggml_type == 14:
        scales, codes = _q6_k(blocks)
    else:
        scales, mins, codes = _q4_k_q5_k(blocks, ggml_type == 13)
        scales = np.stack([scales, mins], axis=-1)  # (n, 8, 2): scale, min of each 32
    # codes: (n, 8, 32) uint8 / int8, one row of 32 per repacked block.
    codes = codes.reshape(-1, QK)
    if ggml_type == 12:
        codes = codes[:, :QK // 2] | (codes[:, QK // 2:] << np.uint8(4))
    params = np.ascontiguousarray(scales, dtype=np.float32).reshape(-1, 2).view(np.uint8)
    out = np.concatenate([params, codes.view(np.uint8)], axis=1)
    return qtype, out.reshape(n_rows, -1)


def _fp16(column: np.ndarray) -> np.ndarray:
    """Return (n, 2) uint8 little-endian halves as (n, 1) float32."""
    return np.ascontiguousarray(column).view('<f2').astype(np.float32)


def _scale_min_k4(scales: np.ndarray):
    """Return the 8 six-bit scales and minima (n, 8) uint8 of Q4_K / Q5_K's 12 scale bytes."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _q4_k_q5_k(blocks: np.ndarray, five_bits: bool):
    """Return (scale (n, 8) fp32, min (n, 8) fp32, codes (n, 8, 32) uint8) of super-blocks."""
    n = blocks.shape[0]
    d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    scale = d * sc.astype(np.float32)  # gguf's fp32 products, exact
    minimum = -(dmin * mn.astype(np.float32))
    qs = blocks[:, -QK_K // 2:]  # 32 bytes: low nibbles sub-block 2i, high ones 2i + 1
    shifts = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = ((qs.reshape(n, 4, 1, QK) >> shifts) & np.uint8(0x0F)).reshape(n, 8, QK)
    if five_bits:  # bit i of byte j: the fifth bit of weight j of sub-block i
        qh = blocks[:, 16:16 + QK_K // 8]
        bits = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        codes = codes | (((qh.reshape(n, 1, QK) >> bits) & np.uint8(1)) << np.uint8(4))
    return scale, minimum, codes


def _q6_k(blocks: np.ndarray):
    """Return (scales (n, 8, 2) fp32, codes (n, 8, 32) int8 in -32..31) of Q6_K super-blocks.

    scales[:, i] are the scales of weights 0-15 and 16-31 of the i-th 32; the bit layout is
    unpacked as gguf's dequantization does.
    """
    n = blocks.shape[0]
    ql, qh = blocks[:, :QK_K // 2], blocks[:, QK_K // 2:QK_K // 2 + QK_K // 4]
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
    d = _fp16(blocks[:, 208:210])
    scales = (d * sc).reshape(n, 8, 2)
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & np.uint8(0x0F)).reshape(n, 8, QK)
    high = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (high & np.uint8(0x03)).reshape(n, 8, QK)
    codes = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    return scales, codes
