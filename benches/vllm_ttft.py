"""Time to first token on vLLM: full prefill vs prefilling only the kept tokens.

    .venv-vllm/bin/python benches/vllm_ttft.py [--n 2048] [--batch 2] [--keep 0.1 0.3 0.5]

A random-weight Llama (default ~55M parameters, 220 MB in float32, built from a config,
nothing downloaded) runs in vLLM twice per keep rate, in one process: plain requests of
n tokens, and spcli requests of ceil(keep x n) kept tokens at their original positions
(the first 4, the last 64, and random 32-token chunks, as the selection stage keeps).
TTFT is the wall time of one `generate(max_tokens=1)` over the batch; full and pruned
runs alternate and the ratio is the median over `--repeats` pairs. 1/keep is the limit for
the linear layers; attention shrinks with keep^2, so where it is a large share of the
FLOPs (this small default model at n=2048: ~28%; Llama-3-8B at 2k: ~4%) the
ratio can pass 1/keep, and fixed per-step costs pull it below.

Not included: the speculator. Pass its measured cost with `--speculator-s` (seconds per
batch), or call `run(..., speculator=fn)` where fn(prompts, keep) -> kept positions per
prompt; its wall time is then added to the pruned TTFT.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Real Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336.
SMALL = dict(
    vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)
CPU_ENV = dict(
    VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
    OMP_NUM_THREADS="2", VLLM_CPU_KVCACHE_SPACE="1",  # GiB; allocating it is slow here
)
Speculator = Callable[[list[list[int]], float], list[list[int]]]


def build_model(dest: Path, shape: dict) -> Path:
    """Random-weight Llama + WordLevel tokenizer ("w0", "w1", ...), saved in float32."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(shape["vocab_size"] - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(dest)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**shape)).to(torch.float32).save_pretrained(dest)
    return dest


def chunk_selection(n: int, keep: float, seed: int, chunk: int = 32) -> list[int]:
    """ceil(keep x n) positions: the first 4, the last 64, then random chunks (the forced
    tokens are a floor, as in selection)."""
    budget = math.ceil(keep * n)
    kept = set(range(min(4, n))) | set(range(max(0, n - 64), n))
    starts = list(range(0, n, chunk))
    random.Random(seed).shuffle(starts)
    for pos in (p for s in starts for p in range(s, min(s + chunk, n))):
        if len(kept) >= budget:
            break
        kept.add(pos)
    return sorted(kept)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(
    model_dir: str, n: int, batch: int, keeps: list[float], repeats: int, dtype: str,
    speculator: Speculator | None = None, speculator_s: float = 0.0, eager: bool = True,
) -> list[dict]:
    from vllm import SamplingParams

    import torch
    from transformers import AutoTokenizer

    from spcli.stages.request import PrunedRequest
    from spcli.engines.vllm.driver.base_pass import VllmRunner, VllmRunnerConfig

    rng = random.Random(0)
    prompts = [[rng.randrange(3, 30000) for _ in range(n)] for _ in range(batch)]
    config = VllmRunnerConfig(
        model=model_dir, dtype=dtype, max_model_len=n + 16,
        max_num_batched_tokens=max(batch * n, 2048), max_num_seqs=max(batch, 1), seed=0,
        enforce_eager=eager,
    )
    rows = []
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    with VllmRunner(config, tokenizer, eos_ids=set()) as base:
        one = SamplingParams(max_tokens=1, temperature=0.0)
        full_prompts = [{"prompt_token_ids": p} for p in prompts]

        def full():
            base.llm.generate(full_prompts, one, use_tqdm=False)

        full()  # warm-up: first calls pay one-time costs
        base.generate([PrunedRequest("warm-up", p, torch.tensor([n - 1]), 1) for p in prompts])
        for keep in keeps:
            select_start = time.perf_counter()
            if speculator is not None:
                positions = speculator(prompts, keep)
            else:
                positions = [chunk_selection(n, keep, seed=i) for i in range(batch)]
            select_s = (time.perf_counter() - select_start if speculator else 0.0) + speculator_s
            requests = [PrunedRequest("bench", p, torch.tensor(pos), 1) for p, pos in zip(prompts, positions)]
            def pruned(requests=requests):
                base.generate(requests)

            # Full and pruned alternate, so load from elsewhere hits both alike.
            pairs = [(timed(full), timed(pruned)) for _ in range(repeats)]
            full_s = statistics.median(f for f, _ in pairs)
            pruned_s = statistics.median(p for _, p in pairs) + select_s
            rows.append(dict(
                keep=keep, kept=sum(map(len, positions)) // batch, full_s=full_s,
                pruned_s=pruned_s, speculator_s=select_s,
                ratio=statistics.median(f / (p + select_s) for f, p in pairs), limit=1.0 / keep,
            ))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model folder (default: build a random ~55M Llama)")
    parser.add_argument("--n", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--batch", type=int, default=2, help="prompts per batch")
    parser.add_argument("--keep", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compile", action="store_true",
                        help="let vLLM torch.compile the model (adds ~1 min of start-up on CPU)")
    parser.add_argument("--speculator-s", type=float, default=0.0,
                        help="speculator seconds per batch, added to the pruned TTFT")
    args = parser.parse_args(argv)
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(build_model(Path(tmp) / "model", SMALL))
        rows = run(model_dir, args.n, args.batch, args.keep, args.repeats, args.dtype,
                   speculator_s=args.speculator_s, eager=not args.compile)
    mode = "compiled" if args.compile else "eager"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"vLLM TTFT ({mode}), batch {args.batch} x n={args.n}, {args.dtype}, "
          f"median of {args.repeats} alternating pairs; load average {load}; "
          f"speculator {'included' if args.speculator_s else 'NOT included'}")
    print(f"{'keep':>5} {'kept':>6} {'full s':>8} {'pruned s':>9} {'(spec s)':>9} "
          f"{'ratio':>6} {'limit':>6}")
    for r in rows:
        print(f"{r['keep']:>5.2f} {r['kept']:>6d} {r['full_s']:>8.3f} {r['pruned_s']:>9.3f} "
              f"{r['speculator_s']:>9.3f} {r['ratio']:>6.2f} {r['limit']:>6.2f}")


if __name__ == "__main__":
    main()
