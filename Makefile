# fabricctl: `make demo` runs the main job on embedded defaults, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint bench man clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m fabricctl.demo

lint: $(STAMP)
	$(PY) -m ruff check fabricctl tests bench examples

test-fast: $(STAMP)
	$(PY) -m ruff check fabricctl tests bench examples
	$(PY) -m pytest -q -m "not real_vllm"

test: $(STAMP)
	$(PY) -m ruff check fabricctl tests bench examples
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/core_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
