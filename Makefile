# One command sets up and runs the demo (`make demo`); one sets up and runs the tests (`make test`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; the package itself accepts torch>=2.4 (see pyproject.toml).
TORCH_PIN ?= torch==2.13.0

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh

test: setup
	$(PY) -m pytest -q

bench: setup
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache
