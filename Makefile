# The two commands a user types: `make run` (the main job) and `make test` (the test suite).
# Both set everything up on a fresh machine first (venv, packages, embedded data), idempotently.
VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test setup up down repro lint bench bench-pipeline mutate clean

setup:
	@bash scripts/bootstrap.sh

# The services (S3, MLflow, Prefect on 127.0.0.1) stay up for the UIs; `make down` stops them.
run: setup up
	$(VENV)/bin/fedapt run $(ARGS)

up: setup
	$(VENV)/bin/fedapt up

down:
	$(VENV)/bin/fedapt down

# `dvc repro` with the venv's fedapt on PATH (dvc.yaml's stages call `fedapt` from the
# environment, so an activated venv works the same: `. .venv/bin/activate && dvc repro`).
repro: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/dvc repro $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

# Mutation testing of the core maths with mutmut ([tool.mutmut] in pyproject.toml,
# docs/testing.md): run before a large refactor; then the mutants that were not killed.
# MUTATE_ARGS='"fedcore.schedules.*"' runs one module's mutants (mutmut's name patterns).
MUTATE_ARGS ?=
mutate: setup
	$(VENV)/bin/mutmut run $(MUTATE_ARGS)
	$(VENV)/bin/mutmut results

bench: setup
	$(VENV)/bin/python benchmarks/engine_throughput.py

bench-pipeline: setup
	$(VENV)/bin/python benchmarks/pipeline_overhead.py

clean:
	rm -rf reports .pytest_cache mutants
