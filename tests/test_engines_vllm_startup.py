"""`spcli run --engine vllm` asks nothing of the CUDA runtime before vLLM has started its processes.

vLLM forks its engine and workers unless torch reports CUDA initialised; a CUDA driver initialised in
the parent by `torch.cuda.is_available()` (cudaGetDeviceCount -> cuInit, which torch does not record)
breaks CUDA in the forked children (vLLM issue #32611). spcli's device checks count GPUs through NVML
(spcli/models/device.py) and its CLI turns on torch's NVML-based check for the libraries it calls.

On this CPU-only build torch has no CUDA runtime, so the test gives torch the CUDA code paths of a GPU
build: `_is_compiled` true, NVML answering 0 GPUs, and a recorder as `torch._C._cuda_getDeviceCount`
(the runtime's count). The run is stopped at the first process start (vLLM's engine core), so no engine
actually starts here. Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_engines_vllm_startup.py`.
"""

from __future__ import annotations

import multiprocessing.process
import sys
import traceback

import pytest
import torch

import spcli.models.device
from spcli.cli import main
from spcli.models.device import NVML_CHECK

pytest.importorskip("vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python")


class ProcessStarted(Exception):
    """Raised by the first multiprocessing start: vLLM is about to fork its engine core."""


def run_until_vllm_forks(monkeypatch, tmp_path, speculator: str) -> list[str]:
    """The call sites that asked the CUDA runtime for its device count before the first process start."""
    early: list[str] = []

    def runtime_device_count() -> int:
        early.append("".join(traceback.format_stack(limit=12)))
        return 0

    def start(self):
        raise ProcessStarted(self.name)

    monkeypatch.delenv(NVML_CHECK, raising=False)  # as a user's shell has it
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", runtime_device_count, raising=False)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "' + "the harbour was quiet at dawn " * 40 + '"}\n')
    monkeypatch.setattr(sys, "argv", ["spcli", "--debug", "run", str(src), "--out", str(tmp_path / "out"),
                                      "--engine", "vllm", "--model", "smollm2-135m", "--dtype", "float32",
                                      "--speculator", speculator, "--keep", "0.3", "--max-tokens", "4"])
    with pytest.raises(ProcessStarted):  # reached vLLM's first process: the whole start-up ran before it
        main()
    return early


def test_no_cuda_runtime_call_before_vllm_forks(monkeypatch, tmp_path, tiny_dir):
    early = run_until_vllm_forks(monkeypatch, tmp_path, str(tiny_dir))
    assert early == [], "the CUDA runtime was asked before vLLM forked, from:\n" + "\n".join(early)


def test_the_old_device_check_is_caught(monkeypatch, tmp_path, tiny_dir):
    """Teeth: spcli's check as it was (`torch.cuda.is_available()` without the NVML check) is caught."""
    monkeypatch.setattr(spcli.models.device, "cuda_device_count", lambda: int(torch._C._cuda_getDeviceCount()))
    early = run_until_vllm_forks(monkeypatch, tmp_path, str(tiny_dir))
    assert early and any("pick_device" in stack for stack in early)
