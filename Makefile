# The two set-up commands of the README live here: `make run` and `make test`.
# Both create their own virtual environment (.venv) and install what they need into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "fleetledger needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## The main job: the burst-vms simulation on embedded SQLite (a scratch file per run).
run: $(STAMP)
	$(BIN)/fleetledger simulate --scenario burst-vms

## The whole test suite: lint, type checks, then pytest against SQLite and Postgres.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy eventstore domain projections adapters migrations tests

unit: $(STAMP)
	$(BIN)/pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache fleetledger.db*
