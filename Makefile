# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.fxcc-installed

.PHONY: demo test lint venv clean browser gpu-carry

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

# What the GPU machine (the device tool; Python 3.12, torch and triton there, no registry) lacks, to
# carry with each run: cp312 wheels of the server stack and fxcc's own wheel under .whl/, Debian's
# redis-server unpacked under .gpu-redis/. On the device: `source bench/gpu_env.sh` (bench/README.md).
GPU_WHEELS = pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection cryptography==50.0.2 \
	cffi pycparser fastapi==0.165.0 starlette==1.10.0 uvicorn click h11 redis pydantic-settings python-dotenv \
	expecttest annotated-doc opentelemetry-api==1.45.2
gpu-carry: $(STAMP)
	rm -rf .whl .gpu-redis .gpu-debs
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
	  -d .whl $(GPU_WHEELS)
	rm -f .whl/typing_extensions-* .whl/anyio-* .whl/idna-*
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w .whl . && rm -rf build
	mkdir -p .gpu-debs && cd .gpu-debs && apt-get download redis-server redis-tools libjemalloc2 liblzf1
	for f in .gpu-debs/*.deb; do dpkg -x $$f .gpu-redis; done
	rm -rf .gpu-debs

lint: $(STAMP)
	$(BIN)/ruff check compiler_core client service worker tests bench

clean:
	rm -rf $(VENV) .fxcc-demo
