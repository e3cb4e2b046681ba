# tickler — `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PG15   ?= postgresql://postgres@127.0.0.1:5432/postgres
HOST   ?= 127.0.0.1
PORT   ?= 8080
# pip, quiet. setuptools says "Editable installation ... folders in your working directory with the
# same name as your package may take precedence" for every editable install of a flat layout; here
# that folder (tickler/, and clients/python/tickler_client/) is the package itself, so the notice
# tells a newcomer of a problem they do not have. Only that message is silenced.
PIP    := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# Stamps: the service alone, and the service with its test and pipeline extras.
$(VENV)/.installed-base: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e . -e ./clients/python
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-base clients/python/pyproject.toml
	$(PIP) -e '.[dev,pipeline]' -e ./clients/python
	@touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-dev
	$(PIP) -e '.[bench]'
	@touch $@

install: $(VENV)/.installed-dev ## create .venv and install tickler with its test and pipeline extras, and the Python client (editable)

serve: $(VENV)/.installed-base ## install, then run the API and a dispatcher on 127.0.0.1:8080 (PORT=9090, HOST=0.0.0.0 to change; embedded PostgreSQL in ./.tickler)
	$(BIN)/tickler serve --host $(HOST) --port $(PORT)

test: install lint typecheck ## install, then lint, type-check and run the whole test suite
	$(BIN)/pytest

test-only: install ## run the test suite only (PYTEST_ARGS="-n 2" to pass options)
	$(BIN)/pytest $(PYTEST_ARGS)

test-quick: install ## the inner loop: the suite without Spark and the browser (a few minutes)
	$(BIN)/pytest -m "not spark and not browser"

lint: install ## ruff (lint and formatting) and the layer contracts (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install ## mypy --strict over the service code and the Python client
	$(BIN)/mypy .

DIST ?= dist
dist: install ## build the wheels to install elsewhere: $(DIST)/tickler-VERSION-py3-none-any.whl and the Python client's
	@mkdir -p $(DIST)
	@# No build environment to download: the dev extra installs setuptools beside pip.
	$(BIN)/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(DIST) . ./clients/python
	@rm -rf build clients/python/build
	@ls -1 $(DIST)/*.whl

constraints: install ## rewrite deploy/constraints.txt: the production dependencies' versions in this virtualenv (after the tests pass)
	$(BIN)/python deploy/constraints.py

bench: $(VENV)/.installed-bench ## install the peer (pgqueuer) and servers, run every benchmark scenario on a private PostgreSQL cluster and rewrite docs/benchmarks.md (long)
	$(BIN)/python -m bench

bench-quick: install ## prove the benchmark harness works on tiny sizes (no timing claims)
	$(BIN)/python -m bench --quick

screenshots: install ## retake the dashboard's screenshots in docs/images/ (runs the browser tests)
	TICKLER_UI_SCREENSHOTS=docs/images $(BIN)/pytest tests/test_ui_browser.py tests/test_ui_pages_browser.py -q

clean: ## remove the virtualenv and caches (keeps ./.tickler data)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

.PHONY: help install serve dist constraints test test-only test-quick lint typecheck bench bench-quick screenshots clean
