# The README's two commands: `make serve` (the main job) and `make test`.
# Everything they need is installed into .venv from pinned versions.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# CI and tests build one CUDA arch when nvcc is present; release builds take all three.
export NINFER_CUDA_ARCHS ?= 90a
PYTEST_ARGS ?=

.PHONY: all venv build test serve bench gpu-test clean

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

test: build
	$(PY) -m pytest -q -m "not gpu" $(PYTEST_ARGS)

gpu-test: build
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

serve: build
	$(VENV)/bin/ninfer $(ARGS)

bench: build
	$(PY) bench/run.py

clean:
	rm -rf build $(VENV) .pytest_cache
