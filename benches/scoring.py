"""Scoring speed and memory: the Triton kernel vs the streaming reference vs the materialising naive path.

    python benches/scoring.py                                  # here: CPU, reference and naive at n=4096
    python benches/scoring.py --lengths 4096,16384,32768       # on a GPU: all three

Default shape: the speculator of Llama-3.1-8B (32 layers, 32 heads, 8 KV heads, D=128, 1 + 8
look-ahead = 9 query rows), keys as bf16 views into per-layer KV caches. Peak memory is measured with
torch.cuda.max_memory_allocated on CUDA (bytes above the inputs); on CPU it is the analytical size of
the largest intermediate tensor, since no allocator statistic sees torch's CPU tensors reliably.
The bandwidth bound is the time to read every key once at --bandwidth-gbs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from spcli.kernels import score

MiB = 2**20


def make_inputs(args, n: int, device: torch.device, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    shape = (args.layers, args.heads, args.steps, args.head_dim)
    queries = torch.randn(shape, generator=gen).to(device, dtype)  # [L, H, S, D]
    caches = [torch.randn(1, args.kv_heads, n + args.steps, args.head_dim, generator=gen).to(device, dtype)
              for _ in range(args.layers)]  # per layer [1, KVH, n + S, D], as a DynamicCache holds them
    return queries, [c[0, :, :n, :] for c in caches]  # keys: L x [KVH, n, D] views


def largest_intermediate(impl: str, args, n: int) -> int:
    """Bytes of the largest tensor each path allocates (fp32), for CPU where nothing measures it."""
    per_layer = max(args.heads * args.steps * n, args.kv_heads * n * args.head_dim) * 4  # [H, S, n] or K.float()
    if impl == "naive":
        return args.layers * args.heads * args.steps * n * 4  # [L, H, S, n]
    if impl == "reference":
        return per_layer
    return args.steps * n * 4  # kernel: the running max [S, n]


def timed(fn, device: torch.device, repeats: int) -> tuple[float, int | None, torch.Tensor]:
    """Median milliseconds over repeats after one warm-up; CUDA: peak bytes allocated above the inputs."""
    out = fn()
    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), peak, out


def main(argv: list[str] | None = None) -> None:
    on_cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="4096,16384,32768" if on_cuda else "4096",
                   help="prompt lengths n, comma separated (default: 4k,16k,32k on CUDA, 4k on CPU)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=9, help="query rows: 1 + look-ahead")
    p.add_argument("--pool", type=int, default=13)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--impls", default="kernel,reference,naive", help="any of kernel, reference, naive")
    p.add_argument("--repeats", type=int, default=5 if on_cuda else 1)
    p.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="memory bandwidth for the bound (H200: 4800)")
    args = p.parse_args(argv)

    device = torch.device("cuda" if on_cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    impls = args.impls.split(",")
    has_kernel = score.HAS_TRITON and (on_cuda or score.IS_INTERPRETED)
    if "kernel" in impls and not has_kernel:
        impls.remove("kernel")
        print("kernel: skipped (needs triton and CUDA, or TRITON_INTERPRET=1)")
    run = {
        "kernel": lambda q, k: score.token_importance(q, k, pool=args.pool, impl="triton"),
        "reference": lambda q, k: score.importance_reference(q, k, args.pool),
        "naive": lambda q, k: score.importance_naive(q, k, args.pool),
    }
    peak_kind = "measured, above inputs" if on_cuda else "analytical: largest intermediate"
    name = torch.cuda.get_device_name() if on_cuda else "cpu"
    print(f"device {name}{' (Triton interpreter)' if score.IS_INTERPRETED else ''}; L={args.layers} H={args.heads} "
          f"KVH={args.kv_heads} D={args.head_dim} S={args.steps} pool={args.pool} {args.dtype}; peak MiB: {peak_kind}")
    header = (f"{'n':>6} {'impl':>9} {'ms':>10} {'peak MiB':>10} {'t/kernel':>9} {'max rel err':>11} "
              f"{'bound ms':>9} {'x bound':>8}")
    print(header)
    print("-" * len(header))
    for n in [int(x) for x in args.lengths.split(",")]:
        queries, keys = make_inputs(args, n, device, dtype)
        key_bytes = sum(k.numel() * k.element_size() for k in keys)
        bound_ms = key_bytes / (args.bandwidth_gbs * 1e9) * 1e3  # every key read once
        results = {}
        for impl in impls:
            try:
                ms, peak, out = timed(lambda: run[impl](queries, keys), device, args.repeats)
            except torch.OutOfMemoryError:
                print(f"{n:>6} {impl:>9} {'OOM':>10}")
                continue
            results[impl] = (ms, peak if peak is not None else largest_intermediate(impl, args, n), out.float())
        ref_out = results["reference"][2] if "reference" in results else None
        for impl, (ms, peak, out) in results.items():
            vs = f"{ms / results['kernel'][0]:.2f}x" if "kernel" in results else "-"
            err = "-" if ref_out is None else f"{((out - ref_out).abs() / ref_out.abs().clamp_min(1e-12)).max():.1e}"
            print(f"{n:>6} {impl:>9} {ms:>10.2f} {peak / MiB:>10.1f} {vs:>9} {err:>11} "
                  f"{bound_ms:>9.4f} {ms / bound_ms:>8.1f}")
        del queries, keys, results
        if on_cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
