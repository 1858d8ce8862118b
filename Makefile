# fabricctl: `make demo` runs the main job on embedded defaults, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: venv vllm-env groff demo test test-fast lint bench man clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# vLLM's CPU build (pinned) in a venv of its own: the real engine the integration tests run.
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	PYTHON=$(PYTHON) bash scripts/vllm_env.sh $(VLLM_VENV)

demo: $(STAMP)
	$(PY) -m fabricctl.cli.demo

# ruff, the layering contracts (import-linter, pyproject.toml) and the type checker
lint: $(STAMP)
	$(PY) -m ruff check fabricctl tests bench examples scripts
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

# groff lints the man pages in the tests; Debian's groff-base provides it.
groff:
	@command -v groff >/dev/null || (apt-get update -qq && apt-get install -y -qq groff-base) \
		|| echo "groff unavailable: the man-page lint test will skip"

man: $(STAMP)
	$(PY) scripts/gen_man.py

# The tests without vLLM run on two workers (each test owns its data dir, sockets and
# ports); the real-vLLM ones run one at a time, since a CPU vLLM server takes every core.
test-fast: $(STAMP) groff lint
	$(PY) -m pytest -q -n 2 -m "not real_vllm"

# The two venvs are independent: they install side by side (lint runs once .venv is in,
# while vLLM's still installs).
test: groff
	$(MAKE) --no-print-directory -j2 lint vllm-env
	$(PY) -m pytest -q -n 2 -m "not real_vllm"
	$(PY) -m pytest -q -m real_vllm

bench: $(STAMP)
	$(PY) bench/core_bench.py
	$(PY) bench/path_bench.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
