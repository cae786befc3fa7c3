"""The mixed set issue 20 tried `--keep auto` on, as JSONL records for `spcli run`: 4 single-needle prompts and
2 essays to summarise, ~1.2k tokens (~950 words) each, seeded.

    PYTHONPATH=$PWD .venv/bin/python benches/keep_auto_mixed.py --out /tmp/mixed.jsonl
    spcli run /tmp/mixed.jsonl --out /tmp/mixed-out --keep auto --max-tokens 16 && spcli inspect /tmp/mixed-out

The rows' keep_rate is what keep auto chose per prompt: the essays should get more than the needles.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spcli.models import lookup
from spcli.models.files import load_tokenizer
from spcli.evaluate.tasks import generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keep_auto_spread import summaries  # noqa: E402  (the essays of the spread bench)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer sizes the prompts")
    ap.add_argument("--length", type=int, default=1200)
    ap.add_argument("--needles", type=int, default=4)
    ap.add_argument("--essays", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tokenizer = load_tokenizer(lookup.locate(args.model))
    rows = [{"id": ex.id, "messages": ex.messages} for ex in generate("niah", tokenizer, args.length, args.needles, args.seed)]
    rows += [{"id": f"summarise-{i}", "messages": m} for i, m in enumerate(summaries(tokenizer, args.length, args.essays, args.seed))]
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} records to {args.out}")


if __name__ == "__main__":
    main()
