"""A budget that cannot be met says so: the forced first/last tokens exceed ceil(keep x n)
(select.is_over_budget), warned once by `run`, marked in eval's and bench's tables."""

from __future__ import annotations

from spcli.benchmark.run import text_table as bench_table
from spcli.config.scoring import SelectConfig
from spcli.stages.select import is_over_budget
from spcli.evaluate.report import text_table as eval_table
from test_bad_input import cli
from test_evaluate_report import entry
from test_job_resume import argv
from test_job_run import read_outputs


def test_over_budget_is_the_forced_set_above_ceil_keep_times_n():
    cfg = SelectConfig(keep=0.1, chunk=32, keep_first=4, keep_last=64, min_tokens=256, min_free=0)
    assert is_over_budget(512, cfg)  # the case: 68 forced > ceil(51.2) = 52
    assert not is_over_budget(512, SelectConfig(keep=0.1, chunk=32, min_tokens=256, min_free=16)), "a floor chooses 16"
    assert not is_over_budget(671, cfg) and is_over_budget(670, cfg)  # 68 forced vs ceil(67.1) = 68, ceil(67.0) = 67
    assert not is_over_budget(200, cfg), "not pruned (min_tokens): no budget to miss"
    assert not is_over_budget(512, cfg, 1.0) and not is_over_budget(512, cfg, 0.2)
    auto = SelectConfig(keep="auto", chunk=32, keep_first=4, keep_last=64, min_tokens=256, keep_max=0.1, min_free=0)
    assert is_over_budget(512, auto) and not is_over_budget(512, auto, 0.5)


def test_run_warns_once_with_the_count_of_rows_whose_budget_cannot_be_met(tmp_path, tiny_dir, write_jsonl, capsys):
    short = [{"id": f"s{i}", "prompt": " ".join(f"w{j}" for j in range(20 + i))} for i in range(3)]
    long = [{"id": "l0", "prompt": " ".join(f"w{j % 40}" for j in range(200))}]
    src = write_jsonl(short + long)
    code, _, err = cli(argv(src, tmp_path / "out", tiny_dir), capsys)  # keep 0.1, keep-first 4, keep-last 8
    assert code == 0, err
    rows = {r["id"]: r for r in read_outputs(tmp_path / "out")}
    assert all(rows[r["id"]]["num_kept_tokens"] == 12 for r in short) and rows["l0"]["num_kept_tokens"] > 12
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        "WARNING 3 of 4 rows without error kept more than the budget asks: their forced tokens (--keep-first 4 + --keep-last 8 = 12) "
        "exceed ceil(keep x prompt tokens), so only those were kept; lower --keep-last (or --keep-first) or raise --keep "
        "for prompts this short"]


def test_eval_and_bench_tables_mark_rows_where_nothing_is_compared():
    summary = [entry("full", 1.0), entry("specprefill", 0.1) | {"num_over_budget": 16}, entry("random", 0.1)
               | {"num_over_budget": 12}, entry("random", 0.5)]
    lines = eval_table(summary).splitlines()
    assert [line.split()[3] for line in lines[3:7]] == ["100.0", "10.0!", "10.0!", "50.0"]
    assert ("kept%!: in 2 row(s) (up to 16 of 16 examples) the forced first/last tokens (--keep-first + --keep-last) "
            "exceed ceil(keep x n): the selectors keep only them,") in lines
    assert "         so nothing is being compared there; use longer --lengths, a higher --keep or a lower --keep-last" in lines
    assert not any("kept%!" in line for line in eval_table([entry("full", 1.0), entry("random", 0.5)]).splitlines())
    row = {"length": 512, "batch": 1, "keep": 0.1, "kept_fraction": 68 / 512, "ttft_full_s": 1.0, "ttft_spec_s": 0.5,
           "speedup": 2.0, "limit": 4.0, "efficiency": 0.5, "stage_share_of_ttft": {"speculate_s": 0.1, "prefill_s": 0.5},
           "throughput_full": 1.0, "throughput_spec": 2.0, "max_qps_full": 1.0, "max_qps_spec": 2.0, "is_over_budget": True}
    table = bench_table([row]).splitlines()
    assert table[3].split()[3] == "13.3!"
    assert table[-1] == ("kept%!: the forced first/last tokens (--keep-first + --keep-last) exceed ceil(keep x length): "
                         "only they were kept, so the keep asked for is not what ran and nothing is being compared at it")
