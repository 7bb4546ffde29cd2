# sparsemla — every target is one line that calls a script or the `sparsemla` CLI. `make` alone lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/sparsemla
STAMP := $(VENV)/.sparsemla-setup

# Knobs of the ops targets (see `sparsemla <command> --help`).
C ?= 64
DURATION ?= 60s
TARGET ?= http://127.0.0.1:30000
WORKLOAD ?=# empty: the CLI's default (sparsemla.loadtest.workload.DEFAULT_WORKLOAD)
RUN_ID ?=
REPEAT ?= 1
FLAG ?= SPARSEMLA_MMA_DECODE
PORT ?= 30000
A ?=
B ?=
ARCH ?=
FROM ?= now-15m
TO ?= now

.PHONY: help setup test test-gpu test-containers lint demo sim up down loadtest sweep compare ab profile exporter \
	dashboards snapshot aot bench-decode bench-decode-v32 bench-indexer bench-prefill bench-step bench-step-v32 \
	bench-topk clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*?## .*$$' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements/torch-cpu.txt requirements/sglang-contract.txt scripts/install-tools.sh
	bash scripts/install-tools.sh "$(PYTHON)" "$(VENV)" && touch $(STAMP)

setup: $(STAMP) ## create .venv and install everything the targets need (torch CPU, sglang 0.5.23 contract tier, tools)

# The suite runs in two pytest processes on two or more cores (scripts/test-lanes.sh says which tests go where).
test: $(STAMP) ## lint + the whole CPU test suite (sglang contract tier, interpreter kernels, ops loop end to end)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && bash scripts/test-lanes.sh $(PY)

# Root on Debian (apt-installs podman, debootstrap, runc); elsewhere see docs/deploy.md. Second runs reuse the images.
test-containers: $(STAMP) ## build and run the sim image and the compose sim profile for real (podman, local base images)
	bash scripts/containers-setup.sh "$(PYTHON)" "$(PY)" && $(PY) -m pytest -m containers -s tests/test_containers.py

# On a GPU machine install the package first (`pip install -e ".[test]"`, or benchmarks/gpu-setup.sh).
test-gpu: ## GPU tests in both code paths: native, then TRITON_OVERRIDE_ARCH=sm89 (the mma.sync code of sm_80..sm_120)
	$(PYTHON) -m pytest -m gpu
	TRITON_OVERRIDE_ARCH=sm89 $(PYTHON) -m pytest -m gpu

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

demo: $(STAMP) ## the whole loop on the simulator, no GPU: flip one kernel flag after another, sweep + profile each, A/B reports
	$(CLI) demo

sim: $(STAMP) ## run the simulated sglang server in the foreground (PORT=30000)
	$(CLI) sim --port $(PORT)

up: $(STAMP) ## start simulator (or local sglang) + Prometheus + exporter as plain processes; prints URLs
	$(CLI) up

down: $(STAMP) ## stop everything `make up` started
	$(CLI) down

loadtest: $(STAMP) ## one Locust run at fixed concurrency: make loadtest C=64 DURATION=60s TARGET=...
	$(CLI) loadtest --concurrency $(C) --duration $(DURATION) --target $(TARGET) $(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(RUN_ID),--run-id $(RUN_ID))

sweep: $(STAMP) ## concurrency sweep with repeats: make sweep C="1 16 32 64" REPEAT=3
	$(CLI) sweep --concurrency "$(C)" --repeat $(REPEAT) --duration $(DURATION) --target $(TARGET) $(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(RUN_ID),--run-id $(RUN_ID))

compare: $(STAMP) ## A/B report of two runs: make compare A=<run> B=<run>
	$(CLI) compare $(A) $(B)

ab: $(STAMP) ## flag off vs on: make ab FLAG=SPARSEMLA_MMA_DECODE C="1 16 64"
	$(CLI) ab --flag $(FLAG) --concurrency "$(C)" --repeat $(REPEAT) --duration $(DURATION) --target $(TARGET) $(if $(WORKLOAD),--workload $(WORKLOAD)) $(if $(RUN_ID),--run-id $(RUN_ID))

profile: $(STAMP) ## take one kernel-share snapshot from the server (through the exporter)
	$(CLI) profile --target $(TARGET)

exporter: $(STAMP) ## run the kernel-share exporter in the foreground
	$(CLI) exporter --target $(TARGET)

dashboards: $(STAMP) ## regenerate the committed Grafana JSON from src/sparsemla/dashboards/build.py
	$(CLI) dashboards

snapshot: $(STAMP) ## render every panel to PNG from Prometheus: make snapshot FROM=now-15m TO=now
	$(CLI) snapshot --from "$(FROM)" --to "$(TO)"

aot: $(STAMP) ## compile every kernel for sm_80..sm_120 without a GPU: make aot ARCH=sm_120 (default: all six)
	$(CLI) aot $(foreach a,$(ARCH),--arch $(a))

bench-decode: ## GPU: decode benchmark, native + sm89 code paths -> results/bench/decode-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.decode

bench-decode-v32: ## GPU: DeepSeek-V3.2 decode vs FlashMLA, native + sm89 code paths -> results/bench/decode_v32-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.decode_v32

bench-indexer: ## GPU: indexer benchmark, native + sm89 code paths -> results/bench/indexer-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.indexer

bench-prefill: ## GPU: sparse-prefill benchmark, native + sm89 code paths -> results/bench/prefill-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.prefill

# Here first: `bash benchmarks/gpu-sglang-jit.sh` (sglang's JIT top-k sources + wheels into .gpu/, carried there).
bench-topk: ## GPU: top-k of every provider (ours, torch, sglang JIT), native + sm89 -> results/bench/topk-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.topk

bench-step: ## GPU: decode-step benchmark + kernel shares -> results/bench/step-<gpu>-<date>.json + sim calibration
	$(PYTHON) -m benchmarks.step --step-hook sparsemla.plugin.step_metrics:time_forward_step
	$(PYTHON) -m sparsemla.ops.sim.calibrate_from_step

bench-step-v32: ## GPU: DeepSeek-V3.2 decode step, flags on vs FlashMLA + kernel shares -> results/bench/step_v32-<gpu>-<date>.json
	$(PYTHON) -m benchmarks.step_v32

clean: ## remove the venv and run state
	rm -rf $(VENV) .run
