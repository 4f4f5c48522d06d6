#!/usr/bin/env bash
# Install llama.cpp's server into .venv (after scripts/setup_venv.sh), once: its own stamp.
# Only the tests (the remote backend's loopback engine) and the benchmarks (enginebench's
# reference, remotebench) use it; the node and `make run` never do, so they do not wait for
# its build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.timebill-llama-stamp"
PY="$VENV/bin/python"
# llama.cpp's OpenAI-compatible server: the remote engine of the engine.backend openai tests
# and benchmarks (started on loopback), and the reference of `timebill enginebench`. Built
# from source with cmake + gcc (~5 min on 2 cores). On CPUs with AMX (Sapphire Rapids and
# later) 0.3.36's AMX kernels crash on the embedded model's Q4_1 weights (SIGSEGV in
# ggml_backend_amx_mul_mat, seen 2026-11-24), so there it is built for AVX-512 without AMX.
LLAMA_WHEEL="llama-cpp-python[server]==0.3.36"
LLAMA_NO_AMX="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"

want="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup_llama: llama-cpp-python is up to date"
  exit 0
fi
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  CMAKE_ARGS="$LLAMA_NO_AMX" "$PY" -m pip install "$LLAMA_WHEEL"
else
  "$PY" -m pip install "$LLAMA_WHEEL"
fi
echo "$want" > "$STAMP"
