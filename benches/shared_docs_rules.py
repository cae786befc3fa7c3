"""Which kept set a group of questions about one document shares (issue 51, part 3), measured on SmolLM2-135M.

Documents from benches/shared_docs_data.py: essay text with --facts facts, one question per fact in random order;
a group asks a document's first Q questions, its prompts sharing the template head and the document (p tokens;
question b's own s_b tokens after them). The speculator reads each group once (spcli.stages.speculate_shared:
p + sum_b s_b tokens; made once per document, as each question's importance is as alone), then, per keep rate, with
the selection `spcli run` makes (select_tokens, the model's resolved SelectConfig; pruned whatever pays.py says):

    full   every token; the document prefilled once (what vLLM's prefix caching pays): p + sum_b s_b base tokens
    a      each question its own kept set (spcli.engines.hf.base_pass): sum_b |kept_b|
    b      the union of the questions' kept document tokens, prefilled once, then each question's own kept tokens
           after it (spcli.engines.hf.shared_pass): |U| + sum_b |own_b|
    c      one document set scored from all questions' rows together (their importance's max over questions, as one
           pass with rows max would; the mean with rows mean), selected over the document at the keep rate, + each
           question's own tokens
    c@b    c's document importance selected at b's budget (the union's size): the same cost as b, another choice
    c+top  c, each question adding its own best units outside the set (--top-up tokens, by its own importance),
           placed after the shared part at their positions (shared_pass's approximation)
    kvzip  one document set from reconstruction rows (KVzip, arXiv 2505.23416): after the document the speculator
           reads REPEAT and the document again (no question); those rows' attention scores the document;
           speculator p + |REPEAT| + (the document's content again), nothing per question

Per question: `acc` (the answer in the output, spcli.evaluate.metrics.contains; a date's month, day and year as a
share) and `fact` (its fact sentence kept whole in what the base saw). Per group: base tokens prefilled and
speculator tokens. The base pass is greedy, --max-tokens tokens; --no-answers skips it (kept sets and facts only).

    PYTHONPATH=$PWD .venv/bin/python benches/shared_docs_rules.py [--docs 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from spcli.config.run import RunConfig
from spcli.config.scoring import SelectConfig
from spcli.engines.hf import base_pass
from spcli.engines.hf.shared_pass import SharedGroup, generate_shared
from spcli.evaluate.compare import needle_spans
from spcli.evaluate.metrics import bootstrap, contains, whole_facts
from spcli.io.records import Record
from spcli.models.load import load_stack
from spcli.models.lookup import default_speculator, locate
from spcli.models.profiles import resolve
from spcli.plan.flops import prefill_flops, speculator_flops
from spcli.stages.pays import shapes
from spcli.stages.prepare import request_for
from spcli.stages.select import fill_units, select_tokens
from spcli.stages.speculate_shared import prefill_prefix, speculate_shared, speculate_suffixes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_docs_data import Doc, documents  # noqa: E402

RULES = ("a", "b", "c", "c@b", "c+top", "kvzip")
REPEAT = "\n\nRepeat the notes above exactly.\n\n"  # KVzip's reconstruction prompt, in the user's turn


def document_set(importance: torch.Tensor, reqs, p: int, sel: SelectConfig) -> torch.Tensor:
    """Kept document positions (< p, ascending) from one document importance [p]: select_tokens over the document at
    the keep rate, forcing its first tokens and what any question's forced tail covers of it (as rule a does)."""
    forced = torch.zeros(p, dtype=torch.bool)
    for r in reqs:
        forced[max(0, r.num_prompt_tokens - sel.keep_last) : p] = True
    head = reqs[0]
    protected = None if head.protected is None else head.protected[:p]
    return select_tokens(importance, dataclasses.replace(sel, keep_last=0), sel.keep, forced, None, head.units[:p],
                         protected)


def content_start(tokenizer, ids: list[int]) -> int:
    """Where the user's text starts in ids (after the chat template's head)."""
    head = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], add_generation_prompt=False,
                                         tokenize=True, return_dict=False)
    i = 0
    while i < min(len(head), len(ids)) and head[i] == ids[i]:
        i += 1
    return i


def kvzip_importance(stack, cfg, ids: list[int], p: int) -> tuple[torch.Tensor, int]:
    """[p] importance of the document from the reconstruction rows, and the speculator tokens it cost."""
    repeat = stack.tokenizer(REPEAT, add_special_tokens=False)["input_ids"] + ids[content_start(stack.tokenizer, ids):p]
    score = dataclasses.replace(cfg.score, window=len(repeat), lookahead=0)
    prefix = prefill_prefix(stack.speculator, ids[:p], score, stack.device, cfg.speculator_chunk)
    (spec,) = speculate_suffixes(prefix, [repeat], score, stack.speculator_eos_ids, stack.device)
    return spec.importance[:p], p + len(repeat)


