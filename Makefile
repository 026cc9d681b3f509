# gradsolve: `make demo` and `make test` work on a fresh machine (they create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all bench docs clean venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gradsolve demo

# pytest-xdist (in the `test` extra): one worker per CPU this process may use (tools/cpus.py:
# its affinity and any cgroup CPU quota), at most 4 (each holds a JAX
# process of 1-3 GB), whole test files to each (`--dist loadfile`: module fixtures run
# once). tests/conftest.py gives each worker its own JAX compilation cache. Measured on a
# quiet 2-core machine, fresh clone, every cache cold, venv included: 17.7-20.2 min with two
# workers (2026-12-07, 800-807 tests; both cores busy throughout: the suite is bound by XLA
# compiles and C++ kernel builds); 901 tests, 18.0 min of pytest with a tutorial running
# beside it (2026-12-07 10:01 UTC, 30.7 CPU-min); 979 tests, 38.0 min with two workers after
# stiff solvers moved to the compiled kernel by default (each distinct stiff field now builds
# a C++ kernel on first use; 2026-12-07 13:09-13:47 UTC, quiet machine but for short runs,
# kernel cache cold for the new kernels). One process: `make test XDIST=`.
WORKERS ?= $(shell $(PYTHON) tools/cpus.py 4 2>/dev/null || echo 1)
XDIST ?= $(if $(filter-out 1,$(WORKERS)),-n $(WORKERS) --dist loadfile,)

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST)

test-all: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "slow or not slow"

bench: $(STAMP)
	$(VENV)/bin/gradsolve bench

docs: $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	$(VENV)/bin/mkdocs build

clean:
	rm -rf $(VENV) build dist *.egg-info site
