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
