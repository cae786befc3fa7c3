"""What `spcli plan` refuses, `spcli run --engine vllm` refuses before vLLM starts, with the same message
(spcli/plan/refusals.py): self:K on a quantized (FP8) checkpoint, self with look-ahead, K beyond the
base's layers. "Before vLLM starts": the test fails the first process start (vLLM's engine core) instead
of letting it run, so a refusal that only came from a worker would show as ProcessStarted.
Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_plan_refusals.py`.
"""

from __future__ import annotations

import json
import multiprocessing.process

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import ScoreConfig
from spcli.errors import ConfigError
from spcli.plan.plan import PlanConfig, make_plan

pytest.importorskip("vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python")

EARLY_EXIT = ["--lookahead", "0", "--window", "8", "--score-layers", "2"]


class ProcessStarted(Exception):
    """The first multiprocessing start: vLLM is about to start its engine core."""


@pytest.fixture()
def fp8_dir(tmp_path, smollm2_dir):
    """SmolLM2's folder whose config.json declares an FP8 checkpoint (as Llama-3.1-405B-FP8's does)."""
    folder = tmp_path / "smollm2-fp8"
    folder.mkdir()
    for f in smollm2_dir.iterdir():
        (folder / f.name).symlink_to(f)
    config = json.loads((smollm2_dir / "config.json").read_text())
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fbgemm_fp8"}}))
    return folder


def run_engine(monkeypatch, tmp_path, model: str, *flags: str):
    def start(self):
        raise ProcessStarted(self.name)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt": "' + "the harbour was quiet at dawn " * 40 + '"}\n')
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(tmp_path / "out"), "--engine", "vllm", "--model",
                                   model, "--dtype", "float32", "--keep", "0.3", "--max-tokens", "4", *flags])
    assert not isinstance(res.exception, ProcessStarted), "vLLM was started before the refusal"
    assert res.exit_code != 0 and isinstance(res.exception, ConfigError), (res.output, res.exception)
    assert not (tmp_path / "out").exists()
    return str(res.exception)


def plan_refusal(model: str, speculator: str, score: ScoreConfig) -> str:
    with pytest.raises(ConfigError) as e:
        make_plan(PlanConfig(model=model, speculator=speculator, length=256, score=score))
    return str(e.value)


def test_self_on_an_fp8_checkpoint_is_refused_before_vllm_starts(monkeypatch, tmp_path, fp8_dir):
    message = run_engine(monkeypatch, tmp_path, str(fp8_dir), "--speculator", "self:4", *EARLY_EXIT)
    assert "a fbgemm_fp8 base: transformers cannot run its quantized layers" in message, message
    assert message == plan_refusal(str(fp8_dir), "self:4", ScoreConfig(lookahead=0, window=8, score_layers="2"))


def test_self_with_lookahead_is_refused_before_vllm_starts(monkeypatch, tmp_path, smollm2_dir):
    message = run_engine(monkeypatch, tmp_path, "smollm2-135m", "--speculator", "self:4", "--lookahead", "2")
    assert message.startswith("--engine vllm cannot use --speculator self:4 with look-ahead"), message
    assert message == plan_refusal("smollm2-135m", "self:4", ScoreConfig(lookahead=2))


def test_self_beyond_the_base_layers_is_refused_before_vllm_starts(monkeypatch, tmp_path, smollm2_dir):
    message = run_engine(monkeypatch, tmp_path, "smollm2-135m", "--speculator", "self:40", *EARLY_EXIT)
    assert "1 <= K <= 30" in message, message


def test_the_check_sees_a_started_vllm(monkeypatch, tmp_path, smollm2_dir):
    """Teeth: a run that passes every refusal reaches vLLM's first process start."""
    with pytest.raises(AssertionError, match="vLLM was started before the refusal"):
        run_engine(monkeypatch, tmp_path, "smollm2-135m", "--speculator", "self:4", *EARLY_EXIT)
