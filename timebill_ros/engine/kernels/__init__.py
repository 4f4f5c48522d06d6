"""Hand-written CPU kernels, compiled on the machine that runs them (gguf_gemm.cpp).

gguf_core.h holds their arithmetic with no torch (AVX2 / AVX-512, NEON and portable paths);
gguf_gemm.cpp binds it to torch tensors and checks them. ``simd_path()`` names the path built.

They multiply fp32 activations by a GGUF file's own blocks: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
(32 weights a block) and the K-quants Q4_K / Q5_K / Q6_K (256-weight super-blocks), read as the
file holds them (type ids below). ``unpack_rows`` dequantizes chosen rows of a packed matrix
(embedding lookups, a prefill's per-matrix weights). ``pack(blocks, type, K)`` lays a matrix's
blocks out once, at load, in the kernels' own order (8 output rows interleaved, 16 where the
build has AVX-512: ``group_rows()``; the same bytes);
``gemm(x, packed, type, N, portable)`` and ``layer_step`` take that.

:func:`load` builds the C++ extension with torch's cpp_extension (g++ and ninja) into
``<cache>/kernels/<key>/`` and imports it. The key hashes the source, torch's version, the
compiler and the CPU (its model and instruction-set flags): the library is compiled with
``-march=native`` (``-mcpu=native`` on ARM), so one built for another CPU is never loaded.
``python -m timebill_ros.engine.kernels`` builds it ahead of time (scripts/build.sh does).
"""

import functools
import hashlib
import pathlib
import platform
import subprocess
import threading

from timebill_ros import paths

SOURCE = pathlib.Path(__file__).with_name('gguf_gemm.cpp')
CORE = SOURCE.with_name('gguf_core.h')  # the torch-free core the binding includes
# GGML type ids of the block formats the kernels read as the file holds them
# (gguf.GGMLQuantizationType). The K-quants need K to be a multiple of 256 (a super-block).
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14
QTYPES = {'Q4_0': Q4_0, 'Q4_1': Q4_1, 'Q5_0': Q5_0, 'Q5_1': Q5_1, 'Q8_0': Q8_0,
          'Q4_K': Q4_K, 'Q5_K': Q5_K, 'Q6_K': Q6_K}
KQUANTS = ('Q4_K', 'Q5_K', 'Q6_K')  # the types of 256-weight super-blocks
MAX_ROWS = 8  # activation rows per kernel call (goals in one decoding step)

_lock = threading.Lock()
_loaded = {}


@functools.lru_cache(maxsize=None)  # read once a process (every matrix loads the kernels)
def _cpu_id() -> str:
    """Return the CPU's model name and instruction-set flags (what -march=native sees)."""
    try:
        text = pathlib.Path('/proc/cpuinfo').read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in text.splitlines()
            if line.split(':')[0].strip() in ('model name', 'flags', 'Features', 'CPU part')]
    return '\n'.join(sorted(set(keep)))


@functools.lru_cache(maxsize=None)  # one `c++ --version` a process, not one a matrix
def _compiler() -> str:
    try:
        return subprocess.run(['c++', '--version'], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return 'unknown'


def build_key(extra_cflags=()) -> str:
    """Return the hex key of this source, flags, torch, compiler and CPU (16 characters)."""
    import torch
    flags = ' '.join(compile_flags(extra_cflags))
    parts = [SOURCE.read_bytes(), CORE.read_bytes(), flags.encode(),
             torch.__version__.encode(),
             _compiler().encode(), platform.machine().encode(), _cpu_id().encode()]
    return hashlib.sha256(b'\0'.join(parts)).hexdigest()[:16]


def _arch_flag() -> str:
    arm = platform.machine().lower() in ('aarch64', 'arm64')
    return '-mcpu=native' if arm else '-march=native'


def compile_flags(extra_cflags=()) -> list:
    """Return the compiler flags (``omp simd`` pragmas only: the threads are the source's)."""
    return ['-O3', _arch_flag(), '-fopenmp-simd', '-pthread'] + list(extra_cflags)


def _source_copy(build_dir) -> pathlib.Path:
    """Return the binding's source copied into ``build_dir`` (with the core it includes).

    ninja's build file names the source by path: compiled from the checkout, every clone (CI,
    a worktree) rebuilt an entry whose key (the sources' bytes) it already held (~60 s).
    """
    copies = pathlib.Path(build_dir) / 'src'
    copies.mkdir(exist_ok=True)
    for original in (CORE, SOURCE):
        copy = copies / original.name
        data = original.read_bytes()
        if not copy.is_file() or copy.read_bytes() != data:
            copy.write_bytes(data)
    return copies / SOURCE.name


def load(cache_dir=None, verbose=False, extra_cflags=()):
    """Return the compiled extension module (building it first if needed).

    extra_cflags: more compiler flags (the tests build the AVX2 path on an AVX-512 CPU with
    ``-mno-avx512f``); they are part of the key. Raises RuntimeError (with the compiler's
    message) when it cannot be built here.
    """
    key = build_key(extra_cflags)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        from torch.utils import cpp_extension
        build_dir = pathlib.Path(paths.cache_root(cache_dir)) / 'kernels' / key
        build_dir.mkdir(parents=True, exist_ok=True)
        try:
            module = cpp_extension.load(
                name=f'timebill_gguf_gemm_{key}', sources=[str(_source_copy(build_dir))],
                extra_cflags=compile_flags(extra_cflags), extra_ldflags=['-pthread'],
                build_directory=str(build_dir),
                verbose=verbose)
        except Exception as exc:  # compiler missing or failing: say what, the caller decides
            raise RuntimeError(f'could not build the GGUF kernels in {build_dir}: '
                               f'{type(exc).__name__}: {exc}') from exc
        _loaded[key] = module
        return module
