"""Which speculator configuration a run gets: flags > calibrate profile > preset > fallback, and where it came from."""

from __future__ import annotations

import pytest

from spcli.models import profiles
from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE, ScoreConfig, SelectConfig


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_preset_self_score_applies_to_self_and_to_a_self_k_holding_its_layer(cache):
    resolve = lambda spec: profiles.resolve_score(ScoreConfig(), "smollm2-135m", None, spec)
    assert (resolve("self").window, resolve("self").lookahead, resolve("self").score_layers) == (32, 0, "14")
    assert resolve("self:20").score_layers == "14"
    paper = resolve("self:8")  # layer 14 is not among its 8 layers: the paper's recipe
    assert (paper.window, paper.lookahead, paper.score_layers) == (PAPER_SCORE["window"], 8, "all")
    assert resolve("llama-1b").lookahead == 8  # a separate speculator: the paper's recipe
    assert (resolve("self").pool, resolve("self:8").pool) == (31, PAPER_SCORE["pool"])
    chunk = lambda spec: profiles.resolve_select(SelectConfig(), "smollm2-135m", None, spec).chunk
    assert (chunk("self"), chunk("self:8"), chunk("llama-1b")) == (8, PAPER_CHUNK, PAPER_CHUNK)
    assert profiles.resolve_select(SelectConfig(chunk=16), "smollm2-135m", None, "self").chunk == 16  # the flag wins


def test_a_profile_beats_the_preset_and_flags_beat_both(cache, tiny_dir):
    assert profiles.score_defaults("x", tiny_dir, "self:2")[1] == "fallback: early exit at the middle layer"
    path = profiles.write_profile(tiny_dir, "self:2", {"window": 16, "lookahead": 0, "score_layers": "1"}, {"why": 1})
    assert path.parent == cache / "cache" / "profiles"
    defaults, source = profiles.score_defaults("x", tiny_dir, "self:2")
    # a profile without pool, rows and chunk (an older calibrate) gets the paper's, which that calibrate measured with
    assert defaults == {"window": 16, "lookahead": 0, "score_layers": "1", "pool": 13, "rows": "mean", "chunk": 32}
    assert source == f"profile {path}"
    assert profiles.read_profile(tiny_dir, "self:3") is None  # keyed by the speculator too
    got = profiles.resolve_score(ScoreConfig(window=4), "x", tiny_dir, "self:2")
    assert (got.window, got.lookahead, got.score_layers) == (4, 0, "1")  # the flag wins, the rest from the profile
    profiles.write_profile(tiny_dir, "self:2", {"window": 16, "lookahead": 0, "score_layers": "1", "pool": 21,
                                               "rows": "max", "chunk": 4}, {})
    got = profiles.resolve_score(ScoreConfig(), "x", tiny_dir, "self:2")
    assert got.pool == 21 and got.rows == "max" and profiles.resolve_select(SelectConfig(), "x", tiny_dir, "self:2").chunk == 4
    assert profiles.resolve_score(ScoreConfig(rows="mean"), "x", tiny_dir, "self:2").rows == "mean"  # the flag wins


def test_the_profile_key_follows_the_folder_content(cache, tmp_path, tiny_dir):
    import shutil

    copy = shutil.copytree(tiny_dir, tmp_path / "renamed")
    assert profiles.model_key(copy) == profiles.model_key(tiny_dir)  # a renamed copy finds its profile
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("4096", "2048"))
    assert profiles.model_key(copy) != profiles.model_key(tiny_dir)  # a changed model does not


def test_a_separate_speculator_without_preset_or_profile_falls_back_to_the_papers_recipe(cache, tiny_dir):
    defaults, source = profiles.score_defaults(str(tiny_dir), tiny_dir, str(tiny_dir))
    assert defaults == {**PAPER_SCORE, "chunk": PAPER_CHUNK} and source == "fallback: the paper's recipe"


