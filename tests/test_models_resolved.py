"""A run resolved once (spcli/models/resolved.py): one `spcli run` locates, picks and resolves each thing once, the
banner and the fingerprint print what the ResolvedRun holds, and the engines' ModelStack is made complete."""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from call_counts import count_resolvers
from spcli.cli import app
from spcli.config.run import RunConfig
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.models import load
from spcli.models import speculator
from spcli.models import files
from spcli.io.shards import discover
from spcli.models.resolved import ResolvedRun, resolve_run

PRUNED = ["--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, "--min-free", "0", "--unit", "chunk", "--keep-last", "8",
          "--max-tokens", "3", "--dtype", "float32"]


def prompts(tmp_path, k: int = 3):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": "word " * (60 + 20 * i)}) + "\n" for i in range(k)))
    return path


@pytest.mark.parametrize("speculator", ["default", "folder"])
def test_one_run_resolves_each_thing_once(monkeypatch, tmp_path, tiny_dir, speculator):
    """Before resolution moved into one value, one run located the model twice and a folder speculator six times
    more, asked default_speculator six times and pick_device seven."""
    extra = [] if speculator == "default" else ["--speculator", str(tiny_dir)]
    counts = count_resolvers(monkeypatch)
    res = CliRunner().invoke(app, ["run", str(prompts(tmp_path)), "--out", str(tmp_path / "out"), "--model",
                                   str(tiny_dir), *PRUNED, *extra])
    assert res.exit_code == 0, res.output
    assert "done: 3 rows (0 failed)" in res.output and "kept 100.0%" not in res.output  # the speculator ran
    assert counts["locate"] == (1 if speculator == "default" else 2)  # the model, then a separate speculator
    assert counts["default_speculator"] == (1 if speculator == "default" else 0)
    assert counts["pick_device"] == counts["resolve_dtype"] == counts["score_defaults"] == 1


def test_keep_one_locates_no_speculator(monkeypatch, tmp_path, tiny_dir):
    counts = count_resolvers(monkeypatch)
    resolved = resolve_run(RunConfig(inputs=("x",), out="o", model=str(tiny_dir), speculator=str(tiny_dir / "absent"),
                                     select=SelectConfig(keep=1.0)))
    assert counts["locate"] == 1 and resolved.speculator_path is None and resolved.scoring is None


def resolved_pair(tmp_path, tiny_dir) -> ResolvedRun:
    cfg = RunConfig(inputs=(str(prompts(tmp_path)),), out=str(tmp_path / "out"), model=str(tiny_dir),
                    speculator=str(tiny_dir), dtype="float32", score=ScoreConfig(lookahead=1))
    return resolve_run(cfg)


def test_banner_and_fingerprint_read_the_resolved_value(tmp_path, tiny_dir):
    """Changed after resolution (a device and dtype this machine would not pick, another scoring path), the banner
    and the fingerprint follow the value: neither derives its own."""
    from spcli.job.banner import banner_lines
    from spcli.job.manifest import fingerprint_fields

    resolved = resolved_pair(tmp_path, tiny_dir)
    assert resolved.speculator_path == tiny_dir and resolved.scoring == speculator.SAME_TOKENIZER
    assert resolved.cfg.score.is_resolved and resolved.cfg.select.chunk is not None
    changed = dataclasses.replace(resolved, device=torch.device("meta"), dtype_why="why not",
                                  cfg=dataclasses.replace(resolved.cfg, dtype="float16", speculator_dtype="float32"),
                                  scoring=speculator.CROSS_TOKENIZER, settings_source="a test",
                                  speculator_dtype_why="why so")
    shards = discover(changed.cfg.inputs)
    fields = fingerprint_fields(changed, shards)
    banner = "\n".join(banner_lines(changed, shards, 3, tmp_path / "out"))
    assert (fields["device_type"], fields["dtype"], fields["scoring"]) == ("meta", "float16", speculator.CROSS_TOKENIZER)
    assert fields["model_path"] == str(tiny_dir) and fields["speculator"] == str(tiny_dir)
    assert f"model: {tiny_dir}, float16 (why not)" in banner
    assert fields["speculator_dtype"] == "float32"  # recorded where it is not the run's
    assert f"speculator: {tiny_dir}, {speculator.CROSS_TOKENIZER}, float32 (why so) (" in banner
    assert "settings from a test" in banner
    assert "engine: hf, device meta, batch size 8" in banner


def test_the_hf_engine_builds_its_stack_from_the_resolved_value(tmp_path, tiny_dir):
    from spcli.engines.hf.engine import HFEngine

    resolved = resolved_pair(tmp_path, tiny_dir)
    stack = HFEngine(resolved).stack
    assert (stack.path, stack.speculator_name, stack.dtype, stack.device) == (
        resolved.model_path, resolved.speculator, resolved.dtype, resolved.device)
    assert stack.speculator_path == tiny_dir  # located once, by the resolution
    assert dataclasses.replace(stack, speculator_name="self:1").speculator_path is None  # another speculator: its own


def test_model_stack_is_complete_at_construction(tiny_dir):
    """No field of a ModelStack changes after it is made (the vLLM engine once set speculate_remote,
    max_prompt_len and prompt_len_flag on a made stack); only the lazily read speculator is cached."""
    stack = load.open_stack(files.read_base(tiny_dir), str(tiny_dir), "self:2", "float32", torch.device("cpu"),
                            max_prompt_len=200, prompt_len_flag="--max-prompt-len")
    assert (stack.max_prompt_len, stack.prompt_len_flag, stack.speculate_remote) == (200, "--max-prompt-len", None)
    for name in ("speculate_remote", "max_prompt_len", "prompt_len_flag", "max_positions", "speculator_layers"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(stack, name, None)
    assert stack.speculator.config.num_hidden_layers == 2  # the cache still fills on first use
