# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.fxcc-installed

.PHONY: demo test lint venv clean browser

venv: $(STAMP)

# torch==2.13.0 first: the CPU build on this machine's disk, so no CUDA build is ever pulled.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,service,worker]'
	touch $(STAMP)

demo: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/fxcc demo

test: $(STAMP) browser
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

# The dashboard test drives Debian's headless Chromium; install it when missing and we are root.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	  else echo "note: chromium and chromium-driver are missing; the dashboard test will fail"; fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check compiler_core client service worker tests bench

clean:
	rm -rf $(VENV) .fxcc-demo
