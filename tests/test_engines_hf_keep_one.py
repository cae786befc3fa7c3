"""`--engine hf --keep 1.0` (the full-prefill baseline) needs no speculator: a preset whose default
speculator is not on this machine still runs (spcli/engines/hf/engine.py, spcli/job/run.py)."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import dataclasses

from typer.testing import CliRunner

from spcli.models import lookup
from spcli.cli import app


def test_keep_one_runs_without_the_presets_speculator(monkeypatch, write_jsonl, tmp_path, smollm2_dir):
    monkeypatch.setitem(lookup.PRESETS, "smollm2-135m",
                        dataclasses.replace(lookup.PRESETS["smollm2-135m"], speculator="llama-8b"))
    assert not lookup.is_available("llama-8b")
    jl = write_jsonl([{"id": "a", "prompt": "The harbour was quiet at dawn. " * 20}])
    common = ["run", str(jl), "--model", "smollm2-135m", "--dtype", "float32", "--max-tokens", "3"]
    res = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "full"), "--keep", "1.0"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "done: 1 rows (0 failed)" in res.output
    res = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "pruned"), "--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE])
    assert res.exit_code != 0 and "llama-8b" in str(res.exception), (res.output, res.exception)
