"""Bench output files: bench_<model>_<speculator>.json and a speedup-vs-keep PNG with the limits."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from spcli.benchmark.config import BenchConfig
from spcli.errors import OutputError


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
