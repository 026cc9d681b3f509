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

# Opt-in pytest-xdist (in the `test` extra): `make test XDIST="-n 2 --dist loadfile"` runs
# two workers, whole files to each (module fixtures are not repeated; tests/conftest.py
# gives each worker its own JAX compilation cache). Off by default: on a shared 2-core
# machine it did not measurably beat one process (each already keeps ~1.5 threads busy).
XDIST ?=

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
