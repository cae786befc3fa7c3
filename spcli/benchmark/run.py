"""`spcli bench`: full prefill vs spcli on the same prompts, in one run; ratios against their limits.

Per (length, keep), the best time over repetitions (full and spcli runs interleave within each one;
on a shared machine, noise only adds time, so the minimum is the cleanest estimate of each cost):

    speedup = TTFT_full / TTFT_spcli                      (speculator, scoring and selection included)
    limit   = 1 / (kept + speculator share)               kept = kept tokens / prompt tokens,
              speculator share = (speculator + scoring + selection) / TTFT_full
    efficiency = speedup / limit                          (below 1: the pruned base prefill costs more
                                                           than `kept` x the full one)
"""

from __future__ import annotations

import dataclasses
import json
import statistics

import torch

from spcli.benchmark.config import BenchConfig
from spcli.benchmark.qps import CostModel, max_qps
from spcli.benchmark.stages import Timing, as_text, make_prompts, run_full, run_spec
from spcli.models import files, load
from spcli.models import random_pair as pair
from spcli.models.load import ModelStack
from spcli.models.profiles import describe, resolve, settings_source
from spcli.stages.select import is_over_budget


def load_models(cfg: BenchConfig) -> ModelStack:
    return load.load_stack(cfg.model, cfg.speculator, cfg.dtype, cfg.device, speculator_dtype=cfg.speculator_dtype)


def summarize(cfg: BenchConfig, length: int, keep: float, full: list[Timing], spec: list[Timing], extra: dict) -> dict:
    """Times are the best (minimum) over repetitions: on a shared machine noise only ever adds time."""
    batch = cfg.batch
    kept = spec[0].num_kept / (batch * length)
    ttft_full, ttft_spec = min(t.ttft_s for t in full), min(t.ttft_s for t in spec)
    spec_share = min(t.speculate_s for t in spec) / ttft_full
    speedup, limit = ttft_full / ttft_spec, 1.0 / (kept + spec_share)
    limit_s = cfg.ttft_limit_s or 2.0 * ttft_full
    per_prompt = min(t.speculate_s / batch for t in spec)
    qps_full = max_qps(CostModel(0.0, min(t.prefill_s for t in full) / batch), limit_s, batch)
    qps_spec = max_qps(CostModel(per_prompt, min(t.prefill_s for t in spec) / batch), limit_s, batch)
    stages = {k: min(getattr(t, k) for t in spec) for k in ("speculate_s", "prefill_s")}
    return {
        **extra, "keep": keep, "length": length, "batch": batch, "kept_fraction": kept,
        "is_over_budget": is_over_budget(length, cfg.select, keep),  # the forced tokens exceed ceil(keep x length)
        "ttft_full_s": ttft_full, "ttft_spec_s": ttft_spec, "speedup": speedup, "limit": limit,
        "efficiency": speedup / limit, "speculator_share": spec_share,
        "stages": stages, "stage_share_of_ttft": {k: v / ttft_spec for k, v in stages.items()},
        "throughput_full": batch / min(t.e2e_s for t in full), "throughput_spec": batch / min(t.e2e_s for t in spec),
        "max_tokens": cfg.max_tokens, "ttft_limit_s": limit_s,
        "max_qps_full": qps_full["qps"], "max_qps_spec": qps_spec["qps"],
        "qps_ratio": qps_spec["qps"] / qps_full["qps"] if qps_full["qps"] else None,
        "qps_detail": {"full": qps_full, "spec": qps_spec},
        "repeats": len(full), "ttft_full_runs_s": [t.ttft_s for t in full], "ttft_spec_runs_s": [t.ttft_s for t in spec],
        "speedups": [f.ttft_s / s.ttft_s for f, s in zip(full, spec)],  # per repetition, for the spread
        "speedup_median": float(statistics.median(f.ttft_s / s.ttft_s for f, s in zip(full, spec))),
    }


def check_lengths(cfg: BenchConfig) -> None:
    """Every --lengths prompt plus its --max-tokens fits the model's context; checked before anything loads."""
    from spcli.errors import ConfigError
    from spcli.models import lookup

    config = files.read_config(lookup.locate(cfg.model))
    limit = int(getattr(config, "max_position_embeddings", None) or 1 << 30)
    too_long = [n for n in cfg.lengths if n + cfg.max_tokens > limit]
    if too_long:
        raise ConfigError(f"--lengths {too_long[0]}: with --max-tokens {cfg.max_tokens} it does not fit {cfg.model}'s "
                          f"context of {limit} tokens; use lengths up to {limit - cfg.max_tokens}")


