"""`spcli eval`'s terminal table: fits 120 columns, warns when n is small, and every column is explained."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from spcli.cli import app
from spcli.evaluate.report import COLUMN_HELP, headers, text_table


def ci(mean: float, lo: float, hi: float, n: int = 16) -> dict:
    return {"mean": mean, "lo": lo, "hi": hi, "n": n}


def entry(selector: str, keep: float, n: int = 16) -> dict:
    wide = ci(-0.75, -0.94, -0.5, n)  # the widest numbers a table holds: negative bounds
    return {"task": "niah", "selector": selector, "keep": keep, "n": n, "kept_fraction": ci(keep, keep, keep, n),
            "prompt_tokens": ci(2047.0, 2047.0, 2047.0, n),
            "metrics": {m: wide for m in ("contains", "exact", "f1", "first_token", "prefix_match", "needle_kept")}
            | {"kl": ci(0.082, 0.063, 0.101, n)},
            "delta_vs_full": wide, "delta_vs_specprefill": wide, "speedup": ci(10.91, 6.05, 21.95, n),
            "ttft_s": ci(0.1, 0.1, 0.1, n), "overlap": {"specprefill": ci(0.27, 0.24, 0.3, n)}}


def test_table_fits_120_columns_and_warns_when_n_is_small():
    summary = [entry("full", 1.0)] + [entry(s, k) for s in ("self-information", "sink-recency") for k in (0.1, 0.5)]
    table = text_table(summary)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert lines[1].split() == ["selector", "keep", "n", "kept%", "acc", "acc-full", "EM16", "KL", "needle", "overlap", "speedup*"]
    assert lines[4].split() == ["self-information", "0.10", "16", "10.0", "-0.75", "[-0.94,-0.50]", "-0.75", "[-0.94,-0.50]",
                                "-0.75", "0.082", "-0.75", "0.27", "10.91"]
    assert lines[-4:-2] == ["warning: n = 16 examples per row: 95% bootstrap CIs from fewer than 30 examples are rough",
                            "         and wide; raise --samples before ranking selectors by them"]
    assert lines[-2:] == ["speedup*: estimated from this eval's stage times, not measured end to end (spcli bench measures it)",
                          "every column with its CI: results.json (and report.html with --html); columns: spcli eval --help"]
    assert text_table(summary, html=True).splitlines()[-1] == (
        "every column with its CI: results.json and report.html; columns: spcli eval --help")
    assert "warning" not in text_table([entry("full", 1.0, n=40)])


def test_every_column_is_explained_in_help_and_readme():
    names = [name for name, _ in COLUMN_HELP]
    assert set(headers()) | set(headers(compact=True)) <= set(names) | {"needle kept", "overlap/spec", "speedup*"}
    res = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "eval.md").read_text()
    for name, text in COLUMN_HELP:
        assert f"{name}: {text}." in " ".join(res.output.replace("│", " ").split()), name
        assert f"`{name}`: {text}" in readme, name
