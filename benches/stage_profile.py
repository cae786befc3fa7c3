"""Where one row's time goes, stage by stage, on the hf engine's own stages (issue 38).

    .venv/bin/python benches/stage_profile.py [--model smollm2-135m] [--speculator S] [--task needles]
        [--length 1800] [--n 8] [--keep 0.1] [--variants now,chunks] [--out FILE]

N seeded prompts of ~L tokens (`spcli eval`'s tasks; `needles` is the family of four), one row at a time
(batch 1), each through the stages `spcli run` calls (prepare.request_for, prepare.prune, engine.generate), record
by record (its full prefill, then each variant, so a change in the load hits all alike),
timed one by one:

    tokenize   prepare.request_for: the chat template, the base's tokens, the selection units (sentences
               by Bling Fire, word offsets) and the restated instruction
    speculate  prepare.prune less select: the speculator's prefill of the prompt (and restated tokens), the
               attention scores
    select     select.select_tokens on the importance, timed again alone
    base       the engine's generate of the kept tokens, max_tokens 1 (the TTFT's prefill): hf_pass on
               transformers, or a started vLLM engine (--engine vllm; spcli's worker, one request a call)
    full       the same engine's generate of every token, max_tokens 1 (full prefill, the reference; on vLLM
               an unpruned request runs as plain vLLM runs it), once per record

Variants: `now` is spcli run's defaults; `chunks` is the selection before whole facts (c2a6a38: --unit chunk
--min-free 0, no restated instruction, nothing protected). Printed per variant: the median seconds of each
stage, kept tokens, and the TTFT ratio full / (tokenize + speculate + select + base) against full's
own tokenize + full prefill.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

VARIANTS = {
    "now": {},
    "chunks": {"select": {"unit": "chunk", "min_free": 0, "protect": ""}, "score": {"restate": False}},
}


def variant_config(base, name: str):
    """A RunConfig with the variant's select/score fields replaced."""
    changes = VARIANTS[name]
    select = dataclasses.replace(base.select, **changes.get("select", {}))
    score = dataclasses.replace(base.score, **changes.get("score", {}))
    return dataclasses.replace(base, select=select, score=score)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def profile_row(rec, cfg, stack, engine, full: dict) -> dict:
    """One record through the stages, timed; `full` caches the record's full-prefill timing across variants."""
    from spcli.stages.prepare import prune, request_for
    from spcli.stages.select import is_pruned, select_tokens
    from spcli.stages.tokenize import tokenize

    req, t_tok = timed(lambda: request_for(rec, cfg, stack))
    row = {"n": req.num_prompt_tokens, "tokenize": t_tok, "speculate": 0.0, "select": 0.0}
    if is_pruned(req.num_prompt_tokens, cfg.select, req.keep):
        (req,), t_prune = timed(lambda: prune([req], cfg.select, cfg.score, stack, chunk=cfg.speculator_chunk))
        _, row["select"] = timed(lambda: select_tokens(req.importance, cfg.select, req.keep, req.forced, None,
                                                        req.units, req.protected))
        row["speculate"] = t_prune - row["select"]
    req.max_tokens = 1
    (gen,), row["base"] = timed(lambda: engine.generate([req]))
    row["kept"] = int(req.kept.numel())
    if rec.id not in full:
        ids, t_full_tok = timed(lambda: tokenize(rec, stack.tokenizer, 1 << 30, "error"))
        whole = dataclasses.replace(req, token_ids=ids, kept=torch.arange(len(ids)), max_tokens=1)
        (gen_full,), t_full = timed(lambda: engine.generate([whole]))
        full[rec.id] = {"full_tokenize": t_full_tok, "full": t_full, "full_first": gen_full.token_ids[:1]}
    row.update(full[rec.id])
    row["same_first"] = gen.token_ids[:1] == row["full_first"]
    return row


def summary(name: str, rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("n", "kept", "tokenize", "speculate", "select", "base", "full_tokenize", "full")}
    spcli = med["tokenize"] + med["speculate"] + med["select"] + med["base"]
    full = med["full_tokenize"] + med["full"]
    ratio = statistics.median((r["full_tokenize"] + r["full"]) /
                              (r["tokenize"] + r["speculate"] + r["select"] + r["base"]) for r in rows)
    same = sum(r["same_first"] for r in rows)
    return (f"| {name} | {med['n']:.0f} | {med['kept']:.0f} | {med['tokenize']:.3f} | {med['speculate']:.3f} | "
            f"{med['select']:.3f} | {med['base']:.3f} | {spcli:.3f} | {med['full_tokenize']:.3f} | {med['full']:.3f} | "
            f"{full:.3f} | {ratio:.2f}x | {same}/{len(rows)} |")


HEADER = ("| variant | tokens | kept | tokenize s | speculate s | select s | base s | spcli TTFT s | full tokenize s "
          "| full prefill s | full TTFT s | full / spcli | same first token |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--speculator", default=None)
    ap.add_argument("--task", default="needles")
    ap.add_argument("--length", type=int, default=1800)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="now,chunks")
    ap.add_argument("--engine", default="hf", help="hf or vllm (a started vLLM engine; batch 1 each call)")
    ap.add_argument("--out", default=None, help="also append the table to this file")
    args = ap.parse_args(argv)

    from spcli.config.run import RunConfig

    from spcli.config.scoring import SelectConfig
    from spcli.evaluate.tasks import expand_tasks, generate
    from spcli.io.records import Record

    cfg = RunConfig(inputs=("-",), out="-", model=args.model, speculator=args.speculator, engine=args.engine,
                    select=SelectConfig(keep=args.keep))
    if args.engine == "vllm":
        from spcli.engines.vllm.driver.args import cpu_env_defaults
        from spcli.engines.vllm.driver.engine import VllmEngine

        for key, value in cpu_env_defaults(1).items():
            os.environ.setdefault(key, value)
        engine = VllmEngine(cfg)
        engine.runner  # started before anything is timed
    else:
        from spcli.engines.hf.engine import HFEngine

        engine = HFEngine(cfg)
    stack, cfg = engine.stack, engine.cfg
    tasks = expand_tasks([args.task])
    examples = [ex for i, t in enumerate(tasks)
                for ex in generate(t, stack.tokenizer, args.length, -(-args.n // len(tasks)), args.seed + i)][: args.n]
    records = [Record(0, i, ex.id, prompt=ex.prompt, messages=ex.messages, protected=ex.protected)
               for i, ex in enumerate(examples)]
    warm = dataclasses.replace(records[0], id="warm-up")
    profile_row(warm, cfg, stack, engine, {})  # warm-up: first calls allocate, load the speculator, compile
    full: dict = {}
    lines = [f"{args.model} <- {args.speculator or 'its default'}, {args.task} ~{args.length} tokens, keep {args.keep}, "
             f"n = {len(records)}, batch 1, engine {args.engine}, {stack.device} {stack.dtype}; medians", "", HEADER]
    names = args.variants.split(",")
    configs = {name: variant_config(cfg, name) for name in names}
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for rec in records:  # each record's full prefill, then each variant: a change in the machine's load hits all alike
        for name in names:
            rows[name].append(profile_row(rec, configs[name], stack, engine, full))
    lines += [summary(name, rows[name]) for name in names]
    text = "\n".join(lines)
    print(text)
    if hasattr(engine, "close"):
        engine.close()
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