def kept_sets(rule: str, reqs, imps, own, p: int, sel: SelectConfig, top_up: int, kv: torch.Tensor | None,
              rows: str = "max"):
    """(the shared document set, each question's kept positions) under a shared `rule`; `own`: each question's own
    selection (rule a's). Rule c's document importance: all questions' rows together, combined as `rows` combines a
    prompt's rows (each question scores as many rows)."""
    union = torch.unique(torch.cat([k[k < p] for k in own]))
    if rule == "b":
        shared = union
    else:
        together = torch.stack([i[:p] for i in imps])  # [Q, p]
        doc = kv if rule == "kvzip" else (together.amax(0) if rows == "max" else together.mean(0))
        if rule == "c@b":  # c's scores at b's budget: the union's size
            sel = dataclasses.replace(sel, keep=min(1.0, union.numel() / p))
        shared = document_set(doc, reqs, p, sel)
    kept = []
    for r, i, k in zip(reqs, imps, own):
        mask = torch.zeros(r.num_prompt_tokens, dtype=torch.bool)
        mask[shared] = True
        mask[k[k >= p]] = True
        if rule == "c+top":
            fill_units(mask, i.float(), r.units, sel.unit_score, top_up)
        kept.append(mask.nonzero().flatten())
    return shared, kept


def generate_groups(stack, groups: list[tuple[list, list[torch.Tensor], torch.Tensor | None]], log) -> list[list]:
    """Per group (requests, their kept positions, the shared document set or None), the base's generations: base_pass
    where nothing is shared, else every group together through shared_pass (each shared set prefilled once)."""
    t0 = time.perf_counter()
    made = [[dataclasses.replace(r, kept=k) for r, k in zip(reqs, kept)] for reqs, kept, _ in groups]
    if all(shared is None for *_, shared in groups):
        flat = base_pass.generate(stack.base, [r for reqs in made for r in reqs], stack.tokenizer, stack.eos_ids,
                                stack.pad_id, stack.device)
        out, start = [], 0
        for reqs in made:
            out.append(flat[start : start + len(reqs)])
            start += len(reqs)
    else:
        out = generate_shared(stack.base, [SharedGroup(reqs, shared) for reqs, (*_, shared) in zip(made, groups)],
                              stack.tokenizer, stack.eos_ids, stack.pad_id, stack.device)
    log(f"  base pass: {sum(map(len, made))} rows, {sum(int(r.kept.numel()) for rs in made for r in rs)} kept, "
        f"{time.perf_counter() - t0:.0f} s")
    return out


