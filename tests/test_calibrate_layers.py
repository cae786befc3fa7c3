"""`spcli calibrate` (layer/window mode): causal window scores, the sweep on a constructed case, the choice,
the profile it writes, and one CLI run on the tiny model (3 layers; SmolLM2-135M has 30)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from spcli.calibrate import report
from spcli.calibrate.config import CalibrateConfig
from spcli.calibrate.layers import Setting, recommend, run_flags, settings_of, sweep_prompt, window_importance
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.errors import ConfigError
from spcli.evaluate.metrics import covered, whole_facts
from spcli.kernels.score import smooth


def brute_window(query, key, window, pool, reduce="mean"):
    """Row by row: softmax over the keys up to the row's own position, zeros after, pooled, max over heads; then the
    mean (or max) over the rows."""
    num_heads, num_rows, _ = query.shape
    num_kv_heads, n, head_dim = key.shape
    group = num_heads // num_kv_heads
    rows = []
    for s in range(num_rows - min(window, num_rows), num_rows):
        p = n - num_rows + s
        probs = torch.zeros(num_heads, n)
        for h in range(num_heads):
            logits = key[h // group, : p + 1].double() @ query[h, s].double() / head_dim**0.5
            probs[h, : p + 1] = torch.softmax(logits, dim=0).float()
        rows.append(smooth(probs, pool).amax(dim=0))
    return torch.stack(rows).mean(dim=0) if reduce == "mean" else torch.stack(rows).amax(dim=0)


@pytest.mark.parametrize("pool", [1, 13])
def test_window_importance_matches_row_by_row(pool):
    torch.manual_seed(0)
    query, key = torch.randn(4, 17, 12), torch.randn(2, 63, 12)  # GQA 4 heads on 2, odd sizes
    got = window_importance(query, key, (1, 5, 17, 32), (pool,))[0, 0]
    for i, w in enumerate((1, 5, 17, 32)):  # 32 > the 17 captured rows: all of them
        ref = brute_window(query, key, w, pool)
        assert torch.allclose(ref, got[i], atol=1e-6), f"window {w}: max err {(ref - got[i]).abs().max():.2e}"


def test_window_importance_row_max_matches_row_by_row():
    torch.manual_seed(2)
    query, key = torch.randn(4, 17, 12), torch.randn(2, 63, 12)
    got = window_importance(query, key, (1, 5, 17), (13,), ("mean", "max"))[0]  # [rows, windows, n]
    for i, w in enumerate((1, 5, 17)):
        torch.testing.assert_close(got[0, i], brute_window(query, key, w, 13), atol=1e-6, rtol=0)
        torch.testing.assert_close(got[1, i], brute_window(query, key, w, 13, "max"), atol=1e-6, rtol=0)
    torch.testing.assert_close(got[0, 0], got[1, 0])  # one row: its mean is its max
    assert not torch.allclose(got[0, 2], got[1, 2])


def test_window_importance_for_several_pools_equals_each_pool_alone():
    torch.manual_seed(1)
    query, key = torch.randn(4, 9, 8), torch.randn(2, 40, 8)
    both = window_importance(query, key, (3, 9), (1, 13))[:, 0]
    assert both.shape == (2, 2, 40)
    for i, pool in enumerate((1, 13)):
        torch.testing.assert_close(both[i], window_importance(query, key, (3, 9), (pool,))[0, 0])


NEEDLE, DECOY, N = (1000, 1020), (100, 120), 2048


def constructed(num_layers=3, best=(1,), rows=64):
    """Keys: e0 on the needle span, e1 on a decoy span, 0 elsewhere. The `best` layers' window queries point at
    the needle (10 e0), the others' at the decoy (10 e1): only the best layers can find the fact."""
    keys = torch.zeros(1, N, 8)
    keys[0, NEEDLE[0] : NEEDLE[1], 0] = 1.0
    keys[0, DECOY[0] : DECOY[1], 1] = 1.0
    queries = torch.zeros(num_layers, 2, rows, 8)
    for layer in range(num_layers):
        queries[layer, :, :, 0 if layer in best else 1] = 10.0
    return queries, [keys] * num_layers


def test_sweep_finds_the_layer_that_points_at_the_fact():
    queries, keys = constructed()
    settings = settings_of((16, 64), (13,), (32,))
    recall = sweep_prompt(queries, keys, [NEEDLE], settings, (0.1, 0.2), SelectConfig(keep=1.0))
    assert recall.shape == (3, 2, 2)
    assert (recall[1] == 1.0).all()
    assert (recall[[0, 2]] == 0.0).all()
    assert np.isnan(sweep_prompt(queries, keys, [], settings[:1], (0.1,), SelectConfig(keep=1.0))).all()  # no fact located

    choice = recommend({"niah": recall}, [0.3, 0.6, 0.9], settings, 0.95)
    assert (choice.layer, choice.window, choice.cost, choice.worst, choice.meets_target) == (1, 16, 0.6, 1.0, True)
    assert (choice.pool, choice.chunk) == (13, 32)


def test_sweep_finds_the_pool_and_chunk_that_keep_the_whole_fact():
    """Queries point at 4 of the needle's 20 tokens only: token by token (chunk 1) without pooling keeps just those; a
    pool as wide as the needle spreads the score over all of it, and so does a chunk holding the whole needle."""
    queries, keys = constructed(best=(0, 1, 2))
    keys[0][:] = 0.0
    keys[0][0, 1008:1012, 0] = 1.0  # 4 of the needle's 20 tokens draw the attention
    settings = settings_of((16,), (1, 21), (1, 32))
    recall = sweep_prompt(queries, keys, [NEEDLE], settings, (0.05,), SelectConfig(keep=1.0, keep_last=0, keep_first=0,
                                                                                     min_tokens=0))
    by = {(s.pool, s.chunk): recall[0, i, 0] for i, s in enumerate(settings)}
    assert by[(1, 1)] < 0.5 and by[(21, 1)] == 1.0 and by[(1, 32)] == by[(21, 32)] == 1.0
    choice = recommend({"niah": recall}, [0.2, 0.5, 1.0], settings, 0.95)
    assert choice.layer == 0 and (choice.pool, choice.chunk) != (1, 1) and choice.meets_target


def test_whole_facts_counts_a_fact_only_when_every_token_is_kept():
    kept = torch.tensor([0, 1, 2, 3, 10, 11])
    assert whole_facts(kept, [(0, 4), (10, 13)]) == 0.5  # the second misses token 12
    assert covered(kept, [(0, 4), (10, 13)]) == 6 / 7
    assert whole_facts(kept, [(1, 3)]) == 1.0 and whole_facts(kept, []) is None


def test_sweep_by_whole_facts_scores_a_partly_kept_fact_zero():
    """The pool/chunk case above measured by facts: token by token keeps 4 of 20 needle tokens, a fraction by
    tokens, none by facts; the settings that keep all of it score 1 either way."""
    queries, keys = constructed(best=(0, 1, 2))
    keys[0][:] = 0.0
    keys[0][0, 1008:1012, 0] = 1.0
    settings = settings_of((16,), (1, 21), (1, 32))
    select = SelectConfig(keep=1.0, keep_last=0, keep_first=0, min_tokens=0)
    tokens = sweep_prompt(queries, keys, [NEEDLE], settings, (0.05,), select)
    facts = sweep_prompt(queries, keys, [NEEDLE], settings, (0.05,), select, whole_facts)
    i = settings.index(Setting(16, 1, 1))
    assert 0.0 < tokens[0, i, 0] < 0.5 and facts[0, i, 0] == 0.0
    assert (facts[0, [j for j in range(len(settings)) if j != i], 0] == 1.0).all()


