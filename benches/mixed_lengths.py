"""Mixed-length batches on the hf engine: length bucketing against plain batch order (issue 12).

48 records of 8-2000 tokens, shuffled, in batches of 8; full prefill (keep 1.0) and keep 0.1; the
same PrunedRequests through `hf_pass.generate` with bucket=True and bucket=False. Prints wall time
and mean TTFT (from the start of each batch's base pass) as ratios, one run.

    python benches/mixed_lengths.py                       # the tiny random model (seconds)
    python benches/mixed_lengths.py --model smollm2-135m  # the packaged real model
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from spcli.config.run import RunConfig

from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.engines.hf import base_pass as hf_pass
from spcli.models.load import load_stack
from spcli.stages.prepare import prune
from spcli.stages.request import PrunedRequest

TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def tiny_model(dest: Path) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from spcli.models.lookup import locate

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(dest)
    AutoTokenizer.from_pretrained(locate("smollm2-135m")).save_pretrained(dest)
    return str(dest)


def requests(num: int, max_tokens: int, seed: int) -> list[PrunedRequest]:
    rng = random.Random(seed)
    lengths = [8, 2000] + [int(8 * (250 ** rng.random())) for _ in range(num - 2)]  # log-uniform 8-2000
    rng.shuffle(lengths)
    out = []
    for i, n in enumerate(lengths):
        ids = [1] + [rng.randrange(100, 40000) for _ in range(n - 1)]
        out.append(PrunedRequest(f"r{i}", ids, torch.arange(n), max_tokens))
    return out


def run(stack, reqs: list[PrunedRequest], batch_size: int, bucket: bool) -> tuple[float, float]:
    """Wall time of all batches, mean TTFT over rows."""
    t0 = time.perf_counter()
    ttfts = []
    for i in range(0, len(reqs), batch_size):
        gens = hf_pass.generate(stack.base, reqs[i: i + batch_size], stack.tokenizer, set(), stack.pad_id,
                                stack.device, bucket=bucket)
        ttfts += [g.ttft_s for g in gens]
    return time.perf_counter() - t0, sum(ttfts) / len(ttfts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model name or folder (default: a tiny random Llama)")
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or tiny_model(Path(tmp) / "tiny")
        stack = load_stack(model, "self:2" if args.model is None else None, "float32" if args.model is None else None,
                           args.device)
        base = requests(args.records, args.max_tokens, seed=0)
        print(f"{args.records} records, {min(r.num_prompt_tokens for r in base)}-"
              f"{max(r.num_prompt_tokens for r in base)} tokens, batch {args.batch_size}, {stack.device}, {model}")
        for keep in (1.0, 0.1):
            reqs = base
            if keep < 1.0:
                cfg = RunConfig(inputs=("-",), out="-", select=SelectConfig(keep=keep, chunk=32, min_tokens=256),
                                score=ScoreConfig(lookahead=2, window=0, score_layers="all", pool=13, rows="mean"))
                reqs = prune([PrunedRequest(r.record_id, r.token_ids, r.kept, r.max_tokens, keep=keep) for r in base],
                             cfg.select, cfg.score, stack)
            run(stack, reqs[: args.batch_size], args.batch_size, True)  # warm-up
            wall_b, ttft_b = run(stack, reqs, args.batch_size, bucket=True)
            wall_p, ttft_p = run(stack, reqs, args.batch_size, bucket=False)
            print(f"keep {keep}: wall {wall_p:.2f}s -> {wall_b:.2f}s (bucketed/plain {wall_b / wall_p:.2f}x), "
                  f"mean TTFT {ttft_p:.3f}s -> {ttft_b:.3f}s ({ttft_b / ttft_p:.2f}x)")


if __name__ == "__main__":
    main()
