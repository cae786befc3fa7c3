"""How much of the keep budget the speculator spends on the chat template's own text.

SmolLM2's template injects a system prompt ("You are a helpful AI assistant named SmolLM, trained by
Hugging Face") before the user's message. Forced tokens (keep_first, keep_last) already cover the
first 4 and the last 64; this counts, per chat record, the kept tokens that are template text outside
the forced set, as a share of the budget left after the forced set. A small share means forcing the
template outside the budget would give the user's content almost nothing more.

    PYTHONPATH=$PWD .venv/bin/python benches/template_share.py [--keep 0.1] [INPUT.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses

from spcli.config.run import RunConfig

from spcli.config.scoring import SelectConfig
from spcli.models.load import load_stack
from spcli.stages.prepare import prepare
from spcli.stages.select import forced_mask
from spcli.io.read import read_records
from spcli.io.shards import discover
from spcli.models.profiles import resolve


def template_mask(ids: list[int], tokenizer) -> list[bool]:
    """True for tokens of the template: everything up to the user's content (after `<|im_start|>user\\n`)
    and the closing `<|im_end|>\\n<|im_start|>assistant\\n`."""
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    starts = [i for i, t in enumerate(ids) if t == im_start]
    head_end = starts[1] + 3 if len(starts) > 1 else 0  # "<|im_start|>", "user", "\n"
    tail_start = starts[-1] - 2 if len(starts) > 2 else len(ids)  # "<|im_end|>", "\n" before the assistant's
    return [i < head_end or i >= tail_start for i in range(len(ids))]


@dataclasses.dataclass
class Totals:
    free: int = 0  # kept by importance (not forced)
    template: int = 0  # of them, template text
    template_n: int = 0  # template tokens outside the forced set
    n: int = 0  # prompt tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="*", default=["examples/docs.jsonl"])
    ap.add_argument("--keep", type=float, default=0.1)
    args = ap.parse_args()
    stack = load_stack("smollm2-135m", dtype="float32", device="cpu")
    cfg = RunConfig(inputs=tuple(args.inputs), out="/tmp/unused", select=SelectConfig(keep=args.keep))
    cfg = resolve(cfg, cfg.model, stack.path, stack.speculator_name)
    records = [r for s in discover(args.inputs) for r in read_records(s, cfg.fields) if r.messages and r.error is None]
    totals = Totals()
    for rec, req in zip(records, prepare(records, cfg, stack)):
        ids = list(req.token_ids)
        template = template_mask(ids, stack.tokenizer)
        forced = forced_mask(len(ids), cfg.select).tolist()
        kept = set(req.kept.tolist())
        free = [i for i in kept if not forced[i]]  # chosen by importance, not forced
        spent = sum(template[i] for i in free)
        outside = sum(t and not f for t, f in zip(template, forced))
        print(f"{rec.id}: {len(ids)} tokens, {sum(template)} template ({outside} outside the forced set), "
              f"{len(free)} kept by importance, {spent} of them template ({100 * spent / max(len(free), 1):.1f}%)")
        totals.free += len(free)
        totals.template += spent
        totals.template_n += outside
        totals.n += len(ids)
    print(f"keep {args.keep}: {totals.template} of {totals.free} importance-chosen tokens are template text "
          f"({100 * totals.template / max(totals.free, 1):.1f}% of the budget after the forced set); the template "
          f"outside the forced set is {totals.template_n} of {totals.n} prompt tokens "
          f"({100 * totals.template_n / max(totals.n, 1):.1f}%)")


if __name__ == "__main__":
    main()
