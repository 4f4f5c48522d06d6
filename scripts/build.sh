#!/usr/bin/env bash
# Build timebill_ros with colcon into build/ and install/ (log/ for logs).
# --symlink-install: the installed .py files are symlinks to the sources, so edits to
# existing files show at once; a new file (or launch/config file) needs another build.
# Extra arguments go to `colcon build` (e.g. --event-handlers console_direct+).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source scripts/env.sh

# CMake will not export an include dir that lies in the source tree, and .venv/ does (numpy's
# headers, for the generated Python typesupport). Inside the install prefix is allowed, so
# FindPython gets them through a link there.
np_inc="$ROOT/install/timebill_ros/.numpy_include"
mkdir -p "$(dirname "$np_inc")"
ln -sfn "$(python -c 'import numpy; print(numpy.get_include())')" "$np_inc"

# The C++ GGUF kernels (timebill_ros/engine/kernels), compiled for this machine's CPU into the
# cache (~45 s the first time, then a no-op while source, torch, compiler and CPU are the same).
# They compile on one core (one translation unit) while colcon configures and generates on the
# other (both mostly one process at a time): a first build takes the longer of the two, not
# their sum. `python -m` from the source tree: the kernels need nothing colcon generates.
# TIMEBILL_BUILD_KERNELS=0: colcon only (setup_venv.sh's early build, before transformers).
kernels_pid=""
if [[ "${TIMEBILL_BUILD_KERNELS:-1}" != 0 ]]; then
  python -m timebill_ros.engine.kernels &
  kernels_pid=$!
fi

colcon --log-base log build \
  --base-paths . \
  --build-base build \
  --install-base install \
  --symlink-install \
  "$@" \
  --cmake-args -DBUILD_TESTING=OFF "-DPython3_EXECUTABLE=$VIRTUAL_ENV/bin/python" \
  "-DPython3_NumPy_INCLUDE_DIR=$np_inc"

# Symlink install keeps links to deleted sources; drop them (`make clean` for a full reset).
find install/timebill_ros -xtype l -delete

# The kernels' build ends here: its status is this script's.
if [[ -n "$kernels_pid" ]]; then
  wait "$kernels_pid"
fi
