"""Which kept set the questions of one document share (issue 51 item 3): answers and cost of each rule at Q = 1, 4, 10.

    .venv/bin/python benches/group_rules.py [--model qwen2.5-coder-1.5b] [--docs 6] [--questions 1,4,10] [--keep 0.1]
        [--length 1200] [--engine hf] [--max-tokens 16] [--speculator S] [--spcli-flags F] [--reference QA_JOB_JSON,...]
        [--out DIR]

The documents and questions of benches/qa_job.py (D documents of ~L tokens, max(Q) facts each, Q of them asked in
random order; the same seed gives the same shards). Per Q, one `spcli run SHARD --prompt-field document
--instruction-field question --keep K --max-tokens M --engine E [--spcli-flags]` per rule (qa_job.run_spcli), nothing
else changed:

    own       --groups off: each question keeps its own selection (rule a)
    union     --group-rule union, the default: the union of the questions' selections, prefilled once (rule b)
    document  --group-rule document: one selection from all the questions' scores together (rule c)

Answers: right (the fact's answer in the output, `spcli eval`'s contains), and the same text as the reference's
(plain vLLM's outputs at the same Q and D in a benches/qa_job.py result, --reference). Cost, in FLOPs as
spcli/plan/flops.py counts them, summed over the documents, over full prefill with the document prefilled once
(prefix caching): the speculator over the document once and each question's own tokens (what speculate_shared reads;
`own` would read it once too, given the shared pass), then the base: `own` prefills each question's kept tokens;
`union` and `document` the shared kept set once and each question's own tokens (spcli.stages.share.group_cost). Base
tokens: what the base prefills, over what plain vLLM with prefix caching prefills (the speculator's settings counted
are the model's, not --spcli-flags'). Wall: one process each (model loads included), a rough guide only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from job import code_version, compare
from qa_job import make_document, prompt_ids, run_spcli, write_shard

RULES = {"own": "--groups off", "union": "--group-rule union", "document": "--group-rule document"}


def document_len(doc: dict, tokenizer) -> int:
    """L: the tokens every question's prompt of this document starts with (two different questions' common prefix)."""
    from spcli.stages.share import shared_len

    (q0, _), (q1, _) = doc["facts"][:2]
    rows = [{"id": "x", "document": doc["document"], "question": q} for q in (q0, q1)]
    return shared_len([prompt_ids(r, tokenizer) for r in rows])


def rows_of(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for part in sorted(out.glob("part-*.parquet")) for r in pq.read_table(part).to_pylist()]


def costs(rows: list[dict], lengths: dict[str, int], pair, score, rule: str) -> dict:
    """FLOPs and base tokens of a run's rows over full prefill with each document prefilled once (module docstring)."""
    from spcli.plan.flops import prefill_flops, speculator_flops
    from spcli.stages.share import group_cost

    base, spec = pair
    spent = full = base_tokens = plain_tokens = 0.0
    for doc_id in dict.fromkeys(r["doc_id"] for r in rows):
        members = [r for r in rows if r["doc_id"] == doc_id]
        n_doc = lengths[doc_id]
        own = [r["num_prompt_tokens"] - n_doc for r in members]
        whole = prefill_flops(base, n_doc + sum(own))
        full += whole
        plain_tokens += n_doc + sum(own)
        if rule == "own" or len(members) == 1:
            spent += speculator_flops(spec, n_doc + sum(own), score)
            spent += sum(prefill_flops(base, r["num_kept_tokens"]) for r in members)
            base_tokens += sum(r["num_kept_tokens"] for r in members)
        else:
            kept_shared = members[0]["num_kept_tokens"] - own[0]
            spent += group_cost(pair, score, n_doc, own, kept_shared) * whole
            base_tokens += kept_shared + sum(own)
    return {"cost": spent / full, "base_tokens": base_tokens / plain_tokens}


def reference_outputs(paths: str | None, q: int, d: int, args) -> dict[str, str] | None:
    """Plain vLLM's outputs at Q and D in benches/qa_job.py's qa_job.json files (comma-separated), from a run of the
    same documents (as many facts each, the same length and seed), if one has them."""
    if not paths:
        return None
    facts = max(int(x) for x in args.questions.split(","))
    for path in paths.split(","):
        saved = json.loads(Path(path).read_text())
        made = saved["args"]
        if (max(int(x) for x in made["questions"].split(",")), made["length"], made["seed"]) != (facts, args.length,
                                                                                               args.seed):
            continue  # other documents: the same ids name other facts
        found = [r["outputs"] for r in saved["runs"] if r["q"] == q and r["docs"] == d and r["name"] == "plain vLLM"]
        if found:
            return found[0]
    return None


