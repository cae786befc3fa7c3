"""Which dtype each engine should run on this CPU: prefill time per prompt in float32 and bfloat16, per engine.

    .venv-vllm/bin/python benches/dtype.py [--model smollm2-135m] [--length 1536] [--repeats 3] [--rounds 2]
        [--engines hf,vllm] [--dtypes float32,bfloat16] [--cpus native,no-amx] [--out docs/results/dtype-NAME.json]

One child process per (round, cpu, engine, dtype), so each loads its model once, in the order
round > cpu > engine > dtype (the dtypes alternate: a busy spell on a shared machine hits both):

    hf    spcli's own transformers stages: the base's full prefill (`run_full`, 1 token out) and the
          speculator pass (`prune`, the model's default speculator, e.g. `self` with early exit)
    vllm  plain vLLM `LLM.generate` of the token ids, 1 token out, the base's engine settings as
          `spcli run --engine vllm` makes them, every CPU bound (benches/job.py plain_llm_kwargs)

Seconds per prompt: every timed repetition of every round (after one warm-up per child); the table
gives the median and the range. `--cpus` runs the same machine as another CPU where its features allow:

    native      as it is
    no-amx      an AVX512-BF16 CPU without AMX (AMD Zen 4/5, Intel Cooper Lake): oneDNN capped at
                AVX512_CORE_BF16 (ONEDNN_MAX_CPU_ISA) and torch's AMX probe answering False, which vLLM's
                CPU attention and spcli.models.dtype read (VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps vLLM's engine in
                the process that patched it); Zen 4's 256-bit datapath is not emulated
    avx2        oneDNN capped at AVX2 and torch's kernels at ATEN_CPU_CAPABILITY=avx2, AMX probe False
                (hf only: torch still believes the CPU has AVX512 when it picks its bf16 gemm)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CPUS = {
    "native": {},
    "no-amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "SPCLI_BENCH_NO_AMX": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "SPCLI_BENCH_NO_AMX": "1",
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
}


def _no_amx() -> None:
    """Torch's AMX probe answers False in this process (the `no-amx` and `avx2` CPUs)."""
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False


def child_hf(model: str, dtype: str, length: int, batch: int, repeats: int) -> dict:
    import torch

    from spcli.benchmark.stages import make_prompts, run_full, run_spec
    from spcli.config.run import RunConfig
    from spcli.config.scoring import SelectConfig
    from spcli.models import load
    from spcli.models.profiles import resolve

    stack = load.load_stack(model, None, dtype, "cpu")
    cfg = resolve(RunConfig(inputs=("-",), out="-", model=model, dtype=dtype, select=SelectConfig(keep=0.1)),
                  model, stack.path, stack.speculator_name)
    prompts = make_prompts(stack.tokenizer, length, batch, seed=0)
    prefill, speculator = [], []
    for rep in range(1 + repeats):
        full = run_full(stack, prompts, 1)
        spec = run_spec(stack, prompts, 0.1, cfg.select, cfg.score, 1, cfg.speculator_chunk)
        if rep:  # the first is a warm-up
            prefill.append(full.prefill_s / batch)
            speculator.append(spec.speculate_s / batch)
    return {"prefill_s": prefill, "speculator_s": speculator, "threads": torch.get_num_threads(),
            "speculator": stack.speculator_name}


def child_vllm(model: str, dtype: str, length: int, batch: int, repeats: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from job import bind_cpus, plain_llm_kwargs  # noqa: E402  (the plain vLLM of the job bench)

    bind_cpus()
    from vllm import LLM, SamplingParams, TokensPrompt

    from spcli.models import lookup
    from spcli.benchmark.stages import make_prompts
    from spcli.models.files import load_tokenizer

    path = lookup.locate(model)
    llm = LLM(**plain_llm_kwargs(model, path, dtype))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in make_prompts(load_tokenizer(path), length, batch, seed=0)]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prefill = []
    for rep in range(1 + repeats):
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        if rep:
            prefill.append((time.perf_counter() - t0) / batch)
    return {"prefill_s": prefill, "dtype_run": str(llm.llm_engine.model_config.dtype).removeprefix("torch.")}


def run_child(engine: str, dtype: str, cpu: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--model", args.model, "--length", str(args.length),
           "--batch", str(args.batch), "--repeats", str(args.repeats), "--dtypes", dtype]
    env = {**os.environ, **CPUS[cpu], "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"{engine} {dtype} on {cpu} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (cpu, engine, stage, dtype) with the spread of seconds per prompt, and bf16 / f32."""
    rows = {}
    for r in runs:
        for stage in ("prefill_s", "speculator_s"):
            if stage in r["result"]:
                key = (r["cpu"], r["engine"], stage.removesuffix("_s"), r["dtype"])
                rows.setdefault(key, []).extend(r["result"][stage])
    out = [{"cpu": c, "engine": e, "stage": s, "dtype": d, **spread(v)} for (c, e, s, d), v in rows.items()]
    for row in out:
        f32 = rows.get((row["cpu"], row["engine"], row["stage"], "float32"))
        row["vs_float32"] = row["median"] / statistics.median(f32) if f32 else None
    return out


def table(rows: list[dict]) -> str:
    lines = ["| CPU | engine | stage | dtype | s/prompt median | min - max | n | vs float32 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = f"{r['vs_float32']:.2f}x" if r["vs_float32"] is not None else "-"
        lines.append(f"| {r['cpu']} | {r['engine']} | {r['stage']} | {r['dtype']} | {r['median']:.3f} | "
                     f"{r['min']:.3f} - {r['max']:.3f} | {r['n']} | {vs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=1536)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cpus", default="native", help=f"comma list of {', '.join(CPUS)}")
    ap.add_argument("--out", default=None, help="a JSON file for the runs and the table")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        if os.environ.get("SPCLI_BENCH_NO_AMX"):
            _no_amx()
        run = child_hf if args.child == "hf" else child_vllm
        print(json.dumps(run(args.model, args.dtypes, args.length, args.batch, args.repeats)), flush=True)
        return
    from spcli.models.dtype import cpu_features

    runs = []
    for rnd in range(args.rounds):
        for cpu in args.cpus.split(","):
            for engine in args.engines.split(","):
                for dtype in args.dtypes.split(","):
                    result = run_child(engine, dtype, cpu, args)
                    runs.append({"round": rnd, "cpu": cpu, "engine": engine, "dtype": dtype, "result": result})
                    print(f"round {rnd + 1}/{args.rounds} {cpu} {engine} {dtype}: "
                          + ", ".join(f"{k} {json.dumps(v)}" for k, v in result.items()), flush=True)
    rows = summarize(runs)
    print(f"{args.model}, {args.batch} x {args.length} tokens, {args.rounds} rounds x {args.repeats} repeats, "
          f"this CPU: {', '.join(cpu_features()) or 'none of AMX, AVX512-BF16, AVX2'}, "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(table(rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
