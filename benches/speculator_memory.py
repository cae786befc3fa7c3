"""Speculator peak memory against prompt length, prefilled in chunks vs in one call, one run.

A random Llama-3.1-8B-shaped speculator at small width (32 layers, 32 heads, 8 KV heads as the 8B;
head dim 16 instead of 128, hidden 512, MLP 1792; float32, or --dtype bfloat16 where the CPU has
fast bf16 matmuls) runs `speculate_batch` on one prompt of n
tokens with early exit at layer 13 and window 32 (no look-ahead), each (n, chunk) in a fresh
process. Printed per row:

    prefill    the process's peak RSS growth over the loaded model (ru_maxrss) when scoring starts:
               the prefill's worst moment
    KV         the most the DynamicCache held (keys + values of layers 0..13), read from its tensors
               after every update: n x 2 x 14 x KVH x D x dtype bytes, which grows with n by design
    rest       prefill - KV: activations, the attention masks, sdpa's work space, the query rows
    mask       computed, not measured: the most mask a prefill call holds. A later chunk's mask over its
               prefix is built a block of query rows at a time (`capture.RowBlocks`), min(chunk,
               block_rows) x n booleans, at most MASK_ELEMENTS (16 MiB), with sdpa's additive float copy
               of that block (4x) during attention only; none in one call of one prompt (sdpa's is_causal)
    rest/1st   (rest - mask) over the first row's of the same kind (at --chunk / in one call)
    peak       the whole pass's peak RSS growth, scoring included (the torch reference: one layer's
               [H, S, n] fp32 softmax and its pooled copy, which grow with n)

    .venv/bin/python benches/speculator_memory.py                          # quick: n = 256..1024, chunk 128
    .venv/bin/python benches/speculator_memory.py --lengths 8192,16384,32768,65536 --chunk 8192 \
        --heads 4 --kv-heads 1 --layer 1 --one-call-max 16384 [--mmap-threshold 131072]   # the sweep in docs/results.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

SHAPE = dict(vocab_size=1024, hidden_size=512, intermediate_size=1792, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, head_dim=16, max_position_embeddings=131072)
SCORE = dict(lookahead=0, window=32, score_layers="13", pool=13, rows="mean", impl="torch")


def child(n: int, chunk: int, shape: dict, layer: int, dtype: str) -> dict:
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    import spcli.stages.speculate as speculate
    from spcli.config.scoring import ScoreConfig
    from spcli.models import capture

    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, dtype))  # built in its dtype: no fp32 copy raises the baseline peak
    model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation=capture.register())).eval()
    torch.set_default_dtype(torch.float32)
    kv = {"max": 0}

    class Measured(DynamicCache):  # the pass's own cache, measured from its tensors after each update
        def update(self, *args, **kwargs):
            out = super().update(*args, **kwargs)
            held = sum(t.untyped_storage().nbytes() for layer in self.layers if getattr(layer, "keys", None) is not None
                       for t in (layer.keys, layer.values))
            kv["max"] = max(kv["max"], held)
            return out

    real = speculate.token_importance

    def scoring(*args, **kwargs):  # called once the prefill is done: the peak so far is the prefill's
        kv.setdefault("prefill", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        return real(*args, **kwargs)

    speculate.DynamicCache, speculate.token_importance = Measured, scoring
    prompt = [3 + i % 1000 for i in range(n)]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    speculate.speculate_batch(model, [prompt], ScoreConfig(**{**SCORE, "score_layers": str(layer)}), eos_ids=set(),
                              device=torch.device("cpu"), chunk=chunk)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"n": n, "chunk": chunk, "prefill_mib": (kv["prefill"] - base) / 1024, "peak_mib": (peak - base) / 1024,
            "kv_mib": kv["max"] / 2**20}


def run_one(n: int, chunk: int, shape: dict, layer: int, dtype: str, mmap_threshold: int | None) -> dict | str:
    env = {**os.environ, **({"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)} if mmap_threshold else {})}
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps([n, chunk, shape, layer, dtype])],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="256,512,1024", help="prompt lengths n, comma-separated")
    ap.add_argument("--chunk", type=int, default=128, help="speculator chunk (--speculator-chunk)")
    ap.add_argument("--one-call-max", type=int, default=32768,
                    help="one-call rows (chunk = n) only up to this n: their n x n mask would not fit beyond")
    ap.add_argument("--heads", type=int, default=SHAPE["num_attention_heads"], help="query heads (8B: 32)")
    ap.add_argument("--kv-heads", type=int, default=SHAPE["num_key_value_heads"], help="KV heads (8B: 8)")
    ap.add_argument("--layer", type=int, default=int(SCORE["score_layers"]), help="the scored layer (early exit)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="float32 by default: bf16 matmuls are ~8x slower on CPUs without AMX")
    ap.add_argument("--mmap-threshold", type=int, default=None,
                    help="glibc's MALLOC_MMAP_THRESHOLD_ for each child (e.g. 131072): freed large buffers go back to "
                         "the OS at once, so RSS shows what is held, not heap left by growing buffers")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from spcli.models.capture import block_rows

    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return
    shape = {**SHAPE, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads}
    threshold = f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}" if args.mmap_threshold else "glibc's dynamic mmap threshold"
    print(f"speculator ({args.dtype}): {shape}; {dict(SCORE, score_layers=str(args.layer))}; {threshold}")
    print(f"{'n':>6} {'chunk':>6} {'prefill':>8} {'KV':>7} {'rest':>7} {'mask':>6} {'rest/1st':>8} {'peak':>7}   (MiB)")
    first: dict[str, float] = {}
    for n in map(int, args.lengths.split(",")):
        for chunk in (args.chunk, *((n,) if args.chunk < n <= args.one_call_max else ())):
            label = f"chunk {args.chunk}" if chunk == args.chunk else "one call"
            r = run_one(n, chunk, shape, args.layer, args.dtype, args.mmap_threshold)
            if isinstance(r, str):
                print(f"{n:>6} {chunk:>6} failed: {r}", flush=True)
                continue
            rest = r["prefill_mib"] - r["kv_mib"]
            mask = 0.0 if chunk >= n else min(chunk, block_rows(1, n)) * n / 2**20
            ratio = (rest - mask) / first.setdefault(label, rest - mask)
            print(f"{n:>6} {chunk:>6} {r['prefill_mib']:8.1f} {r['kv_mib']:7.1f} {rest:7.1f} {mask:6.1f} {ratio:8.2f} "
                  f"{r['peak_mib']:7.1f}   {label}", flush=True)


if __name__ == "__main__":
    main()
