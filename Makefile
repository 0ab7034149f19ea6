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

## The main job: every capability's scenario on embedded SQLite (a log each in fleetledger-sim/),
## what batching bought, and the HTML report with its charts (its path is printed last).
run: $(STAMP)
	$(BIN)/fleetledger simulate --scenario all --report fleetledger-sim/report.html

## The whole test suite: lint, type checks, then pytest against SQLite and Postgres.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy finds `fleetledger.*` in the checkout's own fleetledger/ folder (see pyproject.toml).
typecheck: $(STAMP)
	$(BIN)/mypy -p fleetledger -p tests

# One worker per core: most tests wait on Postgres, so two workers halve the run on two cores.
# A test file stays on one worker, so a file's expensive fixtures (a built wheel) are made once.
unit: $(STAMP)
	$(BIN)/pytest -n auto --dist loadfile

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache fleetledger.db* fleetledger-sim fleetledger-sim.db*
