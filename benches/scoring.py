"""Scoring speed and memory: the Triton kernel vs the streaming reference vs the materialising naive path.

    python benches/scoring.py                                  # here: CPU, reference and naive at n=1024
    python benches/scoring.py --lengths 4096,16384,32768       # on a GPU: all three

Default shape: the speculator of Llama-3.1-8B (32 layers, 32 heads, 8 KV heads, D=128) scoring with
a W=32 observation window (row of prompt position t sees keys 0..t) plus 8 look-ahead rows (all n
keys), 40 query rows; keys as bf16 views into per-layer KV caches. --window 1 --lookahead 8 is the
paper's 9 rows. Peak memory is measured with
torch.cuda.max_memory_allocated on CUDA (bytes above the inputs); on CPU it is the analytical size of
the largest intermediate tensor, since no allocator statistic sees torch's CPU tensors reliably.
The bandwidth bound is the time to read every key once at --bandwidth-gbs.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from spcli.kernels import score

MiB = 2**20


def num_rows(args) -> int:
    return max(1, args.window) + args.lookahead


def make_inputs(args, n: int, device: torch.device, dtype: torch.dtype):
    """queries [L, H, S, D], keys L x [KVH, n, D] (cache views), row_limits int32 [S]."""
    gen = torch.Generator().manual_seed(0)
    shape = (args.layers, args.heads, num_rows(args), args.head_dim)
    queries = torch.randn(shape, generator=gen).to(device, dtype)
    caches = [torch.randn(1, args.kv_heads, n + args.lookahead, args.head_dim, generator=gen).to(device, dtype)
              for _ in range(args.layers)]  # per layer [1, KVH, n + look-ahead, D], as a DynamicCache holds them
    window = min(max(1, args.window), n)
    limits = torch.tensor([*range(n - window + 1, n + 1), *[n] * args.lookahead], dtype=torch.int32, device=device)
    return queries, [c[0, :, :n, :] for c in caches], limits


def largest_intermediate(impl: str, args, n: int) -> int:
    """Bytes of the largest tensor each path allocates (fp32), for CPU where nothing measures it."""
    rows = num_rows(args)
    per_layer = max(args.heads * rows * n, args.kv_heads * n * args.head_dim) * 4  # [H, S, n] or K.float()
    if impl == "naive":
        return args.layers * args.heads * rows * n * 4  # [L, H, S, n]
    if impl == "reference":
        return per_layer
    return rows * n * 4  # kernel: the running max [S, n]


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
    p.add_argument("--lengths", default="4096,16384,32768" if on_cuda else "1024",
                   help="prompt lengths n, comma separated (default: 4k,16k,32k on CUDA, 1k on CPU)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=32, help="observation-window rows, causally limited (1: last token)")
    p.add_argument("--lookahead", type=int, default=8, help="look-ahead rows, which see all n keys")
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
        "kernel": lambda q, k, lim: score.token_importance(q, k, pool=args.pool, impl="triton", row_limits=lim),
        "reference": lambda q, k, lim: score.importance_reference(q, k, args.pool, lim),
        "naive": lambda q, k, lim: score.importance_naive(q, k, args.pool, lim),
    }
    peak_kind = "measured, above inputs" if on_cuda else "analytical: largest intermediate"
    name = torch.cuda.get_device_name() if on_cuda else "cpu"
    print(f"device {name}{' (Triton interpreter)' if score.IS_INTERPRETED else ''}; L={args.layers} H={args.heads} "
          f"KVH={args.kv_heads} D={args.head_dim} S={num_rows(args)} (W={args.window} + {args.lookahead}) "
          f"pool={args.pool} {args.dtype}; peak MiB: {peak_kind}")
    header = (f"{'n':>6} {'impl':>9} {'ms':>10} {'peak MiB':>10} {'t/kernel':>9} {'max rel err':>11} "
              f"{'bound ms':>9} {'x bound':>8}")
    print(header)
    print("-" * len(header))
    for n in [int(x) for x in args.lengths.split(",")]:
        queries, keys, limits = make_inputs(args, n, device, dtype)
        key_bytes = sum(k.numel() * k.element_size() for k in keys)
        bound_ms = key_bytes / (args.bandwidth_gbs * 1e9) * 1e3  # every key read once
        results = {}
        for impl in impls:
            try:
                ms, peak, out = timed(functools.partial(run[impl], queries, keys, limits), device, args.repeats)
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
        del queries, keys, limits, results
        if on_cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
