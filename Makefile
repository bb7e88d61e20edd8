# `make demo` installs tablefree into .venv and runs the embedded-default experiment.
# `make test` installs tablefree (with its interop, slurm and dev extras) into .venv and runs the test suite (CI);
# it runs on TEST_WORKERS processes and ends with the 15 slowest tests' times, so a test that grows is seen
# (docs/benchmarks.md keeps each machine's).
# `make test-fast` runs it without the tests marked slow (end-to-end runs), for the edit-test loop.
# TORCH picks the PyTorch build: the default is the CPU wheel; on a GPU machine use e.g. `make TORCH=torch demo`.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.tablefree-installed
# Test workers (pytest-xdist), one per core of a 2-core CI machine; each computes on one thread (tests/conftest.py)
# and keeps a test file's tests together (--dist loadfile), so a module's shared fixture is built once.
TEST_WORKERS ?= 2

.PHONY: install demo test test-fast lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[interop,slurm,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/tablefree demo

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

lint: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
