# One command sets up and runs the demo (`make demo`); one sets up and runs the tests (`make test`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; the package itself accepts torch>=2.4 (see pyproject.toml).
TORCH_PIN ?= torch==2.13.0

.PHONY: setup demo test test-slow bench clean browser

setup: $(VENV)/.installed

# The core package alone: what the demo needs.
$(VENV)/.core: pyproject.toml setup.py src/twice/_native.c $(wildcard src/twice/csrc/*) \
        $(wildcard src/twice/portable/native/csrc/*) $(wildcard vendor/xxhash/*) Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e .
	touch $@

# Everything the tests use (every integration's library, the linters).
$(VENV)/.installed: $(VENV)/.core
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.core
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/demo.sh

# The browser tests use Debian's chromium; installed here where apt can, skipped (with a reason) elsewhere.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
	  || echo "note: chromium not installed; the browser test will be skipped"; }

# Test processes: the cores there are, at most 4 (each end-to-end test starts processes of its own).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

# The tests marked slow (fault injection, long multi-process runs) run where there are more
# than 2 cores to share them out; on 2 the suite leaves them out to stay well under 15 minutes,
# and `make test-slow` runs them alone.
SLOW := $(shell [ $(JOBS) -gt 2 ] || echo "-m 'not slow'")

test: setup browser
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench
	$(PY) -m pytest -q -n $(JOBS) $(SLOW)

test-slow: setup browser
	$(PY) -m pytest -q -n $(JOBS) -m slow
	TWICE_EXHAUSTIVE=1 $(PY) -m pytest -q -n $(JOBS) tests/e2e/test_verdicts.py tests/e2e/test_portable_coverage.py tests/unit/portable \
	  tests/e2e/test_doors_matrix.py tests/e2e/test_evidence_matrix.py

bench: setup
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) demo-out .pytest_cache build src/twice/*.so
