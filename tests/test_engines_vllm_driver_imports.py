"""The driver imports no vLLM worker module (spcli/engines/vllm/keys.py holds what it shares with them).

vllm_worker.py imports vLLM's GPU (or CPU) worker and model runner; on CPU that import patches torch.cuda
for the whole process, and on GPU it pulls CUDA-side modules into a process that must touch no GPU before
vLLM has started its own. Checked in a fresh interpreter, whose sys.modules holds only what the driver's
imports bring. Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_engines_vllm_driver_imports.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python")

WORKER_MODULES = ("vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.cpu_worker",
                  "vllm.v1.worker.cpu_model_runner", "spcli.engines.vllm.worker.positions")


def modules_after(code: str) -> set[str]:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_driver_side_imports_no_worker_module():
    loaded = modules_after("import vllm\nfrom vllm import LLM\nimport spcli.job.run, spcli.engines.vllm.driver.engine, "
                           "spcli.engines.vllm.driver.base_pass, spcli.engines.vllm.keys")
    assert "spcli.engines.vllm.driver.base_pass" in loaded and "vllm.entrypoints.llm" in loaded
    assert not loaded & set(WORKER_MODULES), sorted(loaded & set(WORKER_MODULES))


def test_the_check_sees_a_worker_import():
    """Teeth: importing the worker module (as the driver did through vllm_pass) is seen."""
    loaded = modules_after("import spcli.engines.vllm.worker.positions")
    assert "spcli.engines.vllm.worker.positions" in loaded and loaded & set(WORKER_MODULES[:4])
