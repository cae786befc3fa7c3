"""Where a document's time goes as documents grow, per stage, on both engines and plain vLLM (issue 58).

    .venv-vllm/bin/python benches/lengths.py [--model smollm2-135m] [--lengths 600,1200] [--docs 1]
        [--engines hf,full] [--keep 0.1] [--max-tokens 16] [--dtype auto]
        [--speculator-dtype auto] [--out DIR]

One question per document: benches/qa_job.py's documents (essay prose with one fact set into it, seeded) of
~L tokens for each of --lengths, its question as the record's instruction field (`spcli run --prompt-field
document --instruction-field question`). Each engine is started once, before anything is timed (start-ups
cancelled), warmed up on one short document, then given the documents one at a time through the code `spcli run`
runs:

    hf      spcli.job.batch.run_batch on an HFEngine (tokenize -> speculate -> select -> hf base pass)
    vllm    spcli.job.batch.stream_rows on a started VllmEngine (the streaming job loop; the speculator where
            --speculator-placement auto puts it: this process on a CPU)
    plain   plain vLLM on the same started engine: the record's whole prompt (the tokens spcli prefills for it
            whole), LLM.generate, greedy, the base's stop tokens
    full    run_batch on the HFEngine at keep 1.0 (every token: the hf engine's own full prefill), the reference
            where plain vLLM is not run

Stages, seconds per document (means): tokenize (request_for: chat template, tokens, selection units), speculator
(prepare.speculate_grouped), select (select.select_tokens), prefill (the base's time to its first token: vLLM's
arrival -> first token, hf's prefill), decode (the rest of the base pass), overhead (the document's wall less
all of those: spcli's own work between stages, the loop's waits). Stage times are read by wrapping those
functions where prepare calls them (their results unchanged) and from the rows' prefill_s / decode_s.

Printed per length: the FLOP limit of the pair (spcli.plan.flops.speedup_limit, one prompt, the speculator
beside the base: placement driver) at --keep and at the tokens actually kept, each engine's measured ratios
(the reference's wall over the engine's, per document: on the work, and to the first token, the wall less decode,
which is what the limit bounds) and the TTFT ratio's share of the limit, and answers right (the
fact's answer in the output). hf and full run in one process, vllm and plain in another (--only), each started
once; a length's documents run one engine after another, so a change in the machine's load hits all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qa_job import make_document  # noqa: E402

STAGES = ("tokenize", "speculator", "select", "prefill", "decode", "overhead")
IN_PROCESS = {"hf": "hf", "full": "hf", "vllm": "vllm", "plain": "vllm"}  # engine -> the process that runs it
SHARD = {0: "lengths"}


class StageClock:
    """Seconds spent in the stage functions prepare calls, summed since the last take()."""

    def __init__(self):
        self.spent = dict.fromkeys(("tokenize", "speculator", "select"), 0.0)

    @contextmanager
    def installed(self):
        from spcli.stages import prepare

        names = {"request_for": "tokenize", "speculate_grouped": "speculator", "select_tokens": "select"}
        saved = {name: getattr(prepare, name) for name in names}
        for name, stage in names.items():
            setattr(prepare, name, self._timed(saved[name], stage))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(prepare, name, fn)

    def _timed(self, fn, stage: str):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[stage] += time.perf_counter() - t0
        return timed

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, dict.fromkeys(self.spent, 0.0)
        return spent


def record_of(doc: dict, row: int):
    """The record `spcli run --prompt-field document --instruction-field question` reads for the document's question."""
    from spcli.io.records import Record, put_instruction

    rec = Record(0, row, doc["doc_id"], prompt=doc["document"])
    put_instruction(rec, doc["facts"][0][0], "question")
    return rec


def select_config(args):
    from spcli.config.scoring import SelectConfig

    return SelectConfig(keep=args.keep, **({} if args.max_prune_cost is None else {"max_prune_cost": args.max_prune_cost}))


def documents(tokenizer, lengths: list[int], num_docs: int, seed: int) -> dict[int, list[dict]]:
    """num_docs documents of each length, each with one fact (its question and answer); seeded."""
    return {n: [make_document(tokenizer, 1000 * n + d, 1, n, seed) for d in range(num_docs)] for n in lengths}


