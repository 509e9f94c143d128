# The two commands: `make demo` (the main job) and `make test` (lint, types, tests).
# Both create or refresh .venv and install exactly the pinned dependencies first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONUNBUFFERED := 1
# One torch thread per process by default: role processes share two cores.
export OMP_NUM_THREADS ?= 1

.PHONY: demo test test-faults lint typecheck unit venv clean

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

# The fault-injection suite (kill -9 roles, Redis crash/restart, dropped connections, Ray actor kill):
# minutes, so not part of `make test`. Writes one JSON row per fault and prints the reliability table.
FAULTS_REPORT ?= runs/faults-report.jsonl
test-faults: $(STAMP)
	mkdir -p $(dir $(FAULTS_REPORT)) && rm -f $(FAULTS_REPORT)
	ASYNCRL_FAULTS_REPORT=$(abspath $(FAULTS_REPORT)) $(PY) -m pytest -m faults tests/test_faults.py
	$(PY) bench/faults_table.py $(FAULTS_REPORT)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
