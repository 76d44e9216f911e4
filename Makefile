# Quickstart: `make run` (set up .venv, run oomguard check) and `make test` (the whole suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest bench clean system-deps

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,manager]'
	touch $@

run: $(STAMP)
	$(BIN)/oomguard check

test: system-deps lint typecheck pytest

system-deps:
	bash scripts/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/vermin --quiet --no-tips --violations -t=3.10- src/oomguard

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest

$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,manager,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/limits_vs_peers.py
	$(BIN)/python bench/reserve.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