def test_recommend_cheapest_then_higher_mean_recall_then_smaller_window_then_best_below_target():
    r = np.zeros((3, 2, 1))
    r[2, :] = 1.0
    r[1, 1] = 0.96  # layer 1 meets the target with window 64 only
    two_windows = [Setting(16, 13, 32), Setting(64, 13, 32)]
    choice = recommend({"a": r}, [0.3, 0.6, 0.9], two_windows, 0.95)
    assert (choice.layer, choice.window, choice.meets_target) == (1, 64, True)
    two = np.zeros((3, 2, 2))
    two[1, 0], two[1, 1] = (0.96, 0.97), (0.96, 0.99)  # both windows of layer 1 pass, at one cost
    assert recommend({"a": two}, [0.3, 0.6, 0.9], two_windows, 0.95).window == 64  # the higher mean recall
    two[1, 1] = (0.96, 0.97)
    assert recommend({"a": two}, [0.3, 0.6, 0.9], two_windows, 0.95).window == 16  # equal: the smaller window
    # a second task no configuration passes (every task must reach the target): the best worst case, then the cheapest
    choice = recommend({"a": r, "b": np.where(r > 0.9, 0.5, 0.1)}, [0.3, 0.6, 0.9], two_windows, 0.95)
    assert not choice.meets_target and choice.worst == 0.5 and (choice.layer, choice.window) == (1, 64)


def test_recommend_with_max_cost_takes_the_best_recall_that_fits_the_budget():
    r = np.zeros((4, 2, 2))  # [L, NS, NK]
    r[0] = 0.2
    r[1, 0], r[1, 1] = (0.6, 0.7), (0.8, 0.7)  # within budget: setting 1 has the better worst case
    r[2] = 0.99  # the one that meets the target, over the budget
    r[3] = 1.0
    settings = [Setting(16, 13, 8), Setting(32, 13, 8, "max")]
    costs = [0.2, 0.45, 0.6, 0.9]
    assert recommend({"a": r}, costs, settings, 0.95).layer == 2  # no cap: the cheapest meeting the target
    choice = recommend({"a": r}, costs, settings, 0.95, max_cost=0.5)
    assert (choice.layer, choice.window, choice.rows, choice.worst) == (1, 32, "max", 0.7)
    assert not choice.meets_target and choice.max_cost == 0.5
    assert recommend({"a": r}, costs, settings, 0.95, max_cost=0.6).layer == 2  # a cost equal to the cap fits
    assert recommend({"a": r}, costs, settings, 0.5, max_cost=1.0).layer == 3  # the best, not the cheapest passing
    under = recommend({"a": r}, costs, settings, 0.95, max_cost=0.1)  # nothing fits: the cheapest layer's best
    assert under.layer == 0 and under.cost > under.max_cost


def test_table_names_the_shortfalls_and_prints_run_flags():
    settings = [Setting(16, 13, 8), Setting(16, 13, 8, "max")]
    recall = {"niah": np.array([[[0.97, 0.99], [0.9, 0.96]]]), "multidoc-qa": np.array([[[0.5, 0.96], [0.6, 0.97]]])}
    choice = recommend(recall, [0.4], settings, 0.95, max_cost=0.5)
    cfg = CalibrateConfig(keeps=(0.1, 0.3), max_cost=0.5)
    results = {"config": cfg.to_dict(), "keeps": [0.1, 0.3], "tasks": list(recall), "costs": [0.4],
               "settings": [dataclasses.asdict(s) for s in settings], "choice": dataclasses.asdict(choice),
               "grid": report.grid(recall, [0.4], settings, (0.1, 0.3)), "run_flags": run_flags(cfg, choice)}
    text = report.text_table(results)
    assert "choice: layer 0, window 16, pool 13, rows max, chunk 8 (cost 0.40, worst recall 0.60)" in text
    assert "the best worst-case recall at cost <= 0.5; BELOW the target 0.95 at niah@0.1 (0.90), multidoc-qa@0.1 (0.60)" \
        in text
    assert text.endswith("run it: spcli run INPUT... --out DIR --model smollm2-135m --score-layers 0 --window 16 "
                         "--lookahead 0 --pool 13 --rows max --chunk 8")


