"""benches/gpu_check_hf.py's four parts from its steps' JSON files, the targets of issue 32, and summary.txt.

Per timed case (B prompts of n tokens, one batch):
    TTFT         the batch's: max over its rows of the run's own ttft_s (batch start -> first token)
    ratio        TTFT at keep 1.0 / TTFT at keep 0.1
    limit        spcli plan's FLOP formulas (spcli/plan/flops.py) for the same shapes, at the tokens selection
                 keeps; that is ceil(keep x n), `spcli plan`'s own limit (plan_limit), unless the forced tokens
                 and selection's minimum exceed it (short prompts, tiny scale)
    speculator   B x F_s(n) (spcli plan's formula) / the wall time of its speculate_prompts call -> TFLOP/s,
                 against the plain matmul's rate measured in the kernel step
    peak         the speculator's: its call's peak above what was held when it started, plus its weights
                 (CUDA only), against spcli plan's reserve for prompts of n (less the 1 GiB it adds for the
                 CUDA context, which the allocator never sees)
Targets (issue 32, judged at full scale only): ratio >= 0.8 x limit on the 32k prompts; the speculator at
>= 0.4 of the matmul rate.
"""

from __future__ import annotations

import re
from pathlib import Path

GB = 1e9
TARGET_RATIO_OF_LIMIT = 0.8
TARGET_MATMUL_SHARE = 0.4


