"""The peer a user would pick instead: plain vLLM full prefill against `spcli run --engine vllm --keep 0.1`.

    .venv-vllm/bin/python benches/vllm_peer.py [--n 2048] [--batch 4] [--keep 0.1] [--repeats 3]

Same SmolLM2-135M-Instruct prompts (essay windows, as `spcli bench` makes them), one vLLM engine in
one process. Per repetition, alternating:

    full   plain vLLM requests of all n tokens, max_tokens 1 (spcli sends unpruned requests plain)
    spcli  the engine's own stages: `prune` (speculator = the model's default, e.g. `self` with early
           exit: its first layers in transformers) -> selection -> vLLM prefill of the kept tokens

TTFT = wall time from the token ids to every prompt's first token (speculator included); the ratio
is the median over repetitions of full / spcli.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--keep", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)

    import torch

    from spcli.benchmark.stages import make_prompts
    from spcli.config import RunConfig, SelectConfig
    from spcli.engine import load
    from spcli.engine.prepare import prune
    from spcli.engine.request import PrunedRequest
    from spcli.engine.vllm_args import cpu_env_defaults
    from spcli.engine.vllm_engine import VllmEngine
    from spcli.profiles import resolve

    for key, value in cpu_env_defaults(1).items():
        os.environ.setdefault(key, value)
    cfg = RunConfig(inputs=("-",), out="-", model=args.model, engine="vllm", dtype=args.dtype,
                    select=SelectConfig(keep=args.keep, min_tokens=0))
    stack = load.load_stack(args.model, None, args.dtype, "cpu", with_base=False, needs_speculator=False)
    cfg = resolve(cfg, args.model, stack.path, stack.speculator_name)
    engine = VllmEngine(cfg)
    prompts = make_prompts(engine.stack.tokenizer, args.n, args.batch, seed=0)

    def requests(keep: float) -> list[PrunedRequest]:
        return [PrunedRequest(f"p{i}", p, torch.arange(len(p)), 1, keep=keep) for i, p in enumerate(prompts)]

    def full() -> float:
        t0 = time.perf_counter()
        engine.generate(requests(1.0))
        return time.perf_counter() - t0

    def spcli() -> tuple[float, float, int]:
        t0 = time.perf_counter()
        pruned = prune(requests(args.keep), cfg.select, cfg.score, engine.stack)
        t1 = time.perf_counter()
        engine.generate(pruned)
        return time.perf_counter() - t0, t1 - t0, sum(int(r.kept.numel()) for r in pruned)

    full(), spcli()  # warm-up: one-time costs (speculator load, first kernels)
    pairs = [(full(), spcli()) for _ in range(args.repeats)]
    full_s = statistics.median(f for f, _ in pairs)
    spcli_s = statistics.median(s[0] for _, s in pairs)
    spec_s = statistics.median(s[1] for _, s in pairs)
    kept = pairs[0][1][2]
    ratio = statistics.median(f / s[0] for f, s in pairs)
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"vLLM CPU build, {args.model} ({args.dtype}), batch {args.batch} x n={args.n}, keep {args.keep}, "
          f"speculator {engine.stack.speculator_name} (window {cfg.score.window}, look-ahead {cfg.score.lookahead}, "
          f"layers {cfg.score.score_layers}); median of {args.repeats}; load average {load_avg}")
    print(f"{'full s':>8} {'spcli s':>8} {'of it speculator s':>19} {'kept':>6} {'TTFT ratio':>11}")
    print(f"{full_s:>8.3f} {spcli_s:>8.3f} {spec_s:>19.3f} {kept:>6d} {ratio:>10.2f}x")
    engine.close()


if __name__ == "__main__":
    main()