def table(results: list[dict]) -> str:
    lines = ["| Q | rule | right | same as plain vLLM | kept | base tokens vs plain | cost vs plain (FLOPs) | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        same = f"{r['agree']}/{r['rows']}" if r.get("agree") is not None else "-"
        lines.append(f"| {r['q']} | {r['rule']} | {r['right']}/{r['rows']} | {same} | {100 * r['kept']:.1f}% | "
                     f"{r['base_tokens']:.2f} | {r['cost']:.2f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--docs", type=int, default=6, help="documents")
    ap.add_argument("--questions", default="1,4,10", help="questions per document, comma-separated")
    ap.add_argument("--length", type=int, default=1200, help="document tokens")
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--speculator", default=None, help="default: the model's")
    ap.add_argument("--spcli-flags", default="", help="more flags for every spcli run")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rules", default=",".join(RULES), help="comma-separated, of " + ", ".join(RULES))
    ap.add_argument("--reference", default=None,
                    help="benches/qa_job.py qa_job.json files (comma-separated) with plain vLLM at these Q and D")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="a folder for group_rules.json and group_rules.md")
    args = ap.parse_args(argv)

    from spcli.config.scoring import ScoreConfig
    from spcli.models import lookup
    from spcli.models.files import load_tokenizer
    from spcli.models.profiles import resolve_score
    from spcli.stages.pays import shapes

    path = lookup.locate(args.model)
    preset = lookup.PRESETS.get(args.model)
    speculator = args.speculator or (preset.speculator if preset else "self")
    spec_path = None if speculator.startswith("self") else lookup.locate(speculator)
    pair = shapes(path, speculator, spec_path)
    score = resolve_score(ScoreConfig(), args.model, path, speculator)
    tokenizer = load_tokenizer(path)
    questions = [int(q) for q in args.questions.split(",")]
    docs = [make_document(tokenizer, d, max(questions), args.length, args.seed) for d in range(args.docs)]
    lengths = {doc["doc_id"]: document_len(doc, tokenizer) for doc in docs}
    work = Path(tempfile.mkdtemp(prefix="spcli-group-rules-"))
    results = []
    for q in questions:
        shard = work / f"q{q}-d{args.docs}.jsonl"
        answers = write_shard(docs, q, args.seed, shard)
        reference = reference_outputs(args.reference, q, args.docs, args)
        for rule in args.rules.split(","):
            out = work / f"q{q}-{rule}"
            flags = argparse.Namespace(**{**vars(args), "spcli_flags": f"{args.spcli_flags} {RULES[rule]}"})
            got = run_spcli(shard, out, flags, args.engine, None)
            rows = rows_of(out)
            counted = compare(got["outputs"], reference or got["outputs"], answers)
            results.append({"q": q, "rule": rule, "wall_s": got["wall_s"], "kept": got["kept"], "grouped": got["grouped"],
                            "right": counted["right"], "rows": counted["rows"],
                            "agree": counted["agree"] if reference else None,
                            **costs(rows, lengths, pair, score, rule), "outputs": got["outputs"]})
            print(f"Q={q} {rule}: {counted['right']}/{counted['rows']} right, {got['wall_s']:.0f} s", flush=True)
        report(args, results, score)
    print(f"work folder: {work}")


def report(args, results: list[dict], score) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = (f"{args.model} (speculator scoring: layers {score.score_layers}, window {score.window}, pool {score.pool}, "
            f"rows {score.rows}), {args.docs} documents of ~{args.length} tokens, keep {args.keep}, engine {args.engine}, "
            f"{args.max_tokens} tokens out; load average {load}; code {code_version()}")
    text = table(results)
    print(f"{head}\n\n{text}", flush=True)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "group_rules.json").write_text(json.dumps({"args": vars(args), "code": code_version(),
                                                             "results": results}, indent=1))
        (folder / "group_rules.md").write_text(f"{head}\n\n    {' '.join(sys.argv)}\n\n{text}\n")


if __name__ == "__main__":
    main()
