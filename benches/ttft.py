"""TTFT of full prefill vs spcli (speculator included) at keep 0.1/0.3/0.5: ratio and its limit.

Three settings, each measured in one run on the same prompts (best of interleaved repetitions):
  smollm2-135m / self        the default: window 32, layer 14 alone, early exit (15 of 30 layers)
  smollm2-135m / self paper  the paper's recipe on the same speculator: look-ahead 8, every layer
  random-405b / random-8b    random weights, per-token cost ratio of Llama-3.1-8B : Llama-3.1-405B

    limit = 1 / (kept + speculator share)     (shares of the full-prefill TTFT)

    .venv/bin/python benches/ttft.py                  # the table in docs/results.md (minutes on 2 CPU cores)
    .venv/bin/python benches/ttft.py --quick          # seconds: the random pair at 1024 tokens, one run
"""

from __future__ import annotations

import argparse
import os
import sys

from spcli.benchmark.config import BenchConfig
from spcli.benchmark.report import write_outputs
from spcli.benchmark.run import run_bench
from spcli.config.scoring import PAPER_SCORE, ScoreConfig, SelectConfig

PAPER = ScoreConfig(**PAPER_SCORE)
SETTINGS = (("smollm2-135m", "self", ScoreConfig()), ("smollm2-135m", "self", PAPER), ("random-405b", "random-8b", ScoreConfig()))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write bench_<model>_<speculator>.json/.png here")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    settings = list(SETTINGS)
    if args.quick:
        settings, args.length, args.repeats = [SETTINGS[-1]], 1024, 1

    rows = []
    for model, speculator, score in settings:
        cfg = BenchConfig(model=model, speculator=speculator, keeps=(0.1, 0.3, 0.5), lengths=(args.length,),
                          batch=args.batch, repeats=args.repeats, select=SelectConfig(keep=1.0, min_tokens=0), score=score)
        results = run_bench(cfg, log=lambda msg: print(msg, file=sys.stderr))
        if args.out:
            write_outputs(args.out, cfg, results)
        rows += results

    print(f"TTFT, {args.length}-token prompts, batch {args.batch}, best of {args.repeats} "
          f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    head = f"{'model':<14} {'speculator':<10} {'rows':<24} {'keep':>5} {'full s':>8} {'spcli s':>8} {'ratio':>7} {'limit':>7} {'ratio/limit':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        rows_of = "W{window} L{score_layers} A{lookahead}".format(**r["score"])
        print(f"{r['model']:<14} {r['speculator']:<10} {rows_of:<24} {r['keep']:>5.2f} {r['ttft_full_s']:>8.3f} {r['ttft_spec_s']:>8.3f} "
              f"{r['speedup']:>6.2f}x {r['limit']:>6.2f}x {100 * r['efficiency']:>10.0f}%")
    return rows


if __name__ == "__main__":
    main()
