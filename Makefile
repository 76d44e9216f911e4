# Quickstart: `make run` (set up .venv, run oomguard check) and `make test` (the whole suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-dev

CONSTRAINTS := constraints.txt

# Let Python and pytest keep their bytecode (gitignored __pycache__/): with PYTHONDONTWRITEBYTECODE
# set, as on this machine, pytest rewrites and compiles every test module and every module of a
# plugin's distribution (schemathesis: hundreds) on each run and in each xdist worker, about 15 s
# of CPU per process here ("pytest -p no:cacheprovider --collect-only" under cProfile).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast deps lint typecheck pytest cov fmt bench clean system-deps pyz upgrade-deps

# The dev tools and the manager's libraries at the versions in constraints.txt (pip -c).
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip -c $(CONSTRAINTS)
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[dev,manager]'
	touch $@

# Rewrite constraints.txt with the newest releases (a throwaway venv); then make test, and commit it.
upgrade-deps:
	rm -rf $(VENV)-upgrade
	$(PY) -m venv $(VENV)-upgrade
	$(VENV)-upgrade/bin/pip install --quiet --upgrade pip
	$(VENV)-upgrade/bin/pip install --quiet -e '.[dev,manager]'
	{ sed -n '/^#/p' $(CONSTRAINTS); $(VENV)-upgrade/bin/pip freeze --all --exclude-editable | grep -v -e '^setuptools==' -e '^oomguard'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(VENV)-upgrade

run: $(STAMP)
	$(BIN)/oomguard check

# The VM's suite starts first and boots while lint and the type check run beside it (they would
# leave a CPU idle before it); then the host's suite. A lint or type error stops the VM's run.
test: deps
	$(MAKE) --no-print-directory pytest BEFORE_HOST='$(MAKE) --no-print-directory lint typecheck'

# The Debian packages the whole suite needs (scripts/system-deps.sh: installs only what is missing).
deps system-deps:
	bash scripts/system-deps.sh

# The suite without the parts that need the VM, real container runtimes, PostgreSQL or a browser
# (markers: tests/conftest.py, CONTRIBUTING.md), without the tests marked slow (over 1.5 s each
# here), and without lint and type checks: the quick loop. `make test` runs them all.
# Spread over one pytest-xdist worker per CPU (a module stays on one worker: its fixtures are set up
# once), with a tenth of the property tests' examples (tests/helpers/fuzz.py).
FAST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test-fast: $(STAMP)
	OOMGUARD_TEST_FAST=1 $(BIN)/python -m pytest -q -n $(FAST_WORKERS) --dist loadfile \
		-m "not vm and not runtimes and not postgres and not browser and not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/vermin --quiet --no-tips --violations -t=3.10- src/oomguard

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite, in two pytest processes at once: the cgroup v2 VM's (tests/vm: qemu, whose TCG
# vCPU keeps one CPU busy for minutes, its log in test-artifacts/vm.log, printed after) and the
# host's, over TEST_WORKERS pytest-xdist workers (a module stays on one). With COV=1 the host's run
# under coverage of src/oomguard (pytest-cov combines the workers' data; settings: [tool.coverage]
# in pyproject.toml; the PostgreSQL variants run unmeasured: tests/conftest.py), its summary
# printed whether the tests pass or not. The target fails when a test of either fails.
# The host's tests run niced (HOST_NICE), so the guest's vCPU keeps its CPU and the VM's suite ends
# within its timeout (beside two workers at the same priority it took over 600 s, against 530 s).
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
HOST_NICE ?= 5
# COV=1 is off by default: tracing made in-process tests up to 73 % slower (test_manager_fuzz's
# SQLite half: 41 s bare, 71 s traced), and make test is to stay under 15 minutes here.
COV ?= 0
COV_ARGS = $(if $(filter 1,$(COV)),--cov --cov-report=term,)
# BEFORE_HOST: what runs after the VM's suite started and before the host's (make test: lint and
# the type check); when it fails, the VM's run (its own session, qemu with it) is stopped.
BEFORE_HOST ?= true
pytest: $(STAMP)
	@mkdir -p test-artifacts
	setsid $(BIN)/python -m pytest -q tests/vm > test-artifacts/vm.log 2>&1 & vm=$$!; \
	if ! { $(BEFORE_HOST); }; then kill -TERM -- -$$vm 2>/dev/null; wait $$vm; \
		echo "== lint or the type check failed: the VM's suite was stopped"; exit 1; fi; \
	nice -n $(HOST_NICE) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --ignore=tests/vm $(COV_ARGS) \
		$(PYTEST_ARGS); rc=$$?; \
	wait $$vm; vrc=$$?; echo "== tests/vm (test-artifacts/vm.log), exit $$vrc"; cat test-artifacts/vm.log; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$vrc

# One process, under coverage, listing the lines not run; no lint or type checks. PYTEST_ARGS
# passes options to pytest: make cov PYTEST_ARGS='-x tests/test_plan.py'.
cov: $(STAMP)
	@mkdir -p test-artifacts
	$(BIN)/python -m coverage erase
	$(BIN)/python -m coverage run -m pytest $(PYTEST_ARGS); rc=$$?; \
	$(BIN)/python -m coverage report --show-missing; rrc=$$?; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rrc

# Rewrite in place: lint fixes first, then formatting (what `make lint` checks).
fmt: $(STAMP)
	$(BIN)/ruff check --fix src tests bench tools
	$(BIN)/ruff format src tests bench tools

$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,manager,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/limits_vs_peers.py
	$(BIN)/python bench/reserve.py

# The worker side as one file, standard library only (no manager/): python3 dist/oomguard.pyz check.
# DIST=DIR builds DIR/oomguard.pyz instead (tests/test_pyz.py does). Bytecode of $(PY)'s version
# rides along (zipimport cannot cache it; other versions compile the sources, a little slower).
pyz: DIST ?= dist
pyz:
	rm -rf $(DIST)/.pyz-stage && mkdir -p $(DIST)/.pyz-stage
	$(PY) -c "import shutil, sys; shutil.copytree('src/oomguard', sys.argv[1], ignore=shutil.ignore_patterns('manager', '__pycache__', '*.py[co]'))" $(DIST)/.pyz-stage/oomguard
	$(PY) -m compileall -q -b --invalidation-mode unchecked-hash $(DIST)/.pyz-stage/oomguard
	$(PY) -m zipapp $(DIST)/.pyz-stage --main 'oomguard.cli:main_exit' --python '/usr/bin/env python3' --compress --output $(DIST)/oomguard.pyz
	rm -rf $(DIST)/.pyz-stage

clean:
	rm -rf $(VENV) $(VENV)-upgrade build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache test-artifacts/.coverage
