# gpu-platform entry points. `make up` is the main job, `make test` the whole test suite.
SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STACK ?= local
export CONTAINERS_CONF := $(CURDIR)/scripts/containers.conf

.PHONY: venv plan test test-unit test-pulumi lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,ansible]'
	touch $@

venv: $(VENV)/.installed

## plan: the offline plan of every shipped stack (no cloud account, no Pulumi CLI)
plan: venv
	@for s in $$($(BIN)/python -c 'from infra.spec.load import stack_names; print(*stack_names())'); do \
		$(BIN)/gpuplat plan --stack $$s || exit $$?; done

## lint: ruff and mypy on the Python code
lint: venv
	$(BIN)/ruff check infra tests benchmarks examples
	$(BIN)/ruff format --check infra tests benchmarks examples
	$(BIN)/mypy infra

## test-unit: fast tests (spec, data, sizing, policy rules, CLI, Pulumi program under mocks)
test-unit: venv
	$(BIN)/pytest -q tests/unit tests/pulumi

## test: everything CI runs
test: lint test-unit

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
