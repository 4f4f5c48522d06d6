"""``python -m timebill_ros.engine.kernels``: build the CPU kernels for this machine now."""

import sys
import time

from timebill_ros.engine.kernels import build_key, load

start = time.monotonic()
try:
    module = load()
except RuntimeError as exc:
    print(f'kernels: {exc}', file=sys.stderr)
    sys.exit(1)
amx = ', Q4_K / Q6_K prefill on AMX tiles' if module.amx_prefill() else ''
print(f'kernels: GGUF GEMM ready (key {build_key()}, vector path: {module.simd_path()}{amx}, '
      f'{time.monotonic() - start:.1f} s)')
