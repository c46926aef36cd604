# jaxnorm: set-up, tests, demo, verifier, benchmarks.
# `make setup` finds a Python >= 3.12 (on PATH, or under pyenv) and builds .venv.
VENV   := .venv
PY     := $(VENV)/bin/python
PYTHON ?= $(shell for p in python3.13 python3.12 python3; do \
             command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; exit 0; }; \
           done; \
           root=$$(pyenv root 2>/dev/null || echo $$HOME/.pyenv); \
           ls -d $$root/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V | tail -1)

.PHONY: setup test verify demo bench clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python >= 3.12 found (PATH or pyenv). Install one, or run: make setup PYTHON=/path/to/python3.12"; exit 1; }
	@echo "Using $(PYTHON) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,demo]'
	touch $@

setup: $(VENV)/.installed

# HYPOTHESIS_PROFILE: ci (few examples, the default here), dev, thorough (tests/conftest.py).
# tests/file_progress.py prints a line per test file as it finishes (xdist prints only dots).
test: setup
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} PYTHONPATH=tests$${PYTHONPATH:+:$$PYTHONPATH} \
		$(PY) -m pytest -q -n 2 --dist loadfile -p file_progress

# The verifier's report for the xla path (python -m verify -h for the kernels' paths).
verify: setup
	$(PY) -m verify --impl xla --examples 25

demo: setup
	$(PY) examples/demo.py

# The ledger suite: predicted bytes, FLOPs and roofline time per model preset (CPU, instant).
# The measured suites need an H200: python -m bench --suite norm-gemm,... (python -m bench -h).
bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
