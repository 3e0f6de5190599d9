# Everything a fresh machine needs, in one place. `make serve` and `make test` set up
# .venv first (CPU torch 2.13 unless TORCH says otherwise, e.g. TORCH=torch for CUDA).
# `make serve HOST=0.0.0.0 PORT=8080` listens elsewhere (a non-loopback HOST needs API keys).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup serve test bench clean

setup: $(VENV)/.installed

# Quiet: one line, then only what goes wrong. setuptools' note that an editable install maps its
# folders (not a problem, and said of every project laid out like this one) is left out.
$(VENV)/.installed: pyproject.toml
	@echo "setting up $(VENV): torch and the dependencies (a few minutes, once)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -q "$(TORCH)"
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e ".[dev]"
	@touch $@

serve: setup
	@$(BIN)/vidserve serve --host $(HOST) --port $(PORT)

# Two pytest processes, each given whole test files in order (tests marked `first` lead): most
# tests wait on servers, workers and subprocesses more than they compute, so two share two cores.
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) data .pytest_cache