def account(wall: float, spent: dict[str, float], row) -> dict:
    """One document's stages (seconds), its tokens and output; overhead is the wall less every stage."""
    out = {**spent, "prefill": row.prefill_s or 0.0, "decode": row.decode_s or 0.0, "wall": wall,
           "n": row.num_prompt_tokens, "kept": row.num_kept_tokens, "output": row.output, "error": row.error}
    out["overhead"] = wall - sum(out[s] for s in STAGES[:-1])
    return out


def run_hf(cfg, docs: dict[int, list[dict]], engines: list[str], warm: dict) -> list[dict]:
    """hf (and full: keep 1.0) through run_batch, a document at a time."""
    import dataclasses

    from spcli.engines.hf.engine import HFEngine
    from spcli.job.batch import run_batch

    engine = HFEngine(cfg)
    configs = {"hf": engine.cfg, "full": dataclasses.replace(engine.cfg, select=dataclasses.replace(engine.cfg.select, keep=1.0))}
    clock = StageClock()
    out = []
    with clock.installed():
        for name in engines:
            run_batch(engine, [record_of(warm, 0)], configs[name], SHARD)  # warm-up: first calls allocate, load
        clock.take()
        for n, group in docs.items():
            for doc in group:
                for name in engines:
                    t0 = time.perf_counter()
                    (row,) = run_batch(engine, [record_of(doc, 0)], configs[name], SHARD)
                    out.append({"engine": name, "length": n, "doc": doc["doc_id"],
                                **account(time.perf_counter() - t0, clock.take(), row)})
                    print(f"lengths: {json.dumps(out[-1])}", file=sys.stderr, flush=True)
    return out


def run_vllm(cfg, docs: dict[int, list[dict]], engines: list[str], warm: dict) -> list[dict]:
    """vllm through the streaming job loop, and plain vLLM on the same started engine, a document at a time."""
    from spcli.engines.vllm.driver.engine import VllmEngine

    engine = VllmEngine(cfg)
    engine.runner  # started before anything is timed
    clock = StageClock()
    out = []
    with clock.installed():
        for name in engines:
            one_vllm(engine, warm, name, clock)
        clock.take()
        for n, group in docs.items():
            for doc in group:
                for name in engines:
                    out.append({"engine": name, "length": n, "doc": doc["doc_id"], **one_vllm(engine, doc, name, clock)})
                    print(f"lengths: {json.dumps(out[-1])}", file=sys.stderr, flush=True)
    engine.close()
    return out


def one_vllm(engine, doc: dict, name: str, clock: StageClock) -> dict:
    from spcli.job.batch import stream_rows

    engine.runner.llm.reset_prefix_cache()  # no document's blocks left from an earlier run of it
    if name == "plain":
        return plain_vllm(engine, record_of(doc, 0), clock)
    t0 = time.perf_counter()
    with engine.streaming() as stream:
        ((_, row),) = list(stream_rows(stream, engine, iter([record_of(doc, 0)]), engine.cfg, SHARD, None))
    return account(time.perf_counter() - t0, clock.take(), row)


def plain_vllm(engine, rec, clock: StageClock) -> dict:
    """Plain vLLM: the record's whole prompt, LLM.generate (as benches/qa_job.py's --plain sends it)."""
    from types import SimpleNamespace

    from vllm import SamplingParams, TokensPrompt

    from spcli.stages.tokenize import tokenize

    runner = engine.runner
    t0 = time.perf_counter()
    ids = tokenize(rec, engine.stack.tokenizer, 1 << 30, "error")
    t1 = time.perf_counter()
    params = SamplingParams(max_tokens=engine.cfg.generate.max_tokens, temperature=0.0,
                            stop_token_ids=sorted(runner.eos_ids))
    (o,) = runner.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    ttft = getattr(o.metrics, "first_token_latency", None) if o.metrics else None
    ttft = wall - (t1 - t0) if ttft is None else ttft
    clock.take()
    row = SimpleNamespace(prefill_s=ttft, decode_s=max(0.0, wall - (t1 - t0) - ttft), num_prompt_tokens=len(ids),
                          num_kept_tokens=len(ids), output=o.outputs[0].text, error=None)
    return account(wall, {"tokenize": t1 - t0, "speculator": 0.0, "select": 0.0}, row)


