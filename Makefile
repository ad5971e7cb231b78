# kvlog — one target per workflow. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvlog-installed
PYTEST_ARGS ?=
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: help demo test test-fast test-pure torture lint docs bench java install clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): setup.cfg setup.py pyproject.toml MANIFEST.in $(wildcard kvlog/*.h kvlog/*/*.c kvlog/*/*.h) | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv if needed and install kvlog with every extra (bench included)

java: ## check for Java 17+ (installs openjdk-17-jre-headless on Debian as root)
	@bash scripts/ensure-java.sh

demo: install java ## run the end-to-end demo on a local store
	$(VENV)/bin/kvlog demo

test: install java ## the whole suite (unit, property, fault, S3, Spark, examples, tutorials, packaging) and the docs, then one summary line
	@$(PY) scripts/run_tests.py --docs=$(VENV)/bin/sphinx-build -n 2 --dist loadgroup $(PYTEST_ARGS)

test-fast: install ## the suite without slow, S3 and Spark tests
	@$(PY) scripts/run_tests.py -m "not slow and not s3 and not spark" $(PYTEST_ARGS)

test-pure: install ## the fast suite on the pure-Python twins of the C extensions (KVLOG_PURE_PYTHON=1)
	@KVLOG_PURE_PYTHON=1 $(PY) scripts/run_tests.py -m "not slow and not s3 and not spark" $(PYTEST_ARGS)

torture: install ## seeded torture runs: make torture SEEDS=500 [START=0] [BACKEND=local|s3]
	$(PY) -m tests.torture --seeds $(or $(SEEDS),100) --start $(or $(START),0) --backend $(or $(BACKEND),local)

lint: install ## ruff and mypy (strict on kvlog/ and benchmarks/)
	$(VENV)/bin/ruff check kvlog spark_ext tests benchmarks examples
	$(VENV)/bin/mypy

docs: install ## build the documentation (nitpicky; warnings are errors)
	$(VENV)/bin/sphinx-build -n -W --keep-going -b html docs docs/_build/html

bench: install java ## run the benchmark suite (python -m benchmarks) and write benchmarks/results/
	$(PY) -m benchmarks --out benchmarks/results/latest.json

clean: ## remove build outputs (keeps .venv)
	rm -rf docs/_build build dist *.egg-info .pytest_cache .hypothesis
