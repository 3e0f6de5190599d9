# Everything a fresh machine needs, in one place. `make serve` and `make test` set up
# .venv first (CPU torch 2.13 unless TORCH says otherwise, e.g. TORCH=torch for CUDA).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup serve test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

serve: setup
	$(BIN)/vidserve serve --host $(HOST) --port $(PORT)

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) data .pytest_cache
