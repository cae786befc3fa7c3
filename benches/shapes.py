"""Issue 38's three shapes in one run, each against full prefill and plain vLLM on the same machine and inputs.

    .venv-vllm/bin/python benches/shapes.py [--shapes ttft,job,summaries] [--pair qwen2.5-coder-1.5b]
        [--embedded smollm2-135m] [--n-ttft 12] [--n-job 48] [--n-summaries 16] [--out docs/results/shapes]

    ttft       the pair at batch 1 on ~1.8k-token needle prompts (benches/stage_profile.py --engine vllm): each
               stage of `spcli run` timed on a started vLLM engine, against the same engine's full prefill of
               the same prompt (an unpruned request runs as plain vLLM runs it); targets: >= 4.5x, same answers
    job        the embedded model's whole job, N x ~1.5k prompts, 24 tokens out (benches/job.py): plain vLLM,
               spcli on each engine; target: >= 1.3x plain vLLM, answers within 2
    summaries  the pair summarising essay windows of 1-1.7k tokens on the hf engine (benches/summaries.py): keep
               0.1 and 0.3 against full prefill; targets: keep 0.3 never slower, keep 0.1 >= 3x, ROUGE-L close

Each shape runs as its own process, one after the other (they would share the cores); their tables are printed
and, with --out, written to one shapes.md beside each bench's own files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def commands(args) -> dict[str, list[str]]:
    out = (lambda name: ["--out", str(Path(args.out) / name)]) if args.out else (lambda name: [])
    py = [sys.executable]
    return {
        "ttft": [*py, str(HERE / "stage_profile.py"), "--model", args.pair, "--engine", "vllm", "--n", str(args.n_ttft),
                 "--length", "1800", "--keep", "0.1", "--variants", "now"]
        + (["--out", str(Path(args.out) / "ttft.md")] if args.out else []),
        "job": [*py, str(HERE / "job.py"), "--model", args.embedded, "--n", str(args.n_job), "--length", "1536",
                "--max-tokens", "24", "--keep", "0.1", "--engines", "vllm,hf", *out("job")],
        "summaries": [*py, str(HERE / "summaries.py"), "--model", args.pair, "--n", str(args.n_summaries),
                      "--keeps", "0.1,0.3", *out("summaries")],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="ttft,job,summaries")
    ap.add_argument("--pair", default="qwen2.5-coder-1.5b", help="the base whose preset speculator is the pair")
    ap.add_argument("--embedded", default="smollm2-135m")
    ap.add_argument("--n-ttft", type=int, default=12)
    ap.add_argument("--n-job", type=int, default=48)
    ap.add_argument("--n-summaries", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    cmds = commands(args)
    for shape in args.shapes.split(","):
        print(f"## {shape}\n\n    {' '.join(cmds[shape])}\n", flush=True)
        subprocess.run(cmds[shape], check=True)


if __name__ == "__main__":
    main()