def limits(cfg, stack, n: int, kept: float) -> tuple[float, float]:
    """The pair's FLOP limit on the TTFT speed-up at n tokens: at --keep (spcli plan's) and at `kept` tokens."""
    from spcli.plan.flops import prefill_flops, speculator_flops, speedup_limit
    from spcli.stages.pays import shapes

    from spcli.models import lookup
    from spcli.models.speculator import parse_self

    spec_path = stack.located[1] if stack.located else None  # None where the stack did not load its speculator
    if spec_path is None and parse_self(stack.speculator_name) is None:
        spec_path = lookup.locate(stack.speculator_name)
    pair = shapes(stack.path, stack.speculator_name, spec_path)
    if pair is None:
        return float("nan"), float("nan")
    base, spec = pair
    at_keep = speedup_limit(base, spec, cfg.score, n, cfg.select.keep, 1, 1, "driver").limit
    at_kept = prefill_flops(base, n) / (prefill_flops(base, round(kept)) + speculator_flops(spec, n, cfg.score))
    return at_keep, at_kept


def summarize(rows: list[dict], answers: dict[str, str], reference: str, limit_of) -> list[dict]:
    """Per (length, engine): mean seconds per stage and per document, the ratio against the reference's per-document
    wall (the work) and to the first token (the wall less decode: what the FLOP limit bounds), the FLOP limits and the
    TTFT ratio's share of the limit at --keep, answers right."""
    from spcli.evaluate.metrics import contains

    out = []
    for n in dict.fromkeys(r["length"] for r in rows):
        at = [r for r in rows if r["length"] == n]
        ref = [r for r in at if r["engine"] == reference]
        for name in dict.fromkeys(r["engine"] for r in at):
            mine = [r for r in at if r["engine"] == name]
            mean = {k: statistics.mean(r[k] for r in mine) for k in (*STAGES, "wall", "n", "kept")}
            ratio = statistics.mean(r["wall"] for r in ref) / mean["wall"] if ref else float("nan")
            ttft = [r["wall"] - r["decode"] for r in ref]  # the document's wall to its first token
            ratio_ttft = statistics.mean(ttft) / (mean["wall"] - mean["decode"]) if ref else float("nan")
            at_keep, at_kept = limit_of(mean["n"], mean["kept"]) if name not in ("plain", "full") else (1.0, 1.0)
            right = sum(r["error"] is None and contains(r["output"], (answers[r["doc"]],), False) == 1.0 for r in mine)
            out.append({"length": n, "engine": name, **mean, "ratio": ratio, "ratio_ttft": ratio_ttft, "limit": at_keep,
                        "limit_kept": at_kept, "share": ratio_ttft / at_keep, "right": right, "docs": len(mine)})
    return out


def table(summary: list[dict], reference: str) -> str:
    lines = [f"| length | engine | tokens | kept | tokenize s | speculator s | select s | prefill s | decode s | "
             f"overhead s | per doc s | vs {reference} (work) | vs {reference} (TTFT) | FLOP limit (at kept) | TTFT share of "
             "limit | right |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        lines.append(f"| ~{r['length']} | {r['engine']} | {r['n']:.0f} | {r['kept']:.0f} | "
                     + " | ".join(f"{r[s]:.2f}" for s in STAGES)
                     + f" | {r['wall']:.2f} | {r['ratio']:.2f}x | {r['ratio_ttft']:.2f}x | {r['limit']:.2f}x "
                     f"({r['limit_kept']:.2f}x) | "
                     f"{100 * r['share']:.0f}% | {r['right']}/{r['docs']} |")
    return "\n".join(lines)