def run_bench(cfg: BenchConfig, log=print) -> list[dict]:
    check_lengths(cfg)
    m = load_models(cfg)
    tokenizer, spec_name, dtype = m.tokenizer, m.speculator_name, m.dtype
    cfg = resolve(cfg, cfg.model, m.path, spec_name)
    source = settings_source(cfg.score, cfg.select, cfg.model, m.path, spec_name)
    score = cfg.score
    log(f"speculator {spec_name}: {describe({**dataclasses.asdict(score), 'chunk': cfg.select.chunk})} "
        f"(settings from {source})")
    torch.manual_seed(cfg.seed)
    results = []
    for length in cfg.lengths:
        prompts, texts = as_text(m, make_prompts(tokenizer, length, cfg.batch, cfg.seed))
        extra = {"model": cfg.model, "speculator": spec_name, "scoring": m.scoring,
                 "score": dataclasses.asdict(score), "chunk": cfg.select.chunk,
                 "settings_from": source, "dtype": dtype, "speculator_dtype": m.speculator_dtype_used,
                 "device": str(m.device),
                 "threads": torch.get_num_threads()}
        if cfg.model == pair.BASE_NAME and spec_name == pair.SPECULATOR_NAME:
            extra["flop_ratio_pair"], extra["flop_ratio_8b_405b"] = pair.pair_ratio(length)
        full: list[Timing] = []
        spec: dict[float, list[Timing]] = {k: [] for k in cfg.keeps}
        for rep in range(cfg.warmup + cfg.repeats):
            f = run_full(m, prompts, cfg.max_tokens)
            s = {k: run_spec(m, prompts, k, cfg.select, score, cfg.max_tokens, cfg.speculator_chunk, texts)
                 for k in cfg.keeps}
            if rep >= cfg.warmup:
                full.append(f)
                for k in cfg.keeps:
                    spec[k].append(s[k])
            log(f"length {length} rep {rep + 1}/{cfg.warmup + cfg.repeats}{' (warm-up)' if rep < cfg.warmup else ''}: "
                f"full {f.ttft_s:.2f} s, " + ", ".join(f"keep {k} {s[k].ttft_s:.2f} s" for k in cfg.keeps))
        for k in cfg.keeps:
            results.append(summarize(cfg, length, k, full, spec[k], extra))
    return results


def text_table(results: list[dict]) -> str:
    head = ["length", "batch", "keep", "kept%", "full s", "spcli s", "speedup", "limit", "eff%", "spec%", "prefill%",
            "thru full/s", "thru spcli/s", "QPS full", "QPS spcli"]
    rows = [head]
    for r in results:
        sh = r["stage_share_of_ttft"]
        over = "!" if r.get("is_over_budget") else ""
        rows.append([str(r["length"]), str(r["batch"]), f"{r['keep']:.2f}", f"{100 * r['kept_fraction']:.1f}{over}",
                     f"{r['ttft_full_s']:.3f}", f"{r['ttft_spec_s']:.3f}", f"{r['speedup']:.2f}x", f"{r['limit']:.2f}x",
                     f"{100 * r['efficiency']:.0f}", f"{100 * sh['speculate_s']:.0f}",
                     f"{100 * sh['prefill_s']:.0f}", f"{r['throughput_full']:.2f}", f"{r['throughput_spec']:.2f}",
                     f"{r['max_qps_full']:.2f}", f"{r['max_qps_spec']:.2f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = results[0] if results else {}
    title = f"model {first.get('model')} speculator {first.get('speculator')} ({first.get('dtype')}, {first.get('device')})"
    if "flop_ratio_pair" in first:
        ratios = {r["length"]: (r["flop_ratio_pair"], r["flop_ratio_8b_405b"]) for r in results}
        title += "; FLOP ratio speculator/base (8B/405B): " + ", ".join(
            f"{a:.4f} ({b:.4f}) at {n}" for n, (a, b) in ratios.items())
    if any(r.get("is_over_budget") for r in results):
        lines.append("kept%!: the forced first/last tokens (--keep-first + --keep-last) exceed ceil(keep x length): only "
                     "they were kept, so the keep asked for is not what ran and nothing is being compared at it")
    return title + "\n" + "\n".join(lines)


def json_lines(results: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in results)