def run_doc(stack, cfg, doc: Doc, sizes, keeps, rules, top_up: int, with_answers: bool, log) -> tuple[list, list]:
    """(question rows, group rows) of one document: its groups ask its first Q questions, Q in sizes. The speculator
    runs once over all its questions (each one's importance is as alone, so any group's is a subset); rule a's and
    full prefill's generations are per question, so made once for all groups; the shared rules' groups go through
    the base together, per keep rate."""
    reqs = [request_for(Record(0, i, ex.id, messages=ex.messages, max_tokens=ex.max_tokens), cfg, stack)
            for i, ex in enumerate(doc.questions)]
    spans = [needle_spans(stack.tokenizer, ex, r.token_ids) for ex, r in zip(doc.questions, reqs)]
    t0 = time.perf_counter()
    shared_pass = speculate_shared(stack.speculator, [r.speculator_prompt for r in reqs], cfg.score,
                                   stack.speculator_eos_ids, stack.device, chunk=cfg.speculator_chunk)
    p, imps = shared_pass.num_shared, [s.importance for s in shared_pass.speculations]
    kv, kv_tokens = kvzip_importance(stack, cfg, reqs[0].token_ids, p) if "kvzip" in rules else (None, 0)
    log(f"{doc.doc_id}: p {p}, own {shared_pass.num_suffix_tokens}, speculator {time.perf_counter() - t0:.0f} s")
    own_lens = [r.num_prompt_tokens - p for r in reqs]
    q_rows, g_rows = [], []

    def record(q, keep, rule, kept_each, gens, base_tokens, spec_tokens):
        g_rows.append({"doc": doc.doc_id, "Q": q, "keep": keep, "rule": rule, "p": p, "base_tokens": base_tokens,
                       "spec_tokens": spec_tokens, "spec_tokens_alone": sum(r.num_prompt_tokens for r in reqs[:q])})
        for b, (ex, k, sp) in enumerate(zip(doc.questions[:q], kept_each, spans)):
            text = None if gens is None else gens[b].text
            q_rows.append({"doc": doc.doc_id, "Q": q, "keep": keep, "rule": rule, "id": ex.id,
                           "acc": None if gens is None else contains(text, ex.answers, ex.require_all),
                           "fact": whole_facts(k, sp), "num_kept": int(k.numel()), "output": text})

    generate = (lambda groups: generate_groups(stack, groups, log)) if with_answers else (lambda groups: [None] * len(groups))
    everything = [torch.arange(r.num_prompt_tokens) for r in reqs]
    (full,) = generate([(reqs, everything, torch.arange(p))])  # each question's = plain generation of its prompt
    for q in sizes:
        record(q, 1.0, "full", everything[:q], full, p + sum(own_lens[:q]), 0)
    for keep in keeps:
        sel = dataclasses.replace(cfg.select, keep=keep)
        own = [select_tokens(i, sel, keep, r.forced, None, r.units, r.protected) for r, i in zip(reqs, imps)]
        (alone,) = generate([(reqs, own, None)]) if "a" in rules else (None,)
        cells = []  # (Q, rule, shared set, kept sets) of the shared rules
        for q in sizes:
            for rule in rules:
                if rule == "a" or (rule == "b" and q == 1):  # b of one question: a's kept set, prefilled as a's
                    record(q, keep, rule, own[:q], alone, sum(int(k.numel()) for k in own[:q]), p + sum(own_lens[:q]))
                else:
                    cells.append((q, rule, *kept_sets(rule, reqs[:q], imps[:q], own[:q], p, sel, top_up, kv,
                                                      cfg.score.rows)))
        gens = generate([(reqs[:q], kept_each, shared) for q, _, shared, kept_each in cells]) if cells else []
        for (q, rule, shared, kept_each), g in zip(cells, gens):
            cost = int(shared.numel()) + sum(int(k.numel()) - int(shared.numel()) for k in kept_each)
            record(q, keep, rule, kept_each, g, cost, kv_tokens if rule == "kvzip" else p + sum(own_lens[:q]))
    return q_rows, g_rows


def mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def paired(rows: list[dict], full: dict) -> str:
    """The mean paired difference of `acc` against full prefill's on the same questions, with its 95% bootstrap
    interval (spcli.evaluate.metrics.bootstrap); '-' without answers."""
    diffs = [r["acc"] - full[r["doc"], r["id"]] for r in rows if r["acc"] is not None and (r["doc"], r["id"]) in full]
    if not diffs:
        return "-"
    b = bootstrap(diffs)
    return f"{b.mean:+.2f} [{b.lo:+.2f},{b.hi:+.2f}]"


def table(q_rows: list[dict], g_rows: list[dict], ratio: float | None) -> str:
    """Per Q, keep and rule: answers, their paired difference from full prefill's (`acc-full`) and facts kept (means
    over questions), base and speculator tokens per group (means), the base tokens over full prefill's with the
    document prefilled once (`vs full`), and with the speculator's tokens at `ratio` of a base token (`cost`: FLOPs
    per token, spcli.plan.flops; None: unknown)."""
    qs, gs = defaultdict(list), defaultdict(list)
    for r in q_rows:
        qs[r["Q"], r["keep"], r["rule"]].append(r)
    for r in g_rows:
        gs[r["Q"], r["keep"], r["rule"]].append(r)
    full_acc = {(r["doc"], r["id"]): r["acc"] for r in q_rows if r["rule"] == "full" and r["acc"] is not None}
    lines = [f"{'Q':>3} {'keep':>5} {'rule':<6} {'n':>4} {'acc':>6} {'acc-full [95% CI]':>19} {'fact':>6} "
             f"{'base/grp':>9} {'vs full':>8} {'spec/grp':>9} {'spec alone':>10} {'cost':>6}"]
    for key in sorted(qs, key=lambda k: (k[0], k[1], ("full", *RULES).index(k[2]))):
        q, keep, rule = key
        base, full = [r["base_tokens"] for r in gs[key]], [r["base_tokens"] for r in gs[q, 1.0, "full"]]
        spec = [r["spec_tokens"] for r in gs[key]]
        cost = "-" if ratio is None else f"{(sum(base) + ratio * sum(spec)) / sum(full):.3f}"
        lines.append(f"{q:>3} {keep:>5.2f} {rule:<6} {len(qs[key]):>4} {mean(r['acc'] for r in qs[key]):>6.3f} "
                     f"{paired(qs[key], full_acc):>19} {mean(r['fact'] for r in qs[key]):>6.3f} {mean(base):>9.0f} "
                     f"{sum(base) / sum(full):>8.3f} {mean(spec):>9.0f} "
                     f"{mean(r['spec_tokens_alone'] for r in gs[key]):>10.0f} {cost:>6}")
    return "\n".join(lines)


