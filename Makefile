# The README's two commands: `make serve` (the main job) and `make test`.
# Everything they need is installed into .venv from pinned versions.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# CI and tests build one CUDA arch when nvcc is present; release builds take all three.
export NINFER_CUDA_ARCHS ?= 90a
# The development build also makes ninfer._testing (the tests' and benchmarks' entry points); releases do not.
export NINFER_TESTING ?= ON
PYTEST_ARGS ?=

# Debian packages the tests use (Nix evaluation, systemd-analyze and nginx for the packaging tests, chromium for the
# browser tests, npm for `make webui`). Installed when missing and we are root with apt-get; otherwise those tests skip and
# name the missing package (and `make webui` says npm is missing). npm counts as present when an `npm` command is on
# PATH: NodeSource's nodejs package carries its own npm and conflicts with Debian's.
SYSTEM_PACKAGES := nix-bin systemd nginx chromium npm

.PHONY: all venv build system-deps webui test serve bench gpu-test clean

all: build

$(VENV)/.stamp: requirements/build.txt requirements/runtime.txt requirements/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements/build.txt -r requirements/test.txt
	touch $@

venv: $(VENV)/.stamp

# Editable install: Python edits are live; C++ edits need `make build` again (incremental, build/).
build: venv
	$(PIP) install --quiet --no-build-isolation --no-deps -e .

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || { [ $$p = npm ] && command -v npm >/dev/null; } || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing system packages:$$missing"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; } \
	    || echo "note: could not install$$missing; tests needing them will skip"; \
	else echo "note: not root or no apt-get; tests needing$$missing will skip"; fi

# The pinned llama-ui bundle (python/ninfer/serve/webui/pin.json: the llama-cpp-python sdist, sha256-checked,
# npm ci && npm run build), built once per pin into the user cache where `ninfer-serve --webui` finds it; the
# browser tests use it.
webui: venv system-deps
	$(PY) webui/build_llama_ui.py

test: build system-deps webui
	OMP_WAIT_POLICY=passive $(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

# The GPU tests and benchmarks run on a GPU machine's own Python (CUDA 13, CMake, Python with torch, pytest and
# nanobind, plus the wheels docs/performance.md names on PYTHONPATH): no venv and no network, so a bare machine
# that was never set up runs them (bench/gpu_run.sh builds with CUDA into build/gpu).
gpu-test:
	STAGES=tests GPU_TEST_ARGS="$(PYTEST_ARGS)" bash bench/gpu_run.sh

# The embedded default model (imported once into ~/.cache/ninfer) unless ARGS names one; HOST/PORT as in the URL.
HOST ?= 127.0.0.1
PORT ?= 8080
serve: build
	@echo "ninfer-serve: starting on http://$(HOST):$(PORT) (OpenAI base URL http://$(HOST):$(PORT)/v1)"
	$(VENV)/bin/ninfer-serve --host $(HOST) --port $(PORT) $(ARGS)

bench:
	bash bench/gpu_run.sh

clean:
	rm -rf build $(VENV) .pytest_cache