def test_table_shows_each_layers_best_setting_and_the_choice_when_many_are_swept():
    from spcli.calibrate.report import shown

    settings = settings_of((16, 32), (13, 31), (8,))  # 4 settings: more than the table prints in full
    recall = np.zeros((2, 4, 1))
    recall[0, 2], recall[1, 1], recall[1, 3] = 0.9, 0.95, 0.5  # best: layer 0 setting 2, layer 1 setting 1
    results = {"settings": [dataclasses.asdict(s) for s in settings], "costs": [0.4, 0.8],
               "grid": report.grid({"niah": recall}, [0.4, 0.8], settings, (0.1,)),
               "choice": {"layer": 1, **dataclasses.asdict(settings[3])}}
    got = [(e["layer"], e["window"], e["pool"]) for e in shown(results)]
    assert got == [(0, 32, 13), (1, 16, 31), (1, 32, 31)]  # each layer's best, then the choice under its layer


def test_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="--windows"):
        CalibrateConfig(windows=(0, 16))
    with pytest.raises(ConfigError, match="unknown task"):
        CalibrateConfig(tasks=("nope",))
    with pytest.raises(ConfigError, match="--keep"):
        CalibrateConfig(keeps=(1.0,))
    with pytest.raises(ConfigError, match="--pool"):
        CalibrateConfig(pools=(13, 4))
    with pytest.raises(ConfigError, match="--max-cost must be in"):
        CalibrateConfig(max_cost=0.0)
    with pytest.raises(ConfigError, match="--rows values must be mean or max"):
        CalibrateConfig(rows=("mean", "median"))
    with pytest.raises(ConfigError, match="--metric must be one of facts, tokens"):
        CalibrateConfig(metric="answers")


