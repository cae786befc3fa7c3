"""Engine failures (spcli/stages/failures.py, hf.py): a device error stops the run, out of memory retries row by row."""

from __future__ import annotations

import pytest

from spcli.stages import failures

from spcli.models import load
from test_bad_input import cli, last_line
from test_job_run import read_outputs

PROMPTS = [{"id": f"r{i}", "prompt": f"item {i} of the list: apples pears plums"} for i in range(6)]


def argv(src, out, tiny_dir):  # full prefill: every forward is the base's; 2 forwards per batch (prefill + 1 step)
    return ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--keep", "1.0", "--dtype", "float32",
            "--batch-size", "2", "--commit-interval", "0", "--max-tokens", "2"]


@pytest.fixture()
def inject(monkeypatch):
    """Make the base model raise `error` on its forward calls numbered in `calls` (1-based)."""
    def arm(error: BaseException, calls: set[int]):
        real = load.load_causal_lm
        count = [0]

        def load_with_fault(*args, **kwargs):
            loaded = real(*args, **kwargs)

            def hook(module, inputs):
                count[0] += 1
                if count[0] in calls:
                    raise error
            loaded.model.register_forward_pre_hook(hook)
            return loaded
        monkeypatch.setattr(load, "load_causal_lm", load_with_fault)
        return count
    return arm


@pytest.mark.parametrize("message", ["CUDA error: an illegal memory access was encountered",
                                     "CUDA error: device-side assert triggered",
                                     "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"])
def test_device_error_stops_the_run_after_committing_earlier_batches(tmp_path, tiny_dir, write_jsonl, inject, capsys,
                                                                      message):
    src, out = write_jsonl(PROMPTS), tmp_path / "out"
    inject(RuntimeError(message), calls={5})  # the third batch's prefill
    code, stdout, err = cli(argv(src, out, tiny_dir), capsys)
    assert code == 1, err
    first = message.split("\n")[0]
    assert last_line(err) == (f"spcli: error: the hf engine hit a device error ({first}); committed rows are safe: "
                              "fix the device and run the same command again to resume")
    rows = read_outputs(out)
    assert sorted(r["id"] for r in rows) == ["r0", "r1", "r2", "r3"]
    assert all(r["error"] is None for r in rows), "no error rows for the records after the failure"


@pytest.mark.parametrize("error", [RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB"),
                                   MemoryError(), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")])
def test_out_of_memory_batch_is_retried_row_by_row(tmp_path, tiny_dir, write_jsonl, inject, capsys, error):
    src = write_jsonl(PROMPTS)
    code, _, err = cli(argv(src, tmp_path / "clean", tiny_dir), capsys)
    assert code == 0, err
    clean = {r["id"]: r["output"] for r in read_outputs(tmp_path / "clean")}
    inject(error, calls={1})  # the first batch, once: its rows alone fit
    code, _, err = cli(argv(src, tmp_path / "out", tiny_dir), capsys)
    assert code == 0, err
    rows = read_outputs(tmp_path / "out")
    assert {r["id"]: r["output"] for r in rows} == clean
    assert all(r["error"] is None for r in rows)


def test_a_row_that_still_runs_out_of_memory_is_its_own_error_row(tmp_path, tiny_dir, write_jsonl, inject, capsys):
    src = write_jsonl(PROMPTS)
    inject(MemoryError(), calls={1, 2})  # the batch, then its first row alone
    code, _, err = cli(argv(src, tmp_path / "out", tiny_dir), capsys)
    assert code == 0, err
    rows = {r["id"]: r for r in read_outputs(tmp_path / "out")}
    n = rows["r1"]["num_prompt_tokens"]  # r0's prompt is as long; an error row reports 0
    assert rows["r0"]["error"].endswith(f":row 0 (line 1): model failed: out of memory on {n} prompt tokens (MemoryError)")
    assert [i for i, r in rows.items() if r["error"]] == ["r0"]


@pytest.mark.parametrize("message,is_oom,is_device", [
    ("CUDA out of memory. Tried to allocate 20.00 MiB", True, False),
    ("CUDA error: out of memory", True, False),
    ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes", True, False),
    ("CUDA error: an illegal memory access was encountered", False, True),
    ("CUDA error: device-side assert triggered", False, True),
    ("NCCL communicator was aborted on rank 1", False, True),
    ("shape '[2, 3]' is invalid for input of size 7", False, False),
])
def test_failure_kinds(message, is_oom, is_device):
    e = RuntimeError(message)
    assert failures.is_out_of_memory(e) is is_oom
    assert failures.is_device_error(e) is is_device
