# One venv per checkout, created from pyproject.toml; `make demo` and `make test` each set it up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint typecheck unit cfn-lint bench local sandbox sam-build clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufarm demo

test: $(STAMP) lint typecheck unit cfn-lint

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

cfn-lint: $(STAMP)
	$(BIN)/cfn-lint template.yaml

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python benchmarks/sandbox.py
	$(BIN)/python benchmarks/node.py
	$(BIN)/python benchmarks/ingress.py

local: $(STAMP)
	$(BIN)/gpufarm local

sandbox: $(STAMP)
	$(BIN)/gpufarm sandbox

# Needs python3.12 on PATH (Lambda's runtime); resolves arm64 wheels without Docker.
sam-build:
	sam build --template-file template.yaml

clean:
	rm -rf $(VENV) .aws-sam .mypy_cache .ruff_cache
