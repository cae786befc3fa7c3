"""The whole job against plain vLLM: N prompts through `spcli run` as a user runs it, and through `LLM.generate`.

    .venv-vllm/bin/python benches/job.py [--model smollm2-135m] [--speculator S] [--n 8] [--length 1536]
        [--max-tokens 32] [--keep 0.1] [--engines hf,vllm] [--dtype auto] [--out docs/results/job/NAME]

N seeded needle prompts (`spcli eval`'s niah task: one 7-digit number to find, ~L tokens in the chat
template) as one JSONL shard, then one process each, one after the other, timed from start to exit
(start-up, model loading and tokenizing included):

    plain vLLM      this script's --plain mode: `LLM.generate` of all N token-id prompts at once, full
                    prefill, the dtype and engine settings `spcli run --engine vllm` gives its base
                    (spcli.engines.vllm.driver.args), the same stop tokens, every CPU bound and malloc keeping freed memory, as
                    spcli's vLLM processes get them (vllm_args.cpu_env_defaults)
    spcli ENGINE    `spcli run SHARD --out DIR --engine ENGINE --keep K --max-tokens M`, every other flag at its
                    default (--model/--speculator only where given), per --engines entry
    spcli vllm @1   the same at --keep 1.0 (no speculator): what the loop itself costs against plain vLLM

Per run: wall s, rows/s, speed-up = plain wall / run wall, answers that agree with plain vLLM's (same text)
and that are right (the needle's number in the answer, `spcli eval`'s `contains`). The limit is
spcli.plan's FLOP limit for the pair at this keep and length (`spcli plan`, batch N, one device), and
share = speed-up / limit. Run it with the vLLM venv's python (it has both engines); the same command
runs on a GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = "plain vLLM"


def bind_cpus(tp: int = 1) -> None:
    """vLLM's CPU build bound to every CPU, as `spcli run --engine vllm` binds it (unset variables only)."""
    from spcli.engines.vllm.driver.args import cpu_env_defaults

    for key, value in cpu_env_defaults(tp).items():
        os.environ.setdefault(key, value)


def plain_llm_kwargs(model: str, path: Path, dtype: str | None = "auto", is_cpu: bool = True) -> dict:
    """LLM(...) arguments for plain vLLM with the engine settings `spcli run --engine vllm` gives its base
    (the dtype as spcli resolves `dtype` for the vllm engine), without spcli's worker."""
    from spcli.config.run import RunConfig
    from spcli.engines.vllm.driver.args import engine_args

    args = engine_args(RunConfig(inputs=("-",), out="-", model=model, engine="vllm", dtype=dtype), path, is_cpu)
    extra = args.pop("engine_kwargs")
    return {**{k: v for k, v in args.items() if v is not None}, **extra}


def plain(shard: Path, out: Path, model: str, max_tokens: int, dtype: str) -> None:
    """--plain: what a user of plain vLLM runs; one JSON line per row (id, output) to `out`."""
    bind_cpus()
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.platforms import current_platform

    from spcli.models import lookup
    from spcli.models.files import eos_ids_of, load_tokenizer
    from spcli.stages.tokenize import tokenize
    from spcli.io.records import Record

    path = lookup.locate(model)
    kwargs = plain_llm_kwargs(model, path, dtype, is_cpu=current_platform.is_cpu())
    llm = LLM(**kwargs)
    tokenizer = load_tokenizer(path)
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    prompts = [TokensPrompt(prompt_token_ids=tokenize(Record(0, i, r["id"], messages=r["messages"]), tokenizer, 1 << 30, "error"))
               for i, r in enumerate(rows)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=sorted(eos_ids_of(path, tokenizer)))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    with out.open("w") as f:
        for r, o in zip(rows, outputs, strict=True):
            f.write(json.dumps({"id": r["id"], "output": o.outputs[0].text, "dtype": kwargs["dtype"]}) + "\n")


def make_shard(model: str, n: int, length: int, seed: int, path: Path) -> dict[str, tuple[str, ...]]:
    """N needle prompts as JSONL records at `path`; returns each id's answers."""
    from spcli.models import lookup
    from spcli.models.files import load_tokenizer
    from spcli.evaluate.tasks import generate

    examples = generate("niah", load_tokenizer(lookup.locate(model)), length, n, seed)
    path.write_text("".join(json.dumps({"id": ex.id, "messages": ex.messages}) + "\n" for ex in examples))
    return {ex.id: ex.answers for ex in examples}


def code_version() -> str:
    """The checkout's commit, and how many files under spcli/ differ from it (what `spcli run` ran)."""
    repo = Path(__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    changed = len(git("status", "--porcelain", "--", "spcli").splitlines())
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (f" + {changed} changed files in spcli/" if changed else "")


def timed(cmd: list[str], log: Path) -> float:
    """Wall seconds of one process from start to exit; its output goes to `log`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                         os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}; its output:\n{log.read_text()[-4000:]}")
    return wall


def spcli_outputs(out: Path) -> tuple[dict[str, str | None], dict]:
    """(id -> output text, or None for an error row) and the fingerprint fields of a `spcli run` directory."""
    import pyarrow.parquet as pq

    rows = [r for part in sorted(out.glob("part-*.parquet")) for r in pq.read_table(part).to_pylist()]
    manifest = json.loads((out / "manifest.json").read_text())
    return {r["id"]: (None if r["error"] else r["output"]) for r in rows}, manifest["fingerprint_fields"]


def compare(outputs: dict[str, str | None], reference: dict[str, str | None], answers: dict[str, tuple[str, ...]]) -> dict:
    """How many outputs equal the reference's (same text), and how many hold their answer (`spcli eval`'s
    `contains`, any one answer); error rows count as neither."""
    from spcli.evaluate.metrics import contains

    ids = sorted(answers)
    return {
        "agree": sum(outputs.get(i) is not None and outputs.get(i) == reference.get(i) for i in ids),
        "right": sum(outputs.get(i) is not None and contains(outputs[i], answers[i], False) == 1.0 for i in ids),
        "errors": sum(outputs.get(i) is None for i in ids),
        "rows": len(ids),
    }


def flop_limit(model: str, speculator: str | None, length: int, keep: float, n: int, max_tokens: int) -> float | None:
    """spcli.plan's speed-up limit for the pair at this keep and length, batch n on one device (None at keep 1)."""
    from spcli.plan.plan import PlanConfig, make_plan

    if keep >= 1.0:
        return None
    plan = make_plan(PlanConfig(model=model, speculator=speculator, tp=1, length=length, keep=keep, batch=n,
                                max_tokens=max_tokens, placement="workers"))
    return plan.limits[0].limit


