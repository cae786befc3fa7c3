"""`spcli calibrate --keep-for` output: the terminal table with the recommendation, results.json, keep_fidelity.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

IMAGE = "keep_fidelity.png"


def write_json(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=True))
    os.replace(tmp, path)


def _ci(c: dict, digits: int = 2) -> str:
    if not c["n"]:
        return "-"
    return f"{c['mean']:.{digits}f} [{c['lo']:.{digits}f},{c['hi']:.{digits}f}]"


def text_table(results: dict) -> str:
    """One line per policy (mean [95% CI] over the sampled prompts), then the recommended `spcli run` flags."""
    metric, value = results["target"]["metric"], results["target"]["value"]
    label = f"EM16 >= {value:g}" if metric == "prefix_match" else f"KL <= {value:g}"
    head = ["keep", "n", "pruned", "kept%", "1st-tok", "EM16", "KL", label]
    rows = [head]
    for e in results["summary"]:
        ok = e[metric]["mean"] <= value if metric == "kl" else e[metric]["mean"] >= value
        rows.append([str(e["policy"]), str(e["n"]), str(e["num_pruned"]), f"{100 * e['kept_fraction']['mean']:.1f}",
                     _ci(e["first_token"]), _ci(e["prefix_match"]), _ci(e["kl"], 3), "yes" if ok else "no"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"fidelity against full prefill on {results['num_sampled']} of your {results['num_valid_records']} records "
             "(mean [95% bootstrap CI]; no labels needed)"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if results["errors"]:
        lines.append(f"{len(results['errors'])} sampled record(s) could not be prepared, e.g. {results['errors'][0]}")
    lines += notes(results)
    lines += [closest_line(c) for c in results["closest"]]
    if results["recommended"] is None:
        lines.append(f"no keep in the sweep meets {label}: use --keep 1.0 (full prefill), or sweep higher --keep values")
    else:
        lines.append(f"recommended (smallest kept fraction meeting {label}): {results['flags']}")
    return "\n".join(lines)


def notes(results: dict) -> list[str]:
    """What limits the sweep: bad records skipped, too few samples, auto capped by --keep-max."""
    from spcli.evaluate.report import MIN_N

    out = []
    skipped = results.get("skipped", [])
    if skipped:
        more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        out.append(f"skipped {len(skipped)} bad record(s): " + "; ".join(skipped[:3]) + more)
    n = results["num_sampled"]
    if n < MIN_N:
        out.append(f"warning: {n} sampled records: 95% bootstrap CIs from fewer than {MIN_N} are rough and wide; "
                   "raise --samples (on more records) before choosing by them")
    select = results["config"]["select"]
    for e in results["summary"]:
        if e["policy"] == "auto" and e.get("num_at_keep_max"):
            out.append(f"keep auto kept --keep-max {select['keep_max']:g} on {e['num_at_keep_max']} of {e['num_pruned']} "
                       f"pruned prompts: --keep-scale {select['keep_scale']:g} asks for more there; raise --keep-max or "
                       "lower --keep-scale")
    return out


def closest_line(c: dict) -> str:
    """One criterion's closest keep, as `spcli run` flags."""
    name, flag, digits = ("EM16 >=", "--target-agreement", 2) if c["metric"] == "prefix_match" else ("KL <=", "--target-kl", 3)
    head = f"{name} {c['value']:g} ({flag} {c['value']:g}): "
    value = f"{name.split()[0]} {c['mean']:.{digits}f}"
    if c["is_met"]:
        return head + f"keep {c['policy']} meets it ({value}): {c['flags']}"
    return head + f"not met in the sweep; closest keep {c['policy']} ({value}): {c['flags']}; --keep 1.0 is full prefill"


def plot(results: dict, out_dir: Path) -> Path:
    """Fidelity against kept fraction: 1st-tok and EM16 (left axis) and KL (right), fixed keeps as lines, auto a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = [e for e in results["summary"] if e["policy"] != "auto"]
    auto = [e for e in results["summary"] if e["policy"] == "auto"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    kl_ax = ax.twinx()
    for axis, key, name, color in ((ax, "first_token", "first token", "C0"), (ax, "prefix_match", "EM16", "C1"),
                                   (kl_ax, "kl", "KL (right)", "C2")):
        x = [e["kept_fraction"]["mean"] for e in fixed]
        axis.plot(x, [e[key]["mean"] for e in fixed], marker="o", color=color, label=name)
        axis.fill_between(x, [e[key]["lo"] for e in fixed], [e[key]["hi"] for e in fixed], color=color, alpha=0.15)
        for e in auto:
            c = e[key]
            axis.errorbar([e["kept_fraction"]["mean"]], [c["mean"]], yerr=[[c["mean"] - c["lo"]], [c["hi"] - c["mean"]]],
                          marker="*", markersize=12, color=color, ls="none", capsize=3)
    metric, value = results["target"]["metric"], results["target"]["value"]
    (kl_ax if metric == "kl" else ax).axhline(value, color="k", ls=":", lw=1, label="target")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("mean kept fraction (stars: keep auto)")
    ax.set_ylabel("agreement with full prefill")
    kl_ax.set_ylabel("KL(full || pruned), nats")
    handles = ax.get_legend_handles_labels()[0] + kl_ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    ax.set_title(f"fidelity vs keep on {results['num_sampled']} of your records (95% bootstrap CI)", fontsize=10)
    fig.tight_layout()
    path = out_dir / IMAGE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
