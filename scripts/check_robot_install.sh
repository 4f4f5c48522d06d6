#!/usr/bin/env bash
# Does requirements-robot.txt install on a robot? pip's own resolver, asked for CPython 3.10
# (Humble, Ubuntu 22.04) and 3.12 (Jazzy, 24.04) wheels on manylinux x86_64 and aarch64 with
# glibc <= 2.35 (JetPack 6 is Ubuntu 22.04), nothing installed (--dry-run). Prints the versions
# it would take; exits non-zero where any target has no solution.
# Run by .ci/run. Needs the package index (PyPI); takes ~1-2 min.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A cross-platform resolve takes wheels only; kvpress 0.5.5 needs fire < 0.7, which PyPI has as
# an sdist only. It is pure Python: its wheel, built here, stands for it on every target.
"$PY" -m pip wheel -q --no-deps --wheel-dir "$work/wheels" "fire>=0.6,<0.7"
status=0
for version in 3.10 3.12; do
  for arch in x86_64 aarch64; do
    platforms=(--platform "manylinux2014_$arch")
    for n in $(seq 17 35); do platforms+=(--platform "manylinux_2_${n}_$arch"); done
    if "$PY" -m pip install -q --dry-run --ignore-installed --only-binary=:all: \
        --find-links "$work/wheels" --python-version "$version" --implementation cp \
        "${platforms[@]}" -r "$ROOT/requirements-robot.txt" --report "$work/report.json" \
        2> "$work/err.txt"; then
      "$PY" - "$work/report.json" "cp$version $arch" <<'PYEOF'
import json, sys
chosen = {i['metadata']['name'].lower(): i['metadata']['version']
          for i in json.load(open(sys.argv[1]))['install']}
keys = ('transformers', 'kvpress', 'gguf', 'numpy', 'scipy', 'tokenizers', 'torch')
print(f'{sys.argv[2]}: resolves, {len(chosen)} packages; '
      + ', '.join(f'{k} {chosen.get(k, "-")}' for k in keys))
PYEOF
    else
      echo "cp$version $arch: NO SOLUTION"
      grep -v '^WARNING: Location' "$work/err.txt" | tail -15
      status=1
    fi
  done
done
echo "(torch is resolved here only because kvpress names it; on a robot the installed one stays)"
exit "$status"
