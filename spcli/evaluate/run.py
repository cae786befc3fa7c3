"""`spcli eval`: examples -> full vs pruned runs -> summary with CIs -> table, results.json, plots."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections import Counter

import torch
import transformers

from spcli.evaluate import report
from spcli.evaluate.compare import evaluate_example, load_models, other_speculators
from spcli.evaluate.config import EvalConfig, is_auto
from spcli.evaluate.inputs import read_examples
from spcli.evaluate.journal import REQUESTED, Journal, check_requested, fingerprint, journal_rows, read_journal
from spcli.evaluate.matched import compare_matched, matched_keeps, with_matched
from spcli.evaluate.summary import summarize
from spcli.evaluate.tasks import Example, task_examples
from spcli.io.outdir import make_out_dir
from spcli.models.profiles import describe, resolve


def build_examples(cfg: EvalConfig, tokenizer, max_positions: int = 1 << 30, log=print) -> list[Example]:
    examples = task_examples(cfg.tasks, cfg.lengths, cfg.samples, cfg.seed, tokenizer, max_positions, log)
    if cfg.inputs:
        examples += read_examples(cfg.inputs, cfg.samples, cfg.fields)
    return examples


def interleaved(examples: list[Example]) -> list[Example]:
    """Round-robin over the tasks, in their order: an eval stopped early (to resume later) has run every task alike."""
    by_task: dict[str, list[Example]] = {}
    for ex in examples:
        by_task.setdefault(ex.task, []).append(ex)
    queues = list(by_task.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def score_label(score, chunk: int) -> str:
    """Resolved scoring settings and the selection chunk, as `spcli models` and `spcli bench` print them."""
    return describe({**dataclasses.asdict(score), "chunk": chunk})


def environment() -> dict:
    return {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }


def summarize_examples(rows: list[dict], overlaps: list[dict], matched: dict, bootstrap: int, seed: int):
    """The summary with CIs and keep auto's matched comparison, of finished examples' rows and overlaps."""
    return summarize(rows, overlaps, bootstrap, seed), compare_matched(rows, matched, bootstrap, seed)


def journal_summary(out, bootstrap: int = 2000) -> dict:
    """What an eval directory's journal holds so far, summarised as `run_eval` does at the end, without loading
    a model (an eval may still be running there)."""
    state, done = read_journal(out)
    rows = journal_rows(done)
    overlaps = [o for e in done.values() for o in e["overlaps"]]
    summary, compared_matched = summarize_examples(rows, overlaps, state.get("matched") or {}, bootstrap,
                                                   state.get("seed", 0))
    return {"num_examples": len(done), "examples_by_task": dict(Counter(e["rows"][0]["task"] for e in done.values())),
            "summary": summary, "matched": compared_matched}


def run_eval(cfg: EvalConfig, log=print) -> dict:
    out = make_out_dir(cfg.out)
    t_start = time.perf_counter()
    env_start = environment()
    requested = fingerprint(cfg.to_dict())
    check_requested(out, requested)
    m = load_models(cfg)
    others = other_speculators(m, cfg)
    cfg = resolve(cfg, cfg.model, m.path, m.speculator_name)
    examples = interleaved(build_examples(cfg, m.tokenizer, m.max_positions, log))
    scoring = m.scoring if cfg.pruned_keeps else None  # keep 1.0 alone never reads the speculator
    log(f"eval: {len(examples)} examples, selectors {', '.join(cfg.selectors)}, keep {', '.join(map(str, cfg.keeps))}, "
        f"speculator {m.speculator_name}{f', {scoring}' if scoring else ''} ({score_label(cfg.score, cfg.select.chunk)}), device {m.device}")
    compared = [{"label": o.label, "speculator": o.stack.speculator_name, "scoring": o.stack.scoring,
                 "score": dataclasses.asdict(o.cfg.score), "chunk": o.cfg.select.chunk} for o in others]
    for o, c in zip(others, compared):
        log(f"eval: also {o.label}, {c['scoring']} ({score_label(o.cfg.score, c['chunk'])})")
    matched, signals = {}, {}
    if cfg.match_auto and any(is_auto(k) for k in cfg.keeps):
        matched, signals = matched_keeps(m, examples, cfg, log)
        cfg = with_matched(cfg, matched)
    spec_dtype = {"speculator_dtype": m.speculator_dtype_used} if m.speculator_dtype_used != m.dtype else {}
    journal = Journal(out, fingerprint(cfg.to_dict(), dtype=m.dtype, speculator=m.speculator_name, scoring=scoring, **spec_dtype,
                                  matched=matched, compared=compared, **{REQUESTED: requested}), log)
    rows, overlaps = [], []
    t_loop, num_run = time.perf_counter(), 0
    for i, ex in enumerate(examples):
        if ex.id not in journal.done:
            t0 = time.perf_counter()
            res = evaluate_example(m, ex, cfg, signals.pop(ex.id, None), others)
            journal.add(ex.id, res.rows, res.overlaps)
            num_run += 1
            eta = (time.perf_counter() - t_loop) / num_run * sum(e.id not in journal.done for e in examples[i + 1 :])
            full = res.rows[0]
            log(f"[{i + 1}/{len(examples)}] {ex.id}: {full['num_prompt_tokens']} tokens, {time.perf_counter() - t0:.1f} s, "
                f"full says {full['output']!r}; ETA {eta:.0f} s")
        rows += journal.done[ex.id]["rows"]
        overlaps += journal.done[ex.id]["overlaps"]
    summary, compared_matched = summarize_examples(rows, overlaps, matched, cfg.bootstrap, cfg.seed)
    results = {
        "config": cfg.to_dict(), "speculator": m.speculator_name, "scoring": scoring, "score": dataclasses.asdict(cfg.score),
        "compared_speculators": compared,
        "environment": env_start,
        "load_average_end": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
        "summary": summary, "matched_keeps": matched, "matched": compared_matched,
        "rows": rows, "overlaps": overlaps,
    }
    report.write_json(out / "results.json", results)
    images = report.plot(summary, out)
    if cfg.html:
        report.write_html(out / "report.html", results, images)
    log(f"wrote {out / 'results.json'} and {', '.join(p.name for p in images)}" + (", report.html" if cfg.html else ""))
    return results
