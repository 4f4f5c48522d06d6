# timebill_ros developer entry points. Everything runs inside .venv (scripts/setup_venv.sh)
# with the environment of scripts/env.sh; the package is built by colcon into install/.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

ENV := source scripts/env.sh
# Folders that git may not have yet (empty) are left out rather than failing flake8.
LINT_PATHS := $(wildcard timebill_ros test launch benchmarks examples) setup.py scripts/timebill

.PHONY: venv venv-dev llama build test lint run bench bench-deps predictor fuzz soak reports \
  gpu-check clean

# venv: what the node, the demo and the predictor build need; venv-dev adds the tests',
# benchmarks' and linters' packages (requirements-dev.txt).
venv:
	scripts/setup_venv.sh

venv-dev:
	scripts/setup_venv.sh --dev

# llama.cpp's server (~5 min to build on 2 cores, once): the tests' loopback remote engine and
# the benchmarks' reference; `make run` does not need it.
llama: venv
	scripts/setup_llama.sh

build: venv
	scripts/build.sh

# pytest exits 5 when it collects no tests: that fails the target too.
test: build llama venv-dev
	$(ENV) && python -m pytest -q test
	$(ENV) && flake8 $(LINT_PATHS)

# Nightly-size fuzz of the action server: ~2200 random goal sequences, ~10k goals (the CI
# run of the same test is 30 sequences); prints the goals sent and the results by status.
fuzz: build venv-dev
	$(ENV) && TIMEBILL_FUZZ_EXAMPLES=2200 python -m pytest -q -s test/test_ros_load.py -k fuzzed

# The soak (docs/reliability.md, "Soak"): `timebill serve` under seeded mixed load from
# another process for SOAK_MINUTES minutes (1 h by default; the CI runs SOAK_MINUTES=3), a
# per-minute table and PNG; fails on a lost goal or a dead node. The 1-hour run writes
# benchmarks/results/soak, shorter ones log/soak_<N>min (SOAK_OUT overrides). A first start
# calibrates the node (~4 min on 2 cores) before the load begins.
SOAK_MINUTES ?= 60
ifeq ($(SOAK_MINUTES),60)
SOAK_OUT ?= benchmarks/results/soak
else
SOAK_OUT ?= log/soak_$(SOAK_MINUTES)min
endif
soak: build venv-dev
	$(ENV) && timebill soak --minutes $(SOAK_MINUTES) --out $(SOAK_OUT)

# Rebuild every results table docs/benchmark.md and docs/reliability.md cite from the raw rows
# committed beside it, with each table's own generator (timebill_ros/bench/reports.py; plots
# are redrawn too); it lists the tables no generator can rebuild from committed rows.
# CHECK=1: rebuild into a temporary folder only, list the tables that differ, exit 1 if one does.
reports: venv-dev
	$(ENV) && python -m timebill_ros.bench.reports $(if $(CHECK),--check)

lint: venv-dev
	$(ENV) && flake8 $(LINT_PATHS)

# The RLP and the prefill readout are built from the committed lengths
# (data/rlp/lengths_1024_guard.jsonl) when the cache has none (~5 min and ~15 min on 2 cores: the
# readout's features are one prefill of every corpus prompt, cached). MODEL=FILE.gguf builds that
# model's own: its lengths are collected first (docs/own_model.md); PROMPTS=N for a quick start.
MODEL ?=
PROMPTS ?= 0
predictor: build
	$(ENV) && timebill predictor build $(if $(MODEL),--model $(MODEL)) --prompts $(PROMPTS)

# The demo does not wait for the predictors: its goals get the fallback N^ = N_max when they
# are missing, and afterwards it starts building them in a niced background process (a server
# started later loads them; a running one switches to them).
run: build
	$(ENV) && timebill demo

bench: build llama venv-dev
	$(ENV) && timebill bench

# The benchmarks' extra dependency (llama.cpp's server): the same as `make llama`.
bench-deps: llama

# The CUDA path on a machine with an NVIDIA GPU and CUDA torch (docs/gpu.md): refused formats,
# stop latency and chunked prefill, enginebench --device cuda, the demo's goals on
# config/jetson_orin.yaml; writes GPU_OUT/gpu_check.md. Nothing else depends on it.
# GPU_DEVICE=cpu: a dry run of the same parts at small sizes (the CI runs it).
GPU_OUT ?= log/gpu_check
GPU_DEVICE ?= cuda
gpu-check: build venv-dev
	$(ENV) && scripts/gpu_check.sh $(GPU_OUT) $(GPU_DEVICE)

clean:
	rm -rf build install log
