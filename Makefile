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

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

bench: $(STAMP)
	$(VENV)/bin/gradsolve bench

docs: $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	$(VENV)/bin/mkdocs build

clean:
	rm -rf $(VENV) build dist *.egg-info site
