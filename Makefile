# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.fxcc-installed

.PHONY: demo test lint venv clean

venv: $(STAMP)

# torch==2.13.0 first: the CPU build on this machine's disk, so no CUDA build is ever pulled.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/fxcc demo

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check compiler_core client service worker tests bench

clean:
	rm -rf $(VENV) .fxcc-demo
