# The two commands a user types: `make run` (the main job) and `make test` (the test suite).
# Both set everything up on a fresh machine first (venv, packages, embedded data), idempotently.
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test setup lint bench clean

setup:
	@bash scripts/bootstrap.sh

run: setup
	$(VENV)/bin/fedapt run $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/python benchmarks/engine_throughput.py

clean:
	rm -rf reports .pytest_cache