def summarize(runs: list[dict], answers: dict[str, tuple[str, ...]], limit: float | None) -> list[dict]:
    """Rows/s, speed-up against plain vLLM, share of the FLOP limit and the answers, per run."""
    ref = next(r for r in runs if r["name"] == PLAIN)
    out = []
    for r in runs:
        speedup = ref["wall_s"] / r["wall_s"]
        row = {"name": r["name"], "keep": r["keep"], "dtype": r["dtype"], "wall_s": r["wall_s"],
               "rows_per_s": len(answers) / r["wall_s"], "speedup": speedup,
               "limit": limit if r["keep"] < 1.0 else 1.0, **compare(r["outputs"], ref["outputs"], answers)}
        row["share_of_limit"] = speedup / row["limit"] if row["limit"] else None
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| run | keep | dtype | wall s | rows/s | vs plain vLLM | limit | share | agree | right |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f"{100 * r['share_of_limit']:.0f}%" if r["share_of_limit"] is not None else "-"
        errors = f" ({r['errors']} errors)" if r["errors"] else ""
        lines.append(f"| {r['name']} | {r['keep']} | {r['dtype']} | {r['wall_s']:.1f} | {r['rows_per_s']:.3f} | "
                     f"{r['speedup']:.2f}x | {r['limit']:.2f}x | {share} | {r['agree']}/{r['rows']} | "
                     f"{r['right']}/{r['rows']}{errors} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--speculator", default=None, help="default: the model's")
    ap.add_argument("--n", type=int, default=8, help="prompts")
    ap.add_argument("--length", type=int, default=1536, help="prompt tokens (chat template included)")
    ap.add_argument("--max-tokens", type=int, default=32, help="niah's answer needs ~25 of SmolLM2's tokens")
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--engines", default="hf,vllm", help="spcli engines to run at --keep; vllm also at keep 1.0")
    ap.add_argument("--dtype", default="auto", help="for every run; auto: as spcli resolves it for the vllm engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="a folder for job.json and job.md (e.g. docs/results/job/NAME)")
    ap.add_argument("--plain", nargs=2, metavar=("SHARD", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plain:
        return plain(Path(args.plain[0]), Path(args.plain[1]), args.model, args.max_tokens, args.dtype)

    work = Path(tempfile.mkdtemp(prefix="spcli-job-"))
    shard = work / "prompts.jsonl"
    answers = make_shard(args.model, args.n, args.length, args.seed, shard)
    spcli = [sys.executable, "-m", "spcli", "run", str(shard), "--model", args.model, "--max-tokens", str(args.max_tokens)]
    spcli += ["--speculator", args.speculator] if args.speculator else []
    spcli += ["--dtype", args.dtype] if args.dtype != "auto" else []
    jobs = [(f"spcli {e}", e, args.keep) for e in args.engines.split(",") if e]
    jobs += [(f"spcli {e} @1", e, 1.0) for e in args.engines.split(",") if e == "vllm" and args.keep < 1.0]

    plain_out = work / "plain.jsonl"
    wall = timed([sys.executable, __file__, "--plain", str(shard), str(plain_out), "--model", args.model,
                  "--max-tokens", str(args.max_tokens), "--dtype", args.dtype], work / "plain.log")
    got = [json.loads(line) for line in plain_out.read_text().splitlines()]
    runs = [{"name": PLAIN, "keep": 1.0, "dtype": got[0]["dtype"], "wall_s": wall, "outputs": {r["id"]: r["output"] for r in got}}]
    print(f"{PLAIN}: {wall:.1f} s", flush=True)
    for name, engine, keep in jobs:
        out = work / name.replace(" ", "-").replace("@", "keep")
        wall = timed([*spcli, "--out", str(out), "--engine", engine, "--keep", str(keep)], work / f"{out.name}.log")
        outputs, fingerprint = spcli_outputs(out)
        runs.append({"name": name, "keep": keep, "dtype": fingerprint["dtype"], "wall_s": wall, "outputs": outputs})
        print(f"{name}: {wall:.1f} s", flush=True)

    limit = flop_limit(args.model, args.speculator, args.length, args.keep, args.n, args.max_tokens)
    rows = summarize(runs, answers, limit)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = (f"{args.model} (speculator {args.speculator or 'default'}), {args.n} niah prompts x ~{args.length} tokens, "
            f"{args.max_tokens} tokens out, keep {args.keep}; {len(os.sched_getaffinity(0))} CPUs, load average {load}; "
            f"code {code_version()}")
    print(head)
    print(table(rows))
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "job.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "plain"},
                                                     "rows": rows, "runs": runs, "answers": answers}, indent=1))
        (folder / "job.md").write_text(f"{head}\n\n    {' '.join(sys.argv)}\n\n{table(rows)}\n")
    print(f"work folder: {work}")


if __name__ == "__main__":
    main()