def test_settings_source_names_flags_profile_preset_or_fallback(cache, tiny_dir):
    """What the banner's speculator line says; a fallback suggests `spcli calibrate` for this model."""
    def source(model, path, spec, **flags):
        select = {"chunk": flags.pop("chunk")} if "chunk" in flags else {}
        score = profiles.resolve_score(ScoreConfig(**flags), model, path, spec)
        return profiles.settings_source(score, profiles.resolve_select(SelectConfig(**select), model, path, spec),
                                        model, path, spec)

    assert source("smollm2-135m", None, "self") == "preset smollm2-135m"
    name = str(tiny_dir)
    hint = f"; `spcli calibrate --model {name} --speculator self` measures them for this model"
    assert source(name, tiny_dir, "self") == "fallback: early exit at the middle layer" + hint
    assert source(name, tiny_dir, "self", window=8) == "flags (window), the rest from fallback: early exit at the middle layer" + hint
    assert source(name, tiny_dir, "self", window=8, lookahead=2, score_layers="all", pool=3, rows="max", chunk=4) == "flags"
    path = profiles.write_profile(tiny_dir, "self", {"window": 16, "lookahead": 0, "score_layers": "1"}, {})
    assert source(name, tiny_dir, "self") == f"profile {path}"


def test_the_qwen_preset_scores_each_measured_speculator_with_its_calibrated_layer(cache):
    """The calibrations: the 0.5B (same tokenizer) at layer 9 (issue 51's, with needle-facts), smollm2-135m (another tokenizer) at layer 18,
    each with early exit; another speculator gets the fallback."""
    defaults, source = profiles.score_defaults("qwen2.5-coder-1.5b", None, "qwen2.5-coder-0.5b")
    assert source == "preset qwen2.5-coder-1.5b"
    assert defaults == {"window": 16, "lookahead": 0, "score_layers": "9", "pool": 1, "rows": "max", "chunk": 8}
    defaults, source = profiles.score_defaults("qwen2.5-coder-1.5b", None, "smollm2-135m")
    assert source == "preset qwen2.5-coder-1.5b"
    assert defaults == {"window": 16, "lookahead": 0, "score_layers": "18", "pool": 31, "rows": "max", "chunk": 8}
    assert profiles.score_defaults("qwen2.5-coder-1.5b", None, "llama-1b")[1] == "fallback: the paper's recipe"
    assert profiles.score_defaults("qwen2.5-coder-0.5b", None, "smollm2-135m")[1] == "fallback: the paper's recipe"


def test_a_folder_copy_of_a_preset_model_gets_the_presets_scoring(tmp_path, smollm2_dir):
    """Issue 30: the same weights passed as a folder score as the preset does (not with the fallback), and the
    source says it was recognised; a folder with other weights is not recognised."""
    import os
    import shutil

    from spcli.models import lookup
    from spcli.models.profiles import score_defaults, speculator_identity

    copy = tmp_path / "my-copy"
    copy.mkdir()
    for f in smollm2_dir.iterdir():
        (os.link if f.suffix == ".safetensors" else shutil.copy)(f, copy / f.name)  # same names and sizes
    assert lookup.recognise(str(copy)) == "smollm2-135m"
    assert lookup.default_speculator(str(copy)) == "self"
    by_name, _ = score_defaults("smollm2-135m", smollm2_dir, "self")
    by_folder, source = score_defaults(str(copy), copy, "self")
    assert by_folder == by_name and by_folder["score_layers"] == "14"
    assert source.startswith("preset smollm2-135m (recognised") and str(copy) in source
    assert speculator_identity(str(copy)) == "smollm2-135m"
    config = (copy / "config.json").read_text()
    (copy / "config.json").write_text(config.replace('"num_hidden_layers": 30', '"num_hidden_layers": 29'))
    assert lookup.recognise(str(copy)) is None
    _, source = score_defaults(str(copy), copy, "self")
    assert source.startswith("fallback")
