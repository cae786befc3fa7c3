"""Speculator pass memory against prompt length: the paper's recipe vs early exit, one run.

A random Llama-3.1-8B-shaped speculator at small width (32 layers, 32 heads, 8 KV heads, head dim
16; real: head dim 128) runs `speculate_batch` on one prompt of n tokens, each (mode, n) in a fresh
process. Printed per row:

    held MiB   what the pass holds when scoring starts, measured from the tensors' storages:
               query rows + keys of the scored layers (early exit), or the whole KV cache (look-ahead)
    old MiB    what the code before early exit held: the same, plus one [H, n, D] query per layer
               pinned by a view (L*H*n*D elements): computed, since that code is gone
    peak MiB   the process's peak RSS growth over the loaded model (includes sdpa's mask and
               one layer's activations)

    .venv/bin/python benches/speculator_memory.py                      # n = 1k, 2k, 4k, 8k
    .venv/bin/python benches/speculator_memory.py --lengths 1024,32768
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

SHAPE = dict(vocab_size=1024, hidden_size=512, intermediate_size=1792, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, head_dim=16, max_position_embeddings=65536)
MODES = {"paper (look-ahead 8, all layers)": dict(lookahead=8, window=0, score_layers="all"),
         "early exit (window 32, layer 13)": dict(lookahead=0, window=32, score_layers="13")}


def child(n: int, mode: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import spcli.engine.speculate as speculate
    from spcli.config import ScoreConfig
    from spcli.engine import capture

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy raises the baseline peak
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, attn_implementation=capture.register())).eval()
    torch.set_default_dtype(torch.float32)
    held: dict[str, int] = {}
    real = speculate.token_importance

    def measure(queries, keys, **kw):  # called once per prompt, when the pass has captured everything
        key_storages = {k.untyped_storage().data_ptr(): k.untyped_storage().nbytes() for k in keys}
        rows = {r.untyped_storage().data_ptr(): r.untyped_storage().nbytes()
                for layer in measure.cap.rows.values() for r in layer}
        rows[queries.untyped_storage().data_ptr()] = queries.untyped_storage().nbytes()
        values = sum(key_storages.values()) if MODES[mode]["lookahead"] else 0  # the cache's values, as large as its keys
        held["bytes"] = sum(key_storages.values()) + values + sum(rows.values())
        return real(queries, keys, **kw)

    class Spy(capture.QueryCapture):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            measure.cap = self

    speculate.token_importance, speculate.QueryCapture = measure, Spy
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = ScoreConfig(**MODES[mode], pool=13, rows="mean", impl="torch")
    speculate.speculate_batch(model, [[3 + i % 1000 for i in range(n)]], cfg, eos_ids=set(), device=torch.device("cpu"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    layers, heads, dim = SHAPE["num_hidden_layers"], SHAPE["num_attention_heads"], SHAPE["head_dim"]
    pinned = layers * heads * n * dim * 2 if MODES[mode]["lookahead"] else 0  # bf16; the old code had no early exit
    return {"n": n, "mode": mode, "held_mib": held["bytes"] / 2**20,
            "old_mib": (held["bytes"] + pinned) / 2**20 if pinned else None, "peak_mib": peak / 1024}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1])))
        return
    print(f"{'n':>6}  {'mode':<34} {'held MiB':>9} {'old MiB':>9} {'peak MiB':>9}")
    for n in map(int, args.lengths.split(",")):
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--child", str(n), mode], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{n:>6}  {mode:<34} failed: {out.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            old = f"{r['old_mib']:9.1f}" if r["old_mib"] is not None else f"{'-':>9}"
            print(f"{n:>6}  {mode:<34} {r['held_mib']:9.1f} {old} {r['peak_mib']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
