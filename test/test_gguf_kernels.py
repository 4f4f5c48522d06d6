"""The C++ GGUF kernels (engine/kernels) against gguf's own dequantization, both paths.

K-quants are checked on their own super-blocks, as the file holds them.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from timebill_ros.engine import kernels
from timebill_ros.engine.model_source import embedded_gguf_path

TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
         GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0]
# fp32 sums of up to 1536 products in another order than float64's: relative to the largest
# output, well below the 1e-4 that a wrong block (a swapped nibble, a lost minimum) gives.
REL_TOL = 1e-5


def _cpu_flag(flag: str) -> bool:
    """Return whether /proc/cpuinfo lists ``flag`` (False where it cannot be read)."""
    try:
        return f' {flag}' in open('/proc/cpuinfo').read()
    except OSError:
        return False


@pytest.fixture(scope='module', params=['native', 'avx2'])
def gemm(request):
    """Return the kernels as built here, and on an AVX-512 CPU the AVX2 path (8-row groups)."""
    if request.param == 'native':
        return kernels.load()
    if not _cpu_flag('avx512f'):
        pytest.skip('no AVX-512 here: the native build is the AVX2 path')
    return kernels.load(extra_cflags=('-mno-avx512f',))


def _blocks(qtype, n_rows, k, seed):
    """Return (blocks (N, row bytes) uint8 tensor, weights (N, K) float64) of random weights."""
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal((n_rows, k)) * 0.05 + rng.uniform(-0.02, 0.02, (n_rows, 1)))
    blocks = quantize(weights.astype(np.float32), qtype)
    return torch.from_numpy(blocks.copy()), dequantize(blocks, qtype).astype(np.float64)


def _gemm(gemm, x, blocks, qtype, portable):
    """Return x W^T through the kernels' layout: ``blocks`` (N, row bytes) packed, then used."""
    packed = gemm.pack(blocks, qtype, x.shape[1])
    return gemm.gemm(x, packed, qtype, blocks.shape[0], portable)


