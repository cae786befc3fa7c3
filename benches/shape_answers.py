"""Answers of `spcli run` variants on a QA shard of one fact shape (issue 56): right answers, kept share and misses.

    .venv/bin/python benches/shape_answers.py [--model smollm2-135m] [--shape inline] [--questions 4] [--docs 6]
        [--length 1200] [--seed 7] [--max-tokens 16] [--out DIR] [VARIANT=FLAGS ...]

Builds benches/qa_job.py's documents (`--shape`: sentence, inline, long or bare; facts of
spcli.evaluate.shapes' wordings: codes, names, dates), writes one JSONL shard of {"id", "doc_id", "document",
"question"} records, and runs `spcli run SHARD --prompt-field document --instruction-field question --pass-through
doc_id --dtype float32 --batch-size 2` once per variant (default: full = --keep 1.0, and spcli = --keep 0.1), each in
its own output folder under --out (a killed run resumes when run again). Prints per variant the answers found
(`spcli eval`'s contains, case-insensitive), the kept share of prompt tokens and each miss. Answers only: the timing
of these runs is not a comparison (benches/qa_job.py measures speed against plain vLLM). Each variant after the
first also prints how many rows keep the same tokens as the variant before it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import qa_job


def score(rows: list[dict], answers: dict[str, tuple[str, ...]]) -> dict:
    """{right, rows, kept, misses}: a row is right when one of its answers is in its output (case-insensitive)."""
    right = [r["id"] for r in rows if r.get("output") and any(a.lower() in r["output"].lower() for a in answers[r["id"]])]
    prompt = sum(r.get("num_prompt_tokens") or 0 for r in rows)
    kept = sum(r.get("num_kept_tokens") or 0 for r in rows) / prompt if prompt else 0.0
    misses = [(r["id"], answers[r["id"]][0], (r.get("output") or r.get("error") or "")[:40]) for r in rows
              if r["id"] not in right]
    return {"right": len(right), "rows": len(rows), "kept": kept, "misses": misses}


def read_rows(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for part in sorted(out.glob("part-*.parquet")) for r in pq.read_table(part).to_pylist()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", default=["full=--keep 1.0", "spcli=--keep 0.1"], help="NAME=FLAGS")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--shape", default="inline", choices=qa_job.SHAPES)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--length", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", default="out/shape-answers")
    args = ap.parse_args(argv)

    from spcli.models import lookup
    from spcli.models.files import load_tokenizer

    tokenizer = load_tokenizer(lookup.locate(args.model))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    docs = [qa_job.make_document(tokenizer, d, args.questions, args.length, args.seed, args.shape) for d in range(args.docs)]
    shard = out / f"{args.shape}-q{args.questions}.jsonl"
    answers = qa_job.write_shard(docs, args.questions, args.seed, shard)
    spcli = Path(sys.executable).with_name("spcli")
    kept_before = None  # the previous variant's kept indices per id: how many rows each variant keeps alike
    for variant in args.variants:
        name, _, flags = variant.partition("=")
        cmd = [str(spcli), "run", str(shard), "--out", str(out / name), "--model", args.model, "--prompt-field", "document",
               "--instruction-field", "question", "--pass-through", "doc_id", "--max-tokens", str(args.max_tokens),
               "--dtype", "float32", "--batch-size", "2", *shlex.split(flags)]
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = read_rows(out / name)
        got = score(rows, answers)
        print(f"{name}: right {got['right']}/{got['rows']} (of {len(answers)}), kept {got['kept']:.3f}; misses "
              + json.dumps(got["misses"]), flush=True)
        kept = {r["id"]: r.get("kept_indices") for r in rows}
        if kept_before is not None:
            print(f"{name}: {agreement(kept_before, kept)} than the variant before", flush=True)
        kept_before = kept


def agreement(a: dict, b: dict) -> str:
    """Rows of both with the same kept indices, and the mean Jaccard of their kept sets."""
    ids = sorted(set(a) & set(b))
    same = sum(a[i] == b[i] for i in ids)
    jac = [len(set(a[i]) & set(b[i])) / max(1, len(set(a[i]) | set(b[i]))) for i in ids if a[i] and b[i]]
    return f"{same}/{len(ids)} rows keep the same tokens, kept sets' mean Jaccard {sum(jac) / max(1, len(jac)):.3f},"


if __name__ == "__main__":
    main()
