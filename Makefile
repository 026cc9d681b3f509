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

# Two pytest-xdist workers, whole files to each (module fixtures and kernel builds are not
# repeated): XLA compiles on one core, so a 2-core machine runs the suite ~1.5-2x faster.
# `make test XDIST=` runs in one process.
XDIST ?= -n 2 --dist loadfile

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
