# The whole set-up on a fresh machine is `make demo` and `make test`; both create .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all experiments clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m jaxmodel.demo --out demo_out

test: $(STAMP)
	$(PY) -m pytest -q -n 2

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 -m ""

experiments: $(STAMP)
	for f in experiments/[!_]*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) demo_out experiments/out .pytest_cache
