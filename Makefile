# tickler — `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PG15   ?= postgresql://postgres@127.0.0.1:5432/postgres

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# Stamps: the service alone, and the service with its test and pipeline extras.
$(VENV)/.installed-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-base
	$(BIN)/pip install --quiet -e '.[dev,pipeline]'
	@touch $@

install: $(VENV)/.installed-dev ## create .venv and install tickler with its test and pipeline extras

serve: $(VENV)/.installed-base ## install, then run the API and a dispatcher on 127.0.0.1:8080 (embedded PostgreSQL in ./.tickler)
	$(BIN)/tickler serve

test: install lint typecheck ## install, then lint, type-check and run the whole test suite
	$(BIN)/pytest

test-only: install ## run the test suite only
	$(BIN)/pytest

lint: install ## ruff: lint and formatting
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install ## mypy --strict over the service code
	$(BIN)/mypy

bench: install ## run every benchmark scenario and rewrite docs/benchmarks.md (long)
	$(BIN)/python -m bench

bench-quick: install ## prove the benchmark harness works on tiny sizes (no timing claims)
	$(BIN)/python -m bench --quick

clean: ## remove the virtualenv and caches (keeps ./.tickler data)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

.PHONY: help install serve test test-only lint typecheck bench bench-quick clean
