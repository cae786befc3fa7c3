"""spcli/dtype.py: `--dtype auto` per device, and what a run records and says about it."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.dtype import cpu_has_amx, resolve_dtype
from test_run import ARGS, prompt_rows

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_auto_picks_per_device():
    assert resolve_dtype("auto", "smollm2-135m", CUDA) == ("bfloat16", "auto: the model's dtype on cuda")
    assert resolve_dtype(None, "smollm2-135m", CUDA)[0] == "bfloat16"  # None is auto
    dtype, why = resolve_dtype("auto", "smollm2-135m", CPU, has_amx=False)
    assert dtype == "float32" and "no AMX" in why and "bfloat16 is slower" in why
    dtype, why = resolve_dtype("auto", "smollm2-135m", CPU, has_amx=True)
    assert dtype == "bfloat16" and "AMX" in why
    assert resolve_dtype("auto", "/some/folder", CPU, has_amx=False)[0] == "float32"  # a folder: bfloat16 by default


def test_a_given_dtype_wins_everywhere():
    for device, amx in ((CPU, False), (CPU, True), (CUDA, None)):
        assert resolve_dtype("bfloat16", "smollm2-135m", device, has_amx=amx) == ("bfloat16", "--dtype")
    assert resolve_dtype("float16", "llama-8b", CUDA) == ("float16", "--dtype")


def test_this_machine_answers_what_torch_sees():
    assert resolve_dtype("auto", "smollm2-135m", CPU)[0] == ("bfloat16" if cpu_has_amx() else "float32")


def test_run_banner_and_fingerprint_carry_the_resolved_dtype(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(prompt_rows(2))
    out = tmp_path / "out"
    args = [a for a in ARGS if a not in ("--dtype", "float32")]  # the default: auto
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--device", "cpu", *args])
    assert res.exit_code == 0, res.output
    want, why = resolve_dtype("auto", str(tiny_dir), CPU)
    assert f"INFO model: {tiny_dir}, {want} ({why})" in res.output.splitlines()
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["fingerprint_fields"]["dtype"] == want and doc["config"]["dtype"] == want
    # a directory made with the other dtype is refused, naming the change (README: the upgrade note)
    other = "bfloat16" if want == "float32" else "float32"
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--device", "cpu",
                                   *args, "--dtype", other, "--max-tokens", "5"])
    assert f"dtype: '{want}' -> '{other}'" in str(res.exception), res.output