def pytest_summary(path: Path) -> dict | None:
    if not path.exists():
        return None
    lines = [l for l in path.read_text().splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", lines[-1])} \
        if lines else {}
    return {"line": lines[-1].strip("= ") if lines else None, **counts}


def rows_of(run: dict | None, batch: int, n: int) -> list[dict]:
    """The rows of the shard of `batch` prompts of n tokens (ids "{batch}x{n}-{i}")."""
    return [] if run is None else [r for r in run["rows"] if r["id"].startswith(f"{batch}x{n}-")]


def call_of(run: dict | None, n: int) -> dict | None:
    """The probe's speculate_prompts call of the batch of n-token prompts."""
    calls = [] if run is None else [c for c in run["speculator_calls"] if c["lengths"] and set(c["lengths"]) == {n}]
    return calls[0] if calls else None


def ratio(a, b):
    return a / b if a is not None and b else None


def row_problems(rows: list[dict], batch: int, n: int, kept: int | None) -> list[str]:
    """What is wrong with a batch's rows: missing, an error, another prompt length, another kept count."""
    problems = [] if len(rows) == batch else [f"{len(rows)} of {batch} rows of {n} tokens"]
    for r in rows:
        if r["error"] is not None:
            problems.append(f"{r['id']}: {r['error']}")
        elif r["num_prompt_tokens"] != n or (kept is not None and r["num_kept_tokens"] != kept):
            problems.append(f"{r['id']}: {r['num_prompt_tokens']} tokens, {r['num_kept_tokens']} kept")
    return problems


def e2e_part(build: dict, full: dict | None, spec: dict | None, matmul_tflops: float | None) -> dict:
    cases = []
    for case in build["cases"]:
        batch, n = case["batch"], case["n"]
        rows_full, rows_spec = rows_of(full, batch, n), rows_of(spec, batch, n)
        call = call_of(spec, n)
        ttft_full = max((r["ttft_s"] for r in rows_full if r["ttft_s"] is not None), default=None)
        ttft_spec = max((r["ttft_s"] for r in rows_spec if r["ttft_s"] is not None), default=None)
        spec_s = call["wall_s"] if call else None
        tflops = case["speculator_flops"] / spec_s / 1e12 if spec_s else None
        reserve = case["reserve"]
        peak = call.get("speculator_peak_bytes") if call else None
        speedup = ratio(ttft_full, ttft_spec)
        cases.append({
            "name": f"{batch}x{n}", "batch": batch, "n": n, "ttft_full_s": ttft_full, "ttft_spec_s": ttft_spec,
            "ttft_ratio": speedup, "flop_limit": case["limit"], "ratio_of_limit": ratio(speedup, case["limit"]),
            "plan_limit": case["plan_limit"], "plan_kept_per_prompt": case["plan_kept_per_prompt"],
            "kept_per_prompt": case["kept_per_prompt"], "speculator_s": spec_s,
            "speculator_share_of_ttft": ratio(spec_s, ttft_spec), "speculator_flops": case["speculator_flops"],
            "speculator_tflops": tflops, "speculator_matmul_share": ratio(tflops, matmul_tflops),
            "speculator_peak_bytes": peak, "reserve_bytes": reserve["total"],
            "reserve_without_context_bytes": reserve["total"] - reserve["context"],
            "peak_of_reserve": ratio(peak, reserve["total"] - reserve["context"]), "reserve_terms": reserve,
            "problems": row_problems(rows_full, batch, n, None) + row_problems(rows_spec, batch, n,
                                                                             case["kept_per_prompt"]),
        })
    peaks = {k: run.get("process_peak_bytes") if run else None for k, run in (("keep_1.0", full), ("keep_0.1", spec))}
    return {"base": build["base"], "speculator": build["speculator"], "score": build["score"], "chunk": build["chunk"],
            "dtype": build["dtype"], "matmul_tflops": matmul_tflops, "cases": cases, "process_peak_bytes": peaks,
            "profile": spec.get("profile") if spec else None,
            "profile_error": spec.get("profile_error") if spec else None}


def chunked_part(build: dict, spec: dict | None) -> dict:
    """The speculator's peak with --speculator-chunk, against the plan; what grows with n is the cache (KV, one
    layer's K and V repeated to every head) and scoring's [S, n] rows: the rest should stay flat."""
    cases = []
    for c in build["chunked"]:
        n, r = c["n"], c["reserve"]
        call = call_of(spec, n)
        peak = call.get("speculator_peak_bytes") if call else None
        grows = r["kv"] + r["repeated_kv"] + r["scoring"]
        cases.append({"n": n, "speculator_peak_bytes": peak, "reserve_bytes": r["total"],
                      "reserve_without_context_bytes": r["total"] - r["context"],
                      "peak_of_reserve": ratio(peak, r["total"] - r["context"]), "plan_growing_bytes": grows,
                      "peak_less_growing_bytes": None if peak is None else peak - grows,
                      "plan_rest_bytes": r["total"] - r["context"] - grows, "speculator_s": call["wall_s"] if call else None,
                      "is_measured": call is not None})
    first, last = cases[0]["peak_less_growing_bytes"], cases[-1]["peak_less_growing_bytes"]
    return {"speculator_chunk": build["speculator_chunk"], "cases": cases, "rest_growth": ratio(last, first)}


def targets(scale_name: str, e2e: dict | None) -> dict:
    judged = scale_name == "full"
    out = {}
    if e2e:
        longest = e2e["cases"][-1]
        shares = [c["speculator_matmul_share"] for c in e2e["cases"] if c["speculator_matmul_share"] is not None]
        for key, value, target in (("ttft_ratio_of_flop_limit_" + longest["name"], longest["ratio_of_limit"],
                                    TARGET_RATIO_OF_LIMIT),
                                   ("speculator_matmul_share", max(shares, default=None), TARGET_MATMUL_SHARE)):
            out[key] = {"value": value, "target": target,
                        "met": (value is not None and value >= target) if judged else None}
    return {"judged": judged, **out}


def assemble(scale, parts: dict, steps: list[dict], pytest_path: Path) -> dict:
    kernel, build = parts["kernel"], parts["build"]
    matmul = kernel["matmul"]["tflops"] if kernel else None
    e2e = e2e_part(build, parts["run_1"], parts["run_0.1"], matmul) if build else None
    chunked = chunked_part(build, parts["run_0.1"]) if build else None
    problems = [p for c in (e2e or {}).get("cases", []) for p in c["problems"]]
    ok = all(s["exit"] == 0 for s in steps) and not problems and len(steps) == 5
    return {"scale": scale.name, "kernel": {**(kernel or {}), "pytest": pytest_summary(pytest_path)},
            "e2e": e2e, "chunked": chunked, "targets": targets(scale.name, e2e), "ok": ok}


def _f(x, fmt: str = ".2f", unit: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{unit}"


def summary_lines(r: dict) -> list[str]:
    s, gpu = r["startup"], r["startup"].get("gpu") or {}
    p = s["packages"]
    lines = [f"gpu_check_hf ({r.get('scale')}) {s['utc']}: python {s['python']}, torch {p['torch']}, transformers "
             f"{p['transformers']}, triton {p['triton']}; spcli {s['spcli_commit']}; device "
             f"{gpu.get('name', 'none (CPU)')}, driver {gpu.get('driver_version', '-')}, clocks sm {gpu.get('clocks.sm', '-')}"
             f" (max {gpu.get('clocks.max.sm', '-')}), mem {gpu.get('clocks.mem', '-')}",
             "steps: " + ", ".join(f"{x['name']} " + (f"exit {x['exit']} ({x['seconds']:.0f} s)" if x["exit"] is not None
                                                      else f"skipped ({x['skipped']})") for x in r["steps"])]
    k = r.get("kernel") or {}
    if k.get("cases"):
        m = k["matmul"]
        lines.append(f"part 1, scoring kernel on {k['device']}{' (interpreted)' if k['interpreted'] else ''}: "
                     f"plain {m['dtype']} matmul {m['size']}^3 {m['tflops']:.3g} TFLOP/s; pytest: "
                     f"{(k.get('pytest') or {}).get('line')}")
        for c in k["cases"]:
            if c.get("error"):
                lines.append(f"  {c['dtype']:>8} n={c['n']:>6}: FAILED {c['error'][:160]}")
                continue
            lines.append(f"  {c['dtype']:>8} n={c['n']:>6}: parity {'ok' if c['parity_ok'] else 'FAILED'} (max rel "
                         f"{c['max_rel_err']:.1e}), kernel {c['kernel_ms']:.3f} ms vs reference {c['reference_ms']:.3f}"
                         f" ms ({c['speedup']:.2g}x), {c['bandwidth_gbs']:.3g} GB/s ({100 * c['bandwidth_gbs'] / 4800:.2g}%"
                         " of 4.8 TB/s)")
    e = r.get("e2e")
    if e:
        lines.append(f"part 2, spcli run --engine hf, base {e['base']['params']:.4g} params, speculator "
                     f"{e['speculator']['params']:.4g}, {e['dtype']}, keep 0.1 vs 1.0 (paper's recipe):")
        for c in e["cases"]:
            lines.append(f"  {c['name']}: TTFT {_f(c['ttft_full_s'], '.3f')} s -> {_f(c['ttft_spec_s'], '.3f')} s = "
                         f"{_f(c['ttft_ratio'])}x of a {c['flop_limit']:.2f}x FLOP limit ({_f(c['ratio_of_limit'], '.0%')}; "
                         f"{c['kept_per_prompt']} kept, spcli plan: {c['plan_limit']:.2f}x at {c['plan_kept_per_prompt']});"
                         f" speculator {_f(c['speculator_s'], '.3f')} s, {_f(c['speculator_tflops'], '.3g')} TFLOP/s "
                         f"({_f(c['speculator_matmul_share'], '.0%')} of the matmul), peak "
                         f"{_f(c['speculator_peak_bytes'] and c['speculator_peak_bytes'] / GB)} GB vs reserve "
                         f"{c['reserve_without_context_bytes'] / GB:.2f} GB + 1 GiB context"
                         + (f"; PROBLEMS: {c['problems'][:3]}" if c["problems"] else ""))
        pk = e["process_peak_bytes"]
        lines.append(f"  whole-run peaks: keep 1.0 {_f(pk['keep_1.0'] and pk['keep_1.0'] / GB)} GB, keep 0.1 "
                     f"{_f(pk['keep_0.1'] and pk['keep_0.1'] / GB)} GB; profile: "
                     + (f"{e['profile']['wall_s']:.3f} s for {e['profile']['tokens']} tokens, scoring kernels "
                        f"{e['profile']['scoring_kernels_ms']:.1f} of {e['profile']['total_self_ms']:.1f} ms, top: "
                        + "; ".join(f"{t['name'][:50]} {_f(t['share'], '.0%')}" for t in e["profile"]["top"][:3])
                        if e.get("profile") else str(e.get("profile_error"))))
    ch = r.get("chunked")
    if ch:
        lines.append(f"part 3, chunked speculator prefill (--speculator-chunk {ch['speculator_chunk']}):")
        for c in ch["cases"]:
            lines.append(f"  n={c['n']}: peak {_f(c['speculator_peak_bytes'] and c['speculator_peak_bytes'] / GB)} GB vs "
                         f"reserve {c['reserve_without_context_bytes'] / GB:.2f} GB + context; less what grows with n "
                         f"(plan {c['plan_growing_bytes'] / GB:.2f} GB): {_f(c['peak_less_growing_bytes'] and c['peak_less_growing_bytes'] / GB)}"
                         f" GB vs plan {c['plan_rest_bytes'] / GB:.2f} GB")
        lines.append(f"  rest at the longest / at the shortest: {_f(ch['rest_growth'])} (flat: 1.00)")
    t = r.get("targets") or {}
    for key, v in t.items():
        if isinstance(v, dict):
            verdict = "not judged (tiny scale)" if v["met"] is None else ("met" if v["met"] else "SHORT")
            lines.append(f"target {key}: {_f(v['value'])} (>= {v['target']}): {verdict}")
    verdict = "ok" if r.get("ok") else "FAILED" if len(r["steps"]) == 5 else f"so far ({len(r['steps'])} of 5 steps)"
    lines.append(f"result: {verdict} in {r.get('wall_s', 0):.0f} s")
    return lines