def child(args) -> list[dict]:
    """The engines of one process (--only hf or vllm), in order; their rows."""
    from spcli.config.run import GenerateConfig, RunConfig, VllmConfig
    from spcli.models import lookup
    from spcli.models.files import load_tokenizer

    engines = [e for e in args.engines.split(",") if IN_PROCESS[e] == args.only]
    cfg = RunConfig(inputs=("-",), out="-", model=args.model, speculator=args.speculator, engine=args.only,
                    dtype=args.dtype, speculator_dtype=args.speculator_dtype, select=select_config(args), generate=GenerateConfig(max_tokens=args.max_tokens),
                    vllm=VllmConfig(max_model_len=args.max_model_len))
    tokenizer = load_tokenizer(lookup.locate(args.model))
    docs = documents(tokenizer, [int(x) for x in args.lengths.split(",")], args.docs, args.seed)
    warm = make_document(tokenizer, 999, 1, min(600, min(docs)), args.seed)
    if args.only == "vllm":
        from spcli.engines.vllm.driver.args import cpu_env_defaults

        for key, value in cpu_env_defaults(1).items():  # as spcli run's engine sets them before vLLM starts
            os.environ.setdefault(key, value)
        return run_vllm(cfg, docs, engines, warm)
    return run_hf(cfg, docs, engines, warm)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--speculator", default=None, help="default: the model's")
    ap.add_argument("--lengths", default="600,1200", help="document tokens, comma list (e.g. 1000,2000,4000,8000)")
    ap.add_argument("--docs", type=int, default=1, help="documents per length")
    ap.add_argument("--engines", default="hf,full", help="of hf, vllm, plain, full")
    ap.add_argument("--reference", default=None, help="the engine ratios are against (default: plain, else full)")
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--max-prune-cost", type=float, default=None, help="default: spcli run's (inf: always prune)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--speculator-dtype", default="auto", help="the speculator's (spcli run --speculator-dtype)")
    ap.add_argument("--max-model-len", type=int, default=None, help="vLLM's (a smaller KV cache fits a busy machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="a folder for lengths.json and lengths.md")
    ap.add_argument("--only", choices=("hf", "vllm"), help=argparse.SUPPRESS)  # a child process: its JSON rows out
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    assert all(e in IN_PROCESS for e in engines), f"--engines takes {', '.join(IN_PROCESS)}"
    if args.only:
        print("LENGTHS-ROWS " + json.dumps(child(args)), flush=True)
        return []

    from spcli.config.run import RunConfig
    from spcli.models import load, lookup
    from spcli.models.files import load_tokenizer
    from spcli.models.profiles import resolve

    rows = []
    for kind in dict.fromkeys(IN_PROCESS[e] for e in engines):
        if kind == "hf" and "vllm" not in {IN_PROCESS[e] for e in engines}:
            rows += child(argparse.Namespace(**{**vars(args), "only": "hf"}))  # this process: no vLLM beside it
            continue
        proc = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--only", kind],
                              stdout=subprocess.PIPE, text=True)  # its log goes to this one's stderr as it runs
        found = [line for line in proc.stdout.splitlines() if line.startswith("LENGTHS-ROWS ")]
        if proc.returncode or not found:  # the other processes' rows are still reported
            print(f"the {kind} process exited {proc.returncode}: its engines are left out", file=sys.stderr, flush=True)
            continue
        rows += json.loads(found[-1].removeprefix("LENGTHS-ROWS "))
    if not rows:
        raise SystemExit("no engine ran to its end")
    reference = args.reference or ("plain" if "plain" in {r["engine"] for r in rows} else "full")
    tokenizer = load_tokenizer(lookup.locate(args.model))
    docs = documents(tokenizer, [int(x) for x in args.lengths.split(",")], args.docs, args.seed)
    answers = {d["doc_id"]: d["facts"][0][1] for group in docs.values() for d in group}
    stack = load.load_stack(args.model, args.speculator, args.dtype, "cpu", with_base=False, needs_speculator=False,
                            speculator_dtype=args.speculator_dtype)
    cfg = resolve(RunConfig(inputs=("-",), out="-", model=args.model, speculator=args.speculator,
                            select=select_config(args)), args.model, stack.path, stack.speculator_name)
    summary = summarize(rows, answers, reference, lambda n, kept: limits(cfg, stack, int(n), kept))
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = (f"{args.model} <- {stack.speculator_name}, one question per document, {args.docs} documents per length, "
            f"keep {args.keep}, {args.max_tokens} tokens out, {stack.dtype} (speculator {stack.speculator_dtype_used}), "
            f"start-ups cancelled; per document, means; "
            f"{len(os.sched_getaffinity(0))} CPUs, load average {load_avg}")
    text = f"{head}\n\n{table(summary, reference)}"
    print(text, flush=True)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "lengths.json").write_text(json.dumps({"args": vars(args), "rows": rows, "summary": summary}, indent=1))
        (folder / "lengths.md").write_text(f"{head}\n\n    {' '.join(sys.argv)}\n\n{table(summary, reference)}\n")
    return summary


if __name__ == "__main__":
    main()
