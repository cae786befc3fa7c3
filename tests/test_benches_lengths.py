"""benches/lengths.py on a tiny model, the hf engine and its full prefill: each length's documents go through the job's
own stages (run_batch), every stage is accounted for, and the FLOP limit and share are printed (vLLM and plain vLLM
start a vLLM engine: run by hand)."""

from __future__ import annotations

import math
import sys

from test_benches import REPO

sys.path.insert(0, str(REPO / "benches"))
import lengths  # noqa: E402


def test_each_length_is_accounted_per_stage_against_the_full_prefill(tiny_dir, capsys):
    summary = lengths.main(["--model", str(tiny_dir), "--speculator", "self:1", "--lengths", "600,1100", "--docs", "1",
                            "--engines", "hf,full", "--max-prune-cost", "inf", "--dtype", "float32", "--max-tokens", "2"])
    by = {(r["length"], r["engine"]): r for r in summary}
    assert set(by) == {(600, "hf"), (600, "full"), (1100, "hf"), (1100, "full")}
    for n in (600, 1100):
        hf, full = by[n, "hf"], by[n, "full"]
        assert abs(hf["n"] - n) < 0.2 * n and hf["n"] == full["n"]  # the same document, ~n tokens
        assert full["kept"] == full["n"] and hf["kept"] < hf["n"]  # pruned, and the reference whole
        assert hf["speculator"] > 0 and hf["select"] > 0 and full["speculator"] == full["select"] == 0
        assert hf["tokenize"] > 0 and hf["prefill"] > 0 and full["prefill"] > 0
        assert math.isclose(sum(hf[s] for s in lengths.STAGES), hf["wall"], rel_tol=1e-9)
        assert hf["ratio"] == full["wall"] / hf["wall"] and full["ratio"] == full["ratio_ttft"] == 1.0
        assert hf["ratio_ttft"] == (full["wall"] - full["decode"]) / (hf["wall"] - hf["decode"])
        assert hf["limit"] > 1 and hf["share"] == hf["ratio_ttft"] / hf["limit"]
    assert by[1100, "hf"]["limit"] > by[600, "hf"]["limit"]  # a longer prompt: a higher limit
    out = capsys.readouterr().out
    assert "| ~1100 | hf |" in out and "TTFT share of limit" in out
