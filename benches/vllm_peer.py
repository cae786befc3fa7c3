"""The peer a user would pick instead: plain vLLM full prefill against `spcli run --engine vllm --keep 0.1`.

    .venv-vllm/bin/python benches/vllm_peer.py [--n 2048] [--batch 4] [--keep 0.1] [--repeats 3] [--dtype auto]
        [--model M] [--speculator S] [--placements workers,driver] [--tp N] [--load-format dummy]

Same SmolLM2-135M-Instruct prompts (essay windows, as `spcli bench` makes them), one vLLM engine in
one process. Per repetition, alternating:

    full   plain vLLM requests of all n tokens, max_tokens 1 (spcli sends unpruned requests plain)
    spcli  the engine's own stages: `prune` (speculator = the model's default, e.g. `self` with early
           exit: its first layers in transformers) -> selection -> vLLM prefill of the kept tokens,
           once per --placements entry: `workers` (a replica in vLLM's workers, the default placement)
           and `driver` (the same speculator in this process, on the first GPU or the CPU)

TTFT = wall time from the token ids to every prompt's first token (speculator included); the ratio
is the median over repetitions of full / spcli.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    ap.add_argument("--dtype", default="auto", help="auto: as spcli run picks it (float32 on a CPU without AMX)")
    ap.add_argument("--speculator", default=None, help="default: the model's")
    ap.add_argument("--placements", default="workers", help="comma list of workers, driver")
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--load-format", default=None, help="vLLM's load_format, e.g. dummy (random base weights)")
    args = ap.parse_args(argv)
    placements = args.placements.split(",")

    import torch

    from spcli.benchmark.stages import make_prompts
    from spcli.config.run import RunConfig, VllmConfig
    from spcli.config.scoring import SelectConfig
    from spcli.models.device import pick_device
    from spcli.models import load
    from spcli.stages.prepare import prune
    from spcli.stages.request import PrunedRequest
    from spcli.engines.vllm.driver.args import cpu_env_defaults
    from spcli.engines.vllm.driver.engine import VllmEngine
    from spcli.models.profiles import resolve

    for key, value in cpu_env_defaults(args.tp or 1).items():
        os.environ.setdefault(key, value)
    cfg = RunConfig(inputs=("-",), out="-", model=args.model, speculator=args.speculator, engine="vllm",
                    dtype=args.dtype, select=SelectConfig(keep=args.keep, min_tokens=0), vllm=VllmConfig(tp=args.tp, max_model_len=args.max_model_len))
    stack = load.load_stack(args.model, args.speculator, args.dtype, "cpu", with_base=False, needs_speculator=False)
    cfg = resolve(cfg, args.model, stack.path, stack.speculator_name)
    if args.load_format:
        import spcli.engines.vllm.driver.base_pass as vllm_pass

        config = vllm_pass.VllmRunnerConfig
        vllm_pass.VllmRunnerConfig = lambda **kw: config(
            **{**kw, "engine_kwargs": {**kw.get("engine_kwargs", {}), "load_format": args.load_format}})
    engine = VllmEngine(cfg)
    stacks = {"workers": engine.stack, "driver": dataclasses.replace(engine.stack, speculate_remote=None,
                                                                      device=pick_device("auto"))}
    prompts = make_prompts(engine.stack.tokenizer, args.n, args.batch, seed=0)

    def requests(keep: float) -> list[PrunedRequest]:
        return [PrunedRequest(f"p{i}", p, torch.arange(len(p)), 1, keep=keep) for i, p in enumerate(prompts)]

    def full() -> float:
        t0 = time.perf_counter()
        engine.generate(requests(1.0))
        return time.perf_counter() - t0

    def spcli(placement: str) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        pruned = prune(requests(args.keep), cfg.select, cfg.score, stacks[placement])
        t1 = time.perf_counter()
        engine.generate(pruned)
        return time.perf_counter() - t0, t1 - t0, sum(int(r.kept.numel()) for r in pruned)

    full(), [spcli(p) for p in placements]  # warm-up: one-time costs (speculator loads, first kernels)
    runs = [(full(), {p: spcli(p) for p in placements}) for _ in range(args.repeats)]
    full_s = statistics.median(f for f, _ in runs)
    load_avg = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    from vllm.platforms import current_platform

    print(f"vLLM ({'CPU build' if current_platform.is_cpu() else 'CUDA'}), "
          f"{args.model} ({engine.stack.dtype}), batch {args.batch} x n={args.n}, keep {args.keep}, "
          f"speculator {engine.stack.speculator_name} (window {cfg.score.window}, look-ahead {cfg.score.lookahead}, "
          f"layers {cfg.score.score_layers}); median of {args.repeats}; load average {load_avg}")
    print(f"{'placement':<10} {'full s':>8} {'spcli s':>8} {'of it speculator s':>19} {'kept':>6} {'TTFT ratio':>11}")
    for p in placements:
        spcli_s = statistics.median(r[p][0] for _, r in runs)
        spec_s = statistics.median(r[p][1] for _, r in runs)
        ratio = statistics.median(f / r[p][0] for f, r in runs)
        print(f"{p:<10} {full_s:>8.3f} {spcli_s:>8.3f} {spec_s:>19.3f} {runs[0][1][p][2]:>6d} {ratio:>10.2f}x")
    if len(placements) == 2:
        ratio = statistics.median(r["driver"][0] / r["workers"][0] for _, r in runs)
        print(f"workers vs driver TTFT ratio: {ratio:.2f}x")
    engine.close()


if __name__ == "__main__":
    main()
