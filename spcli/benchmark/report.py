"""Bench output files: bench_<model>_<speculator>.json and a speedup-vs-keep PNG with the limits."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from spcli.benchmark.config import BenchConfig
from spcli.errors import OutputError

COLUMN_HELP = (  # `spcli bench --help` and docs/guide/bench.md explain the table's columns in these words
    ("length", "prompt tokens"), ("batch", "prompts per batch"), ("keep", "the keep rate asked for"),
    ("kept%", "prompt tokens actually kept"),
    ("full s", "time to first token of full prefill, best of --repeats"),
    ("spcli s", "time to first token with Speculative Prefill (speculator, scoring and selection included), best of --repeats"),
    ("speedup", "full s / spcli s"),
    ("limit", "1 / (kept fraction + speculator share): the speedup if the pruned prefill cost exactly kept x full"),
    ("eff%", "speedup / limit"), ("spec%", "speculator, scoring and selection as a share of spcli s"),
    ("prefill%", "the pruned base prefill as a share of spcli s"),
    ("thru full/s", "prompts per second end to end (--max-tokens decoded) with full prefill"),
    ("thru spcli/s", "the same with Speculative Prefill"),
    ("QPS full", "simulated max queries per second within the TTFT limit (--ttft-limit), full prefill"),
    ("QPS spcli", "the same with Speculative Prefill"),
)
MAX_SPREAD = 0.10  # per-repetition speedups further apart than this (relative to the median): a noisy machine


def reliability_warnings(results: list[dict]) -> list[str]:
    """Why a ratio may not be trusted: one timed repetition, or repetitions that disagree by more than 10%."""
    warnings = []
    if results and min(r["repeats"] for r in results) < 2:
        warnings.append("one timed repetition: nothing shows how noisy this machine is; use --repeats 3 or more")
    for r in results:
        ratios = r["speedups"]
        spread = (max(ratios) - min(ratios)) / r["speedup_median"] if len(ratios) > 1 and r["speedup_median"] else 0.0
        if spread > MAX_SPREAD:
            warnings.append(f"length {r['length']} keep {r['keep']}: per-repetition speedups spread {100 * spread:.0f}% "
                            f"(over {100 * MAX_SPREAD:.0f}%): the machine is noisy, the ratio is unreliable")
    return warnings


def tag(model: str, speculator: str) -> str:
    clean = lambda s: re.sub(r"[^A-Za-z0-9.]+", "-", Path(s).name if os.sep in s else s).strip("-")
    return f"{clean(model)}_{clean(speculator)}"


def plot_speedup(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for length in dict.fromkeys(r["length"] for r in results):
        rs = sorted((r for r in results if r["length"] == length), key=lambda r: r["keep"])
        keeps = [r["keep"] for r in rs]
        line, = ax.plot(keeps, [r["speedup"] for r in rs], marker="o", label=f"measured (best run), {length} tokens")
        lo = [min(r["speedups"]) for r in rs]
        hi = [max(r["speedups"]) for r in rs]
        ax.fill_between(keeps, lo, hi, color=line.get_color(), alpha=0.15, label="per-run ratios, min-max")
        ax.plot(keeps, [r["limit"] for r in rs], ls="--", color=line.get_color(), label=f"limit, {length} tokens")
    ax.axhline(1.0, color="k", lw=1)
    ax.set_xlabel("keep rate")
    ax.set_ylabel("TTFT speedup vs full prefill")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(out: str, cfg: BenchConfig, results: list[dict]) -> list[Path]:
    directory = Path(out)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create --out {directory}: {e}") from e
    name = tag(cfg.model, results[0]["speculator"] if results else str(cfg.speculator))
    data = {"config": cfg.to_dict(), "load_average_end": os.getloadavg(), "results": results}
    json_path = directory / f"bench_{name}.json"
    tmp = json_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, json_path)
    png = directory / f"bench_{name}.png"
    plot_speedup(results, png, f"{cfg.model} / {results[0]['speculator'] if results else '-'}, "
                               f"batch {cfg.batch}, {cfg.repeats} runs")
    return [json_path, png]