def _rel_error(y, x, weights):
    ref = x.double().numpy() @ weights.T
    return float(np.abs(y.double().numpy() - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize('qtype', TYPES, ids=lambda t: t.name)
def test_dequantize_is_bit_exact_to_gguf(gemm, qtype):
    blocks, weights = _blocks(qtype, 24, 96, seed=int(qtype))
    assert torch.equal(gemm.dequantize(blocks, int(qtype), 96),
                       torch.from_numpy(weights.astype(np.float32)))


@pytest.mark.parametrize('portable', [False, True], ids=['native', 'portable'])
@pytest.mark.parametrize('qtype', TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize('rows', [1, 2, 3, 5, 8])
def test_gemm_multiplies_the_dequantized_weights(gemm, qtype, rows, portable):
    blocks, weights = _blocks(qtype, 200, 576, seed=rows)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
    y = _gemm(gemm, x, blocks, int(qtype), portable)
    assert y.shape == (rows, 200) and y.dtype == torch.float32
    assert _rel_error(y, x, weights) < REL_TOL


@pytest.mark.parametrize('qtype', TYPES, ids=lambda t: t.name)
def test_unpack_rows_is_bit_exact_to_gguf(gemm, qtype):
    """Any rows of a packed matrix (an embedding lookup, or all for a prefill) are gguf's."""
    blocks, weights = _blocks(qtype, 37, 64, seed=int(qtype) + 7)
    packed = gemm.pack(blocks, int(qtype), 64)
    rows = torch.tensor([36, 0, 17, 17, 5], dtype=torch.long)
    out = gemm.unpack_rows(packed, int(qtype), 64, 37, rows)
    assert torch.equal(out, torch.from_numpy(weights.astype(np.float32))[rows])
    everything = gemm.unpack_rows(packed, int(qtype), 64, 37, torch.arange(37))
    assert torch.equal(everything, torch.from_numpy(weights.astype(np.float32)))
    with pytest.raises(RuntimeError, match='row 37 is not in'):
        gemm.unpack_rows(packed, int(qtype), 64, 37, torch.tensor([37]))


@pytest.mark.parametrize('portable', [False, True], ids=['native', 'portable'])
@pytest.mark.parametrize('n_rows', [1, 7, 17, 203])
def test_rows_not_a_whole_group(gemm, n_rows, portable):
    """The last group of weight rows may be partial: its outputs are right, none past N."""
    qtype = GGMLQuantizationType.Q4_1
    group = gemm.group_rows()
    assert group in (8, 16)
    blocks, weights = _blocks(qtype, n_rows, 128, seed=n_rows)
    packed = gemm.pack(blocks, int(qtype), 128)
    assert packed.shape == (-(-n_rows // group), 128 // 32 * group * 20)
    assert packed.numel() - blocks.numel() < group * blocks.shape[1]
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(n_rows))
    y = gemm.gemm(x, packed, int(qtype), n_rows, portable)
    assert y.shape == (5, n_rows)
    assert _rel_error(y, x, weights) < REL_TOL


def test_a_wrong_weight_is_seen(gemm):
    """The tolerance catches one block read wrong (the test can fail)."""
    qtype = GGMLQuantizationType.Q4_1
    blocks, weights = _blocks(qtype, 64, 256, seed=7)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(7))
    broken = blocks.clone()
    broken[3, 4:20] = broken[3, 4:20] ^ 0x11  # flip a nibble of every code in one block
    assert _rel_error(_gemm(gemm, x, broken, int(qtype), False), x, weights) > REL_TOL * 10


def test_the_embedded_models_matrices(gemm):
    """Q4_1 layers and the Q8_0 embedding / LM head of the embedded GGUF, both paths."""
    reader = GGUFReader(embedded_gguf_path())
    wanted = ('token_embd.weight', 'blk.0.attn_q.weight', 'blk.0.ffn_down.weight')
    for tensor in (t for t in reader.tensors if t.name in wanted):
        blocks = torch.from_numpy(np.array(tensor.data))
        weights = dequantize(np.array(tensor.data), tensor.tensor_type).astype(np.float64)
        k = int(tensor.shape[0])
        x = torch.randn(4, k, generator=torch.Generator().manual_seed(k))
        for portable in (False, True):
            y = _gemm(gemm, x, blocks, int(tensor.tensor_type), portable)
            assert _rel_error(y, x, weights) < REL_TOL, (tensor.name, portable)


def test_bad_inputs_are_refused(gemm):
    blocks, _ = _blocks(GGMLQuantizationType.Q4_1, 8, 64, seed=1)
    q4_1 = int(GGMLQuantizationType.Q4_1)
    packed = gemm.pack(blocks, q4_1, 64)
    with pytest.raises(RuntimeError, match='1 to 8 rows'):
        gemm.gemm(torch.zeros(9, 64), packed, q4_1, 8, False)
    with pytest.raises(RuntimeError, match='do not hold'):
        gemm.gemm(torch.zeros(1, 96), packed, q4_1, 8, False)
    with pytest.raises(RuntimeError, match='do not hold'):  # one group more than packed
        gemm.gemm(torch.zeros(1, 64), packed, q4_1, gemm.group_rows() + 1, False)
    with pytest.raises(RuntimeError, match='unsupported GGML type'):
        gemm.gemm(torch.zeros(1, 64), packed, 112, 8, False)  # no longer a type (repacked Q4_K)
    with pytest.raises(RuntimeError, match='float32'):
        gemm.gemm(torch.zeros(1, 64, dtype=torch.float64), packed, q4_1, 8, False)
    with pytest.raises(RuntimeError, match='blocks must be a contiguous'):
        gemm.pack(blocks, q4_1, 96)


def test_the_build_key_names_the_cpu_and_the_source(monkeypatch):
    key = kernels.build_key()
    assert len(key) == 16
    monkeypatch.setattr(kernels, '_cpu_id', lambda: 'another CPU')
    assert kernels.build_key() != key


# K-quants: read from the file's own 256-weight super-blocks; random rows from conftest's
# kquant_rows.
KQUANTS = [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K]
KQUANT_BYTES = {GGMLQuantizationType.Q4_K: 144, GGMLQuantizationType.Q5_K: 176,
                GGMLQuantizationType.Q6_K: 210}


def _kquant_blocks(kquant_rows, qtype, n_rows, k, seed):
    """Return (blocks tensor, weights (N, K) float64) of random K-quant rows."""
    raw = kquant_rows(qtype, n_rows, k, seed)
    weights = dequantize(raw, qtype).astype(np.float64)
    return torch.from_numpy(raw), weights


@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
def test_kquants_dequantize_bit_exactly_to_gguf(gemm, kquant_rows, qtype):
    """Every bit, signed zeros included, for any finite fp16 d / dmin: d sc q is exact."""
    assert kernels.QTYPES[qtype.name] == int(qtype)
    for seed, wild in ((int(qtype), True), (int(qtype) + 1, False)):
        raw = kquant_rows(qtype, 48, 768, seed, wild)
        assert raw.shape == (48, 768 // 256 * KQUANT_BYTES[qtype])
        blocks = torch.from_numpy(raw)
        ours = gemm.dequantize(blocks, int(qtype), 768).numpy()
        ref = dequantize(raw, qtype)
        assert ours.shape == ref.shape == (48, 768) and np.isfinite(ref).all()
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (qtype.name, wild)
        packed = gemm.pack(blocks, int(qtype), 768)
        assert packed.numel() == -(-48 // gemm.group_rows()) * gemm.group_rows() * raw.shape[1]
        rows = torch.tensor([47, 0, 13, 8], dtype=torch.long)
        unpacked = gemm.unpack_rows(packed, int(qtype), 768, 48, rows).numpy()
        assert np.array_equal(unpacked.view(np.uint32), ref[[47, 0, 13, 8]].view(np.uint32))


@pytest.mark.parametrize('portable', [False, True], ids=['native', 'portable'])
@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize('rows', [1, 2, 3, 8])
def test_gemm_multiplies_the_kquant_weights(gemm, kquant_rows, qtype, rows, portable):
    blocks, weights = _kquant_blocks(kquant_rows, qtype, 200, 1536, seed=rows)
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(rows))
    y = _gemm(gemm, x, blocks, int(qtype), portable)
    assert y.shape == (rows, 200) and y.dtype == torch.float32
    assert _rel_error(y, x, weights) < REL_TOL


@pytest.mark.parametrize('rows', [1, 2])
@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
def test_kquant_decoding_keeps_every_span_of_x(gemm, kquant_rows, qtype, rows):
    """Spans of x of wildly different sizes, zeros, one outlier: fp32's error, span by span.

    The AVX-512 VNNI decoding path writes each 32-value span of x as three 8-bit parts of
    its own scale; a span at 1e-6 of another, an all-zero span and a lone outlier must each
    be multiplied as fp32 would. Each output is checked against a sum over its own span only
    (the other spans' x zeroed), so a span rounded to nothing shows.
    """
    k = 1024
    blocks, weights = _kquant_blocks(kquant_rows, qtype, 48, k, seed=rows)
    base = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    scales = {0: 1.0, 1: 1e-6, 2: 0.0, 3: 1e3, 5: 3e-4}
    for span, scale in scales.items():
        x = torch.zeros(rows, k)
        x[:, span * 32:(span + 1) * 32] = base[:, span * 32:(span + 1) * 32] * scale
        if span == 5:
            x[:, span * 32 + 7] = 2e4  # one value far above the span's others
        y = _gemm(gemm, x, blocks, int(qtype), False)
        if scale == 0.0:
            assert torch.count_nonzero(y) == 0
        else:
            assert _rel_error(y, x, weights) < REL_TOL, (span, scale)


# Byte ranges of one super-block whose misreading must show: (first, end) of each field.
KQUANT_FIELDS = {
    GGMLQuantizationType.Q4_K: {'d': (0, 2), 'dmin': (2, 4), 'scales 0-3': (4, 8),
                                'scales 4-7': (8, 16), 'nibbles 4-7': (80, 144)},
    GGMLQuantizationType.Q5_K: {'d': (0, 2), 'dmin': (2, 4), 'scales 4-7': (8, 16),
                                'fifth bits': (16, 48), 'nibbles 0-1': (48, 80)},
    GGMLQuantizationType.Q6_K: {'ql second half': (64, 128), 'qh': (128, 192),
                                'scales': (192, 208), 'd': (208, 210)}}


@pytest.mark.parametrize('portable', [False, True], ids=['native', 'portable'])
@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
def test_a_wrong_kquant_field_is_seen(gemm, kquant_rows, qtype, portable):
    """Each field of row 3's second super-block read wrong breaks the bound."""
    blocks, weights = _kquant_blocks(kquant_rows, qtype, 64, 512, seed=7)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(7))
    assert _rel_error(_gemm(gemm, x, blocks, int(qtype), portable), x, weights) < REL_TOL
    start = KQUANT_BYTES[qtype]  # the second super-block of the row
    for field, (first, end) in KQUANT_FIELDS[qtype].items():
        broken = blocks.clone()
        broken[3, start + first:start + end] ^= 0x5a
        error = _rel_error(_gemm(gemm, x, broken, int(qtype), portable), x, weights)
        assert error > REL_TOL * 10, field


def test_kquants_need_whole_super_blocks(gemm, kquant_rows):
    raw = torch.from_numpy(kquant_rows(GGMLQuantizationType.Q4_K, 4, 512, seed=1))
    q4_k = int(GGMLQuantizationType.Q4_K)
    with pytest.raises(RuntimeError, match='multiple of 256 .* got 480'):
        gemm.pack(raw[:, :-9].contiguous(), q4_k, 480)
    with pytest.raises(RuntimeError, match='multiple of 256 .* got 96'):
        gemm.gemm(torch.zeros(1, 96), raw, q4_k, 32, False)
    with pytest.raises(RuntimeError, match='multiple of 256 .* got 96'):
        gemm.dequantize(raw, q4_k, 96)
    with pytest.raises(RuntimeError, match=r'\(N, 288\) uint8'):  # K = 512: two super-blocks
        gemm.pack(raw[:, :-9].contiguous(), q4_k, 512)


def test_threads_of_their_own_and_any_thread_count(gemm):
    """Each calling thread runs on its own worker pool of its own torch thread count.

    Four threads at once (the GIL is released inside the kernel), each with another thread
    count and many calls, give the single-threaded result: rows are split, never summed
    across threads, so the result is bit-identical whatever the split.
    """
    import threading
    rows, _ = _blocks(GGMLQuantizationType.Q4_1, 300, 512, seed=3)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    q4_1 = int(GGMLQuantizationType.Q4_1)
    blocks = gemm.pack(rows, q4_1, 512)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        expected = gemm.gemm(x, blocks, q4_1, 300, False)
    finally:
        torch.set_num_threads(before)
    failures = []

    def run(n_threads):
        torch.set_num_threads(n_threads)
        for _ in range(200):
            if not torch.equal(gemm.gemm(x, blocks, q4_1, 300, False), expected):
                failures.append(n_threads)
                return

    workers = [threading.Thread(target=run, args=(n,)) for n in (1, 2, 3, 4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert failures == []


def test_a_tensor_off_the_cpu_is_refused_not_dereferenced(gemm):
    """Each entry point checks its tensors' device (a GPU tensor's pointer would crash).

    ``meta`` tensors stand in for CUDA ones: not on the CPU, no memory behind them.
    """
    qtype = GGMLQuantizationType.Q4_1
    blocks, _ = _blocks(qtype, 64, 256, seed=3)
    packed = gemm.pack(blocks, int(qtype), 256)
    x = torch.randn(1, 256)
    off = {'x': x.to('meta'), 'packed': packed.to('meta'), 'blocks': blocks.to('meta')}
    with pytest.raises(RuntimeError, match='x must be a CPU tensor'):
        gemm.gemm(off['x'], packed, int(qtype), 64, False)
    with pytest.raises(RuntimeError, match='blocks must be a CPU tensor'):
        gemm.gemm(x, off['packed'], int(qtype), 64, False)
    with pytest.raises(RuntimeError, match='blocks must be a CPU tensor'):
        gemm.pack(off['blocks'], int(qtype), 256)
    with pytest.raises(RuntimeError, match='blocks must be a CPU tensor'):
        gemm.dequantize(off['blocks'], int(qtype), 256)
    with pytest.raises(RuntimeError, match='q must be a CPU tensor'):
        gemm.attention_step(torch.empty(1, 64, device='meta'), [torch.empty(1, 1, 4, 64)],
                            [torch.empty(1, 1, 4, 64)], [0], [1], 1, 0.125)
    assert gemm.gemm(x, packed, int(qtype), 64, False).shape == (1, 64)


# The prefill's GEMM (gemm_tiled): any number of rows, on the blocks, a row's result its own.
ALL_TYPES = TYPES + KQUANTS


def _any_blocks(kquant_rows, qtype, n_rows, k, seed):
    if qtype in KQUANTS:
        return _kquant_blocks(kquant_rows, qtype, n_rows, k, seed)
    return _blocks(qtype, n_rows, k, seed)


@pytest.mark.parametrize('portable', [False, True], ids=['native', 'portable'])
@pytest.mark.parametrize('qtype', ALL_TYPES, ids=lambda t: t.name)
def test_the_prefill_gemm_multiplies_any_rows_on_the_blocks(gemm, kquant_rows, qtype, portable):
    k = 768 if qtype in KQUANTS else 608  # 608: 19 blocks of 32, a last panel of 3
    blocks, weights = _any_blocks(kquant_rows, qtype, 203, k, seed=int(qtype))  # 203: partial
    packed = gemm.pack(blocks, int(qtype), k)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(int(qtype)))
    y = gemm.gemm_tiled(x, packed, int(qtype), 203, portable)
    assert y.shape == (70, 203) and _rel_error(y, x, weights) < REL_TOL
    for first, last in ((0, 1), (13, 14), (69, 70), (5, 25), (0, 64)):  # any chunk plan
        part = gemm.gemm_tiled(x[first:last].contiguous(), packed, int(qtype), 203, portable)
        assert torch.equal(part, y[first:last]), (first, last)
    threads = torch.get_num_threads()
    try:  # one thread takes every group (in pairs), three split them unevenly: the same bits
        for n_threads in (1, 3):
            torch.set_num_threads(n_threads)
            assert torch.equal(gemm.gemm_tiled(x, packed, int(qtype), 203, portable), y)
    finally:
        torch.set_num_threads(threads)


def test_the_kquant_prefill_runs_on_amx_tiles_where_the_cpu_has_them(gemm):
    """An AMX CPU (amx_int8 in /proc/cpuinfo) takes the tiles' path, not a silent fallback."""
    native = gemm.simd_path() == 'avx512' and _cpu_flag('avx512_vnni') and _cpu_flag(
        'avx512vbmi')
    assert gemm.amx_prefill() == (native and _cpu_flag('amx_int8'))


@pytest.mark.parametrize('rows', [1, 17, 40])
@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
def test_the_prefill_gemm_keeps_every_span_of_x(gemm, kquant_rows, qtype, rows):
    """Spans of wildly different sizes, zeros and an outlier inside one super-block of x.

    The AMX prefill (Q4_K, Q6_K) writes each token's 256 values over a super-block as three 8-bit
    parts of one scale: a span at 1e-6 of its neighbours must still be multiplied as fp32
    would, alone (its output against its own sum) and beside the large ones.
    """
    k = 512
    blocks, weights = _kquant_blocks(kquant_rows, qtype, 40, k, seed=rows)
    packed = gemm.pack(blocks, int(qtype), k)
    base = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    scales = torch.tensor([1.0, 1e-6, 0.0, 1e3, 3e-4, 1.0, 1e-3, 1.0] * 2).repeat_interleave(32)
    mixed = base * scales
    mixed[:, 5 * 32 + 7] = 2e4  # one value far above its span's others
    mixed[-1] = 0.0  # an all-zero token
    y = gemm.gemm_tiled(mixed, packed, int(qtype), 40, False)
    assert torch.count_nonzero(y[-1]) == 0
    if rows == 1:  # the one token is the all-zero one
        return
    assert _rel_error(y[:-1], mixed[:-1], weights) < REL_TOL
    for span in (1, 4, 6):  # a small span alone (the last token zero): its own output's scale
        x = torch.zeros(rows, k)
        x[:, span * 32:(span + 1) * 32] = mixed[:, span * 32:(span + 1) * 32]
        alone = gemm.gemm_tiled(x, packed, int(qtype), 40, False)
        assert _rel_error(alone[:-1], x[:-1], weights) < REL_TOL, span


@pytest.mark.parametrize('qtype', KQUANTS, ids=lambda t: t.name)
def test_a_long_prefill_chunk_is_one_row_at_a_time(gemm, kquant_rows, qtype):
    """600 rows: past the AMX path's 512-token block, each row still its own bits."""
    k = 512
    blocks, weights = _kquant_blocks(kquant_rows, qtype, 40, k, seed=5)
    packed = gemm.pack(blocks, int(qtype), k)
    x = torch.randn(600, k, generator=torch.Generator().manual_seed(5))
    y = gemm.gemm_tiled(x, packed, int(qtype), 40, False)
    assert _rel_error(y, x, weights) < REL_TOL
    for first, last in ((511, 513), (520, 521), (580, 600)):
        part = gemm.gemm_tiled(x[first:last].contiguous(), packed, int(qtype), 40, False)
        assert torch.equal(part, y[first:last]), (first, last)


def test_the_prefill_gemm_checks_its_inputs(gemm):
    blocks, _ = _blocks(GGMLQuantizationType.Q4_1, 16, 64, seed=1)
    q4_1 = int(GGMLQuantizationType.Q4_1)
    packed = gemm.pack(blocks, q4_1, 64)
    with pytest.raises(RuntimeError, match='at least one row'):
        gemm.gemm_tiled(torch.zeros(0, 64), packed, q4_1, 16, False)
    with pytest.raises(RuntimeError, match='do not hold'):
        gemm.gemm_tiled(torch.zeros(3, 96), packed, q4_1, 16, False)
    with pytest.raises(RuntimeError, match='float32'):
        gemm.gemm_tiled(torch.zeros(3, 64, dtype=torch.float64), packed, q4_1, 16, False)
