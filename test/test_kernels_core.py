"""The kernels' torch-free core (gguf_core.h) checked as a program, here and on the ARM cores.

test/kernels/check_kernels.cpp runs the exactness checks of test_gguf_kernels.py without torch,
on vectors made here from gguf's own quantize / dequantize (the K-quants: random super-blocks).
It is built three ways: with the host's compiler for this CPU; for plain x86-64 (the portable
path and the scalar attention); and for AArch64 with Debian's cross compiler
(g++-aarch64-linux-gnu), run under qemu-aarch64 (qemu-user): the NEON path a Jetson runs. On an
ARM machine the native build is the NEON one. The CI installs the cross compiler and qemu
(.ci/run); elsewhere the AArch64 test is skipped when they are missing, and fails under CI.
"""

import os
import pathlib
import platform
import shutil
import struct
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from timebill_ros.engine import kernels

HERE = pathlib.Path(__file__).parent
PROGRAM = HERE / 'kernels' / 'check_kernels.cpp'
CORE_DIR = kernels.CORE.parent
TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
         GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0]
KQUANTS = [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K]
CROSS = 'aarch64-linux-gnu-g++'
QEMU = 'qemu-aarch64'
ARM_SYSROOT = '/usr/aarch64-linux-gnu'  # Debian's cross libc and libstdc++ for qemu's loader
FLAGS = ['-std=c++17', '-O2', '-fopenmp-simd', '-pthread', f'-I{CORE_DIR}']


def _case(qtype, blocks, weights, x):
    """Return one case's bytes: header, blocks, float32 weights, x and float64 y = x W^T."""
    n_rows, k = weights.shape
    y = x.astype(np.float64) @ weights.astype(np.float64).T
    head = struct.pack('<4q', int(qtype), n_rows, k, x.shape[0])
    return b''.join([head, np.ascontiguousarray(blocks, np.uint8).tobytes(),
                     np.ascontiguousarray(weights, np.float32).tobytes(),
                     np.ascontiguousarray(x, np.float32).tobytes(),
                     np.ascontiguousarray(y, np.float64).tobytes()])


@pytest.fixture(scope='module')
def vectors(tmp_path_factory, kquant_rows):
    """Write every block type's case (gguf's weights as the expected ones); return its path."""
    rng = np.random.default_rng(5)
    cases = []
    for qtype in TYPES:  # 203 rows: a partial last group of 8 or 16
        weights = rng.standard_normal((203, 576)) * 0.05 + rng.uniform(-0.02, 0.02, (203, 1))
        blocks = quantize(weights.astype(np.float32), qtype)
        x = rng.standard_normal((8, 576)).astype(np.float32)
        cases.append(_case(qtype, blocks, dequantize(blocks, qtype), x))
    for qtype in KQUANTS:
        raw = kquant_rows(qtype, 75, 512, int(qtype))
        x = rng.standard_normal((8, 512)).astype(np.float32)
        cases.append(_case(qtype, raw, dequantize(raw, qtype), x))
    path = tmp_path_factory.mktemp('kernel_vectors') / 'vectors.bin'
    path.write_bytes(b'TBKV' + struct.pack('<ii', 1, len(cases)) + b''.join(cases))
    return path


def _build(compiler, flags, out):
    done = subprocess.run([compiler, *FLAGS, *flags, str(PROGRAM), '-o', str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _run(command, vectors, threads=1):
    done = subprocess.run([*command, str(vectors), str(threads)], capture_output=True,
                          text=True, timeout=900)
    return done.returncode, done.stdout


def _passes(code, output, path):
    failed = [line for line in output.splitlines() if line.startswith('FAIL')]
    assert code == 0 and not failed, '\n'.join(failed) or output[-3000:]
    assert output.splitlines()[-1].startswith(f'PASS simd={path}')
    return output


def _native_path():
    if platform.machine().lower() in ('aarch64', 'arm64'):
        return 'neon'
    flags = open('/proc/cpuinfo').read() if os.path.exists('/proc/cpuinfo') else ''
    return 'avx512' if ' avx512f' in flags else 'avx2' if ' avx2' in flags else 'portable'


@pytest.fixture(scope='module')
def native(tmp_path_factory):
    march = '-mcpu=native' if _native_path() == 'neon' else '-march=native'
    return _build('c++', [march], tmp_path_factory.mktemp('native') / 'check_kernels')


def test_the_native_build_passes_with_one_and_three_threads(native, vectors):
    path = _native_path()
    output = _passes(*_run([str(native)], vectors, 1), path)
    assert output.count('\nok ') >= 8 * 20  # every type's checks ran, not just the last line
    _passes(*_run([str(native)], vectors, 3), path)


@pytest.mark.skipif(platform.machine() != 'x86_64', reason='the portable build is for x86-64')
def test_the_portable_build_passes(tmp_path, vectors):
    """Plain x86-64 (no AVX2): the scalar GEMM and attention are checked by the same bounds."""
    program = _build('c++', ['-march=x86-64'], tmp_path / 'check_portable')
    _passes(*_run([str(program)], vectors), 'portable')


def test_a_wrong_expected_weight_fails_the_check(native, vectors, tmp_path):
    """The program can fail: one weight of gguf's changed by an ulp is not bit-exact."""
    data = bytearray(vectors.read_bytes())
    first_weights = 12 + 32 + 203 * 576 // 32 * 18  # after Q4_0's 18-byte blocks
    data[first_weights] ^= 1
    broken = tmp_path / 'broken.bin'
    broken.write_bytes(bytes(data))
    code, output = _run([str(native)], broken)
    assert code == 1
    assert 'FAIL type 2: dequantize bit-exact' in output


def _cross_tools():
    missing = [tool for tool in (CROSS, QEMU) if shutil.which(tool) is None]
    if missing and os.environ.get('CI'):
        pytest.fail(f'{missing} missing: the CI installs g++-aarch64-linux-gnu and qemu-user')
    if missing:
        pytest.skip(f'{missing} not installed (apt install g++-aarch64-linux-gnu qemu-user)')


def test_the_aarch64_neon_build_passes_under_qemu(tmp_path, vectors):
    """The NEON path as a Jetson compiles it (ARMv8.2-A), run under qemu-aarch64."""
    _cross_tools()
    program = _build(CROSS, ['-march=armv8.2-a'], tmp_path / 'check_aarch64')
    header = open(program, 'rb').read(20)
    assert header[:4] == b'\x7fELF' and struct.unpack('<H', header[18:20])[0] == 183  # AArch64
    command = [QEMU, '-L', ARM_SYSROOT, str(program)]
    output = _passes(*_run(command, vectors, 1), 'neon')
    assert 'group=8' in output.splitlines()[-1]
    _passes(*_run(command, vectors, 3), 'neon')