def flops_ratio(model: str, path: Path, speculator: str, score, n: int) -> float | None:
    """A speculator token's FLOPs over a base token's, for n-token prompts (None: no config.json to count with)."""
    pair = shapes(path, speculator, None)
    return None if pair is None else speculator_flops(pair[1], n, score) / prefill_flops(pair[0], n)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default=None, help="default: as spcli run picks for the device")
    ap.add_argument("--docs", type=int, default=1)
    ap.add_argument("--first-doc", type=int, default=0, help="the first document's index (runs of other documents "
                                                             "join with --from)")
    ap.add_argument("--facts", type=int, default=10, help="facts per document: the most questions a group asks")
    ap.add_argument("--sizes", default="1,4,10", help="questions per group (Q), each at most --facts")
    ap.add_argument("--doc-tokens", type=int, default=1150, help="essay text per document, its facts included")
    ap.add_argument("--keeps", default="0.1,0.3")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--top-up", type=int, default=32, help="c+top: tokens each question adds to the shared set")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--no-answers", action="store_true", help="kept sets and facts only: no base pass")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="a folder for rows.jsonl, groups.jsonl and table.txt")
    ap.add_argument("--from", dest="joined", default=None, help="DIR,DIR...: no run; the table of earlier runs' --out "
                                                                 "folders together")
    args = ap.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    keeps = [float(k) for k in args.keeps.split(",")]
    rules = [r for r in args.rules.split(",") if r]
    if not set(rules) <= set(RULES) or max(sizes) > args.facts:
        ap.error(f"--rules takes {', '.join(RULES)}; --sizes at most --facts ({args.facts})")
    path = locate(args.model)
    speculator = default_speculator(args.model)
    cfg = RunConfig(inputs=("-",), out="-", model=args.model, select=SelectConfig(max_prune_cost=float("inf")))
    cfg = resolve(cfg, cfg.model, path, speculator)
    t0 = time.perf_counter()
    if args.joined:
        folders = [Path(f) for f in args.joined.split(",")]
        q_rows = [json.loads(line) for f in folders for line in (f / "rows.jsonl").read_text().splitlines()]
        g_rows = [json.loads(line) for f in folders for line in (f / "groups.jsonl").read_text().splitlines()]
        head = f"# benches/shared_docs_rules.py --from {args.joined}"
    else:
        stack = load_stack(args.model, dtype=args.dtype, device="cpu", path=path)
        log = lambda text: print(text, file=sys.stderr, flush=True)
        q_rows, g_rows = [], []
        for doc in documents(stack.tokenizer, args.docs, args.facts, args.doc_tokens, args.seed, args.max_tokens,
                             args.first_doc):
            q, g = run_doc(stack, cfg, doc, sizes, keeps, rules, args.top_up, not args.no_answers, log)
            q_rows += q
            g_rows += g
        head = (f"# benches/shared_docs_rules.py --docs {args.docs} --first-doc {args.first_doc} --facts {args.facts} "
                f"--sizes {args.sizes} --doc-tokens {args.doc_tokens} --keeps {args.keeps} --rules {','.join(rules)} "
                f"--top-up {args.top_up} --max-tokens {args.max_tokens}{' --no-answers' if args.no_answers else ''} "
                f"--seed {args.seed}\n# {args.model}, speculator {speculator}, {stack.dtype}, {time.perf_counter() - t0:.0f} s")
    n = round(mean(r["spec_tokens_alone"] / r["Q"] for r in g_rows))  # a prompt's mean length
    ratio = flops_ratio(args.model, path, speculator, cfg.score, n)
    head += (f"\n# {cfg.score}\n# cost: (base + {ratio or float('nan'):.3f} x spec) / full's base tokens (a speculator "
             f"token's FLOPs over a base token's, at the mean prompt length {n})")
    text = head + "\n" + table(q_rows, g_rows, ratio)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if not args.joined:
            (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in q_rows))
            (out / "groups.jsonl").write_text("".join(json.dumps(r) + "\n" for r in g_rows))
        (out / "table.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