def test_cli_writes_results_plot_and_a_profile_that_flags_override(tiny_dir, tmp_path, monkeypatch):
    from spcli.models import profiles
    from spcli.cli import app

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "calib"
    args = ["calibrate", "--model", str(tiny_dir), "--speculator", "self", "--tasks", "niah", "--lengths", "300",
            "--samples", "2", "--keep", "0.5", "--windows", "4,16", "--out", str(out), "--write-profile", "--device", "cpu",
            "--pool", "5", "--chunk", "16,4", "--rows", "mean,max", "--max-cost", "0.9"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    doc = json.loads((out / "results.json").read_text())
    assert (out / "calibrate.png").stat().st_size > 0
    assert doc["num_layers"] == 3 and len(doc["grid"]) == 3 * 2 * 2 * 2 and len(doc["examples"]) == 2
    assert len(doc["costs"]) == 3 and doc["costs"] == sorted(doc["costs"]) and 0 < doc["costs"][-1] <= 1
    assert doc["paper"]["recall"]["niah"].keys() == {"0.5"}
    choice = doc["choice"]
    assert doc["config"]["metric"] == "facts" and "recall: mean fraction of fact sentences kept whole" in result.output
    assert (f"choice: layer {choice['layer']}, window {choice['window']}, pool 5, rows {choice['rows']}, "
            f"chunk {choice['chunk']}") in result.output
    assert choice["chunk"] in (16, 4) and choice["max_cost"] == 0.9 and doc["costs"][choice["layer"]] <= 0.9
    assert [(s["pool"], s["rows"], s["chunk"]) for s in doc["settings"]] == [
        (5, "mean", 16), (5, "mean", 4), (5, "max", 16), (5, "max", 4)] * 2
    assert doc["run_flags"] in result.output and f"--rows {choice['rows']}" in doc["run_flags"]

    want = {"window": choice["window"], "lookahead": 0, "score_layers": str(choice["layer"]), "pool": 5,
            "rows": choice["rows"], "chunk": choice["chunk"]}  # what was measured is stored
    assert profiles.read_profile(tiny_dir, "self") == want
    evidence = json.loads(profiles.profile_path(tiny_dir, "self").read_text())["evidence"]
    assert evidence["max_cost"] == 0.9 and evidence["choice"]["max_cost"] == 0.9
    defaults, source = profiles.score_defaults(str(tiny_dir), tiny_dir, "self")
    assert defaults == want and source.startswith("profile")
    flagged = profiles.resolve_score(ScoreConfig(window=7), str(tiny_dir), tiny_dir, "self")
    assert (flagged.window, flagged.lookahead, flagged.score_layers, flagged.pool) == (7, 0, str(choice["layer"]), 5)


def test_a_profile_is_written_again_from_a_saved_run_and_refused_for_another_model(tiny_dir, tmp_path, monkeypatch):
    """--write-profile --from-results: the same profile as the run wrote, without loading a model; refused for
    another speculator, a changed model folder, or without --write-profile."""
    import shutil

    from spcli.models import profiles
    from spcli.cli import app

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    out = tmp_path / "calib"
    args = ["calibrate", "--model", str(model), "--speculator", "self", "--tasks", "niah", "--lengths", "300",
            "--samples", "1", "--keep", "0.5", "--windows", "4,16", "--out", str(out), "--write-profile", "--device", "cpu"]
    assert CliRunner().invoke(app, args).exit_code == 0
    written = profiles.profile_path(model, "self")
    first = json.loads(written.read_text())
    assert json.loads((out / "results.json").read_text())["model_key"] == profiles.model_key(model)
    written.unlink()

    again = ["calibrate", "--model", str(model), "--speculator", "self", "--write-profile", "--from-results", str(out)]
    result = CliRunner().invoke(app, again)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert json.loads(written.read_text()) == first
    assert f"profile written: {written}" in result.output and "--score-layers" in result.output

    other = CliRunner().invoke(app, again[:4] + ["self:2"] + again[5:])
    assert other.exit_code != 0 and "calibrated --model" in str(other.exception) and "--speculator self," in str(other.exception)
    no_flag = CliRunner().invoke(app, [a for a in again if a != "--write-profile"])
    assert no_flag.exit_code != 0 and "give --write-profile" in str(no_flag.exception)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rope_theta": 12345.0}))
    changed = CliRunner().invoke(app, again)
    assert changed.exit_code != 0 and "has changed since it was calibrated" in str(changed.exception)


def test_a_separate_speculator_has_its_own_layers_swept_and_its_profile_used_by_run(tiny_dir, smollm2_dir, tmp_path, monkeypatch):
    """`--speculator FOLDER`: the speculator's layers (2 here, the base has 3) are swept with early exit in the
    speculator, and the profile is keyed by the base folder and that speculator, so `spcli run` picks it up."""
    from tiny_models import build_tiny

    from spcli.models import profiles
    from spcli.cli import app

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    speculator = str(build_tiny(tmp_path / "spec", smollm2_dir, seed=1, num_hidden_layers=2))
    out = tmp_path / "calib"
    assert profiles.score_defaults(str(tiny_dir), tiny_dir, speculator)[1] == "fallback: the paper's recipe"
    args = ["calibrate", "--model", str(tiny_dir), "--speculator", speculator, "--tasks", "niah", "--lengths", "300",
            "--samples", "1", "--keep", "0.5", "--windows", "4,16", "--out", str(out), "--write-profile", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    doc = json.loads((out / "results.json").read_text())
    assert doc["speculator"] == speculator and doc["num_layers"] == 2 and len(doc["costs"]) == 2
    assert doc["paper"]["recall"]["niah"].keys() == {"0.5"}, "the paper's recipe on the speculator, for reference"
    defaults, source = profiles.score_defaults(str(tiny_dir), tiny_dir, speculator)
    assert source == f"profile {doc['profile']}" and defaults["score_layers"] == str(doc["choice"]["layer"])
    assert defaults["lookahead"] == 0 and int(defaults["score_layers"]) < 2


def test_sweep_selects_whole_units_as_run_does():
    """With the prompt's units (`spcli run`'s default --unit sentence), the sweep keeps the fact's sentence whole where
    token-by-token chunks keep only its 4 hot tokens: calibrate measures the selection that ships."""
    queries, keys = constructed(best=(0, 1, 2))
    keys[0][:] = 0.0
    keys[0][0, 1008:1012, 0] = 1.0
    settings = settings_of((16,), (1,), (1,))
    is_new = torch.ones(N, dtype=torch.bool)
    is_new[NEEDLE[0] + 1 : NEEDLE[1]] = False  # the needle's sentence is one unit, every other token one of its own
    units = torch.cumsum(is_new.long(), 0) - 1
    select = SelectConfig(keep=1.0, keep_last=0, keep_first=0, min_tokens=0, min_free=0)
    chunks = sweep_prompt(queries, keys, [NEEDLE], settings, (0.05,), select, whole_facts)
    whole = sweep_prompt(queries, keys, [NEEDLE], settings, (0.05,), select, whole_facts, units={1: units})
    assert chunks[0, 0, 0] == 0.0 and whole[0, 0, 0] == 1.0


def test_held_out_tasks_are_reported_not_chosen_on_and_the_choice_is_compared_with_the_current_setting():
    """--hold-out: a task the choice never saw is measured and printed apart; the model's current setting is
    compared task by task (issue 56: a preset changes only when no worse on every shape)."""
    from spcli.calibrate.layers import current_setting

    settings = [Setting(16, 1, 8, "max"), Setting(16, 31, 8, "mean")]
    # chosen on "a": setting 0 is the cheaper perfect one; held-out "b" says setting 0 is worse there
    recall = {"a": np.array([[[1.0], [1.0]]]), "b": np.array([[[0.5], [1.0]]])}
    choice = recommend({"a": recall["a"]}, [0.4], settings, 0.95)
    assert (choice.pool, choice.worst) == (1, 1.0)
    cfg = CalibrateConfig(tasks=("niah", "multidoc-qa"), hold_out=("multidoc-qa",), keeps=(0.1,))
    current = current_setting({"score_layers": "0", "window": 16, "pool": 31, "rows": "mean", "chunk": 8,
                               "lookahead": 0}, settings)
    assert current == {"layer": 0, "window": 16, "pool": 31, "rows": "mean", "chunk": 8}
    results = {"config": cfg.to_dict(), "keeps": [0.1], "tasks": ["a", "b"], "held_out": ["b"], "costs": [0.4],
               "settings": [dataclasses.asdict(s) for s in settings], "choice": dataclasses.asdict(choice),
               "grid": report.grid(recall, [0.4], settings, (0.1,), ("b",)), "current": current}
    assert [e["worst"] for e in results["grid"]] == [1.0, 1.0]  # the held-out task is not in the worst ...
    assert [e["held_out_worst"] for e in results["grid"]] == [0.5, 1.0]  # ... but beside it
    text = report.text_table(results)
    assert "held out (measured, not chosen on): b" in text
    assert "per task, worst over the keeps: a 1.00 (current 1.00), b (held out) 0.50 (current 1.00)" in text
    assert "the choice is WORSE on b (held out)" in text
    assert current_setting({"score_layers": "all", "window": 16, "pool": 31, "rows": "mean", "chunk": 8,
                            "lookahead": 8}, settings) is None  # the paper's recipe is no grid point
    with pytest.raises(Exception, match="hold-out"):
        CalibrateConfig(tasks=("niah",), hold_out=("niah",))
