# The two commands: `make demo` (the main job) and `make test` (lint, types, tests).
# Both create or refresh .venv and install exactly the pinned dependencies first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONUNBUFFERED := 1
# One torch thread per process by default: role processes share two cores.
export OMP_NUM_THREADS ?= 1

.PHONY: demo test lint typecheck unit venv bench-venv clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/asyncrl demo configs/demo.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy src/asyncrl

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit

# Benchmark peers (TRL) live in their own virtualenv so the runtime never depends on them.
bench-venv:
	@test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q -e '.[bench]'

clean:
	rm -rf $(VENV) .venv-bench .pytest_cache .mypy_cache .ruff_cache
