# The whole set-up on a fresh machine is `make demo` and `make test`; both create .venv when
# missing and bring it up to date when pyproject.toml changed. uv (from the package index, into
# .venv) installs the dependencies in a few seconds, plain pip in half a minute; pip is the
# fall-back where uv cannot be installed. uv reads UV_* settings, not pip's configuration.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all experiments clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	test -x $(UV) || $(PYTHON) -m pip --python $(PY) install --quiet uv \
		|| { $(PY) -m ensurepip --default-pip >/dev/null && $(PY) -m pip install --quiet uv; } \
		|| true
	if test -x $(UV); then $(UV) pip install --quiet --python $(PY) -e ".[test]"; \
	else $(PY) -m ensurepip --default-pip >/dev/null && $(PY) -m pip install --quiet -e ".[test]"; fi
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
