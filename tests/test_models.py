"""Model names, their resolution, and the speculator's tokenizer check."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from spcli.cli import app
from spcli.engine.load import check_same_vocabulary, load_tokenizer, parse_self
from spcli.errors import ConfigError, ModelError
from spcli.models import PRESETS, locate


def test_models_command_lists_every_preset_and_availability():
    res = CliRunner().invoke(app, ["models"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name, preset in PRESETS.items():
        line = next(line for line in lines if line.startswith(name + " "))
        assert preset.source in line and preset.speculator in line
    smol = next(line for line in lines if line.startswith("smollm2-135m "))
    assert smol.rstrip().endswith("yes")
    random = [line.split()[:3] for line in lines if line.startswith("random-")]
    assert random == [["random-405b", "random", "weights"], ["random-8b", "random", "weights"]], "every name bench accepts"
    assert "random-405b      random weights from a config (spcli bench) random-8b     1 bfloat16      yes (built on first use)" in lines
    scoring = {line.split()[0]: line for line in res.output.split("\n\n")[1].splitlines()[1:]}
    assert scoring.keys() == PRESETS.keys()
    assert "layers 14, window 32, look-ahead 0, pool 31, rows mean, chunk 8 (preset smollm2-135m)" in scoring["smollm2-135m"]
    assert "layers all, window 0, look-ahead 8, pool 13, rows mean, chunk 32 (the paper's recipe)" in scoring["llama-70b"]


def test_models_shows_a_calibrate_profile(smollm2_dir, tmp_path, monkeypatch):
    """A profile written for the embedded model's folder is what `spcli models` reports for it."""
    from spcli import profiles

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    dest = tmp_path / "cache" / "models" / "smollm2-135m-instruct-bf16"
    dest.parent.mkdir(parents=True)
    dest.symlink_to(smollm2_dir)
    path = profiles.write_profile(dest, "self", {"window": 16, "lookahead": 0, "score_layers": "18"}, {})
    line = next(l for l in CliRunner().invoke(app, ["models"]).output.splitlines()[1:] if "(profile" in l)
    assert line.startswith("smollm2-135m ") and f"layers 18, window 16, look-ahead 0, pool 13, rows mean, chunk 32 (profile {path})" in line


def test_readme_model_table_matches_spcli_models():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("### Models", 1)[1].split("\n\n", 2)[1]
    rows = {m.group(1): [c.strip().strip("`") for c in m.group(0).split("|")[1:-1]]
            for m in re.finditer(r"^\| `([^`]+)` \|.*\|$", table, re.M)}
    table = CliRunner().invoke(app, ["models"]).output.split("\n\n")[0]  # the scoring lines follow a blank line
    listed = {line[:16].strip(): line[76:89].strip() for line in table.splitlines()[1:]}
    assert {name: cells[-1] for name, cells in rows.items()} == listed, "README's names and dtypes are `spcli models`'s"


def test_unknown_name_and_missing_hf_model_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        locate("nope")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="huggingface-cli download meta-llama/Llama-3.1-8B-Instruct"):
        locate("llama-8b")


def test_local_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        locate(str(tmp_path))


def test_speculator_with_other_vocabulary_is_refused(tmp_path, smollm2_dir):
    other = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=other, unk_token="[UNK]").save_pretrained(tmp_path)
    base = load_tokenizer(smollm2_dir)
    check_same_vocabulary(base, load_tokenizer(smollm2_dir), "a", "b")  # same family: fine
    with pytest.raises(ConfigError, match="does not share the tokenizer"):
        check_same_vocabulary(base, load_tokenizer(tmp_path), "smollm2-135m", str(tmp_path))


def test_parse_self():
    assert parse_self("self:12") == 12
    assert parse_self("self") == 0
    assert parse_self("llama-8b") is None
    with pytest.raises(ConfigError):
        parse_self("self:x")
