# The whole set-up on a fresh machine is `make demo` and `make test`; both create .venv when
# missing and bring it up to date when pyproject.toml changed. uv (from the package index, into
# .venv) installs the dependencies in a few seconds, plain pip in half a minute; pip is the
# fall-back where uv cannot be installed or its install fails (uv reads UV_* settings, not
# pip's configuration: a machine with a pip-only mirror or certificate gets the pip path).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all experiments clean ui

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	test -x $(UV) || $(PYTHON) -m pip --python $(PY) install --quiet uv \
		|| { $(PY) -m ensurepip --default-pip >/dev/null && $(PY) -m pip install --quiet uv; } \
		|| true
	{ test -x $(UV) && $(UV) pip install --quiet --python $(PY) -e ".[test,ui]"; } \
		|| { $(PY) -m ensurepip --default-pip >/dev/null && $(PY) -m pip install --quiet -e ".[test,ui]"; } \
		|| { echo "could not install the dependencies into $(VENV) with uv or pip (see above; pip needs python3's ensurepip, e.g. the python3-venv package)" >&2; exit 1; }
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m jaxmodel.demo --out demo_out

# the browser explorer on http://127.0.0.1:8765/ (Ctrl-C stops it)
ui: $(STAMP)
	$(VENV)/bin/jaxmodel ui

test: $(STAMP)
	$(PY) -m pytest -q -n 2

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 -m ""

experiments: $(STAMP)
	for f in experiments/[!_]*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) demo_out experiments/out .pytest_cache
