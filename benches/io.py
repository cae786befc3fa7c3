"""IO overhead of `spcli run`: a generated Parquet shard through a tiny random model with --max-tokens 1.

    python benches/io.py                                   # here, < 1 minute: 3000 rows (1x) and 12000 rows (4x)
    python benches/io.py --rows 1000000 --prompt-chars 2000 --scale 4    # multi-GB: 2 GB and 8 GB shards

Reports, for 1x and `--scale`x the input size, each in a fresh process:
- rows/s of the whole run (model load excluded, reading, tokenizing, writing and committing included);
- the share of wall time outside the model: wall time of `run()` minus the time inside the
  model calls (speculator prefill + scoring and base prefill + decode), split into tokenize
  (the engine's own per-row work) and read + write + commit (everything else);
- peak RSS, and its growth over the RSS once the model is loaded (flat = independent of input size).

The model is a 3-layer, 64-wide random Llama with the SmolLM2 tokenizer (vocab 49152), built once
into --workdir. Prompts are shorter than --min-tokens, so the speculator does not run: the model
time is one small prefill + one decode step, the least work a real run could do, which makes the
outside share an upper bound for real models.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

WORDS = ("report quarter revenue office north south review meeting customer growth cost plan risk team "
         "market product launch budget forecast region staff policy update summary question answer").split()


def build_model(dest: Path) -> Path:
    if (dest / "config.json").is_file():
        return dest
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from spcli.models.lookup import locate

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(locate("smollm2-135m")).save_pretrained(dest)
    return dest


def build_shard(path: Path, rows: int, prompt_chars: int, row_group_rows: int) -> Path:
    """`rows` prompts of ~`prompt_chars` characters plus an unused wide column, written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_file() and pq.ParquetFile(path).metadata.num_rows == rows:
        return path
    rng = random.Random(0)
    k = prompt_chars // 6 + 1
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, pa.schema([("id", pa.string()), ("prompt", pa.string()), ("meta", pa.string())]),
                          compression="zstd") as w:
        for start in range(0, rows, row_group_rows):
            n = min(row_group_rows, rows - start)
            w.write_table(pa.table({
                "id": [f"row{i}" for i in range(start, start + n)],
                "prompt": [" ".join(rng.choices(WORDS, k=k))[:prompt_chars] for _ in range(n)],
                "meta": ["x" * 64] * n,  # not read: spcli reads only the columns it needs
            }))
    tmp.rename(path)
    return path


def child(args) -> None:
    """One measured run in this process; prints a JSON line."""
    import spcli.job.batch as batch
    import spcli.engines.hf.engine as hf
    import spcli.stages.prepare as prepare
    import spcli.job.run
    from spcli.config.run import GenerateConfig, RunConfig
    from spcli.config.scoring import SelectConfig
    from spcli.job.progress import Progress
    from spcli.job.run import run

    spent = {"model": 0.0, "engine": 0.0, "load": 0.0}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t0
        return wrapper

    hf.hf_pass.generate = timed("model", hf.hf_pass.generate)
    prepare.speculate = timed("model", prepare.speculate)
    batch.run_batch = timed("engine", batch.run_batch)
    spcli.job.run.run_batch = batch.run_batch
    hf.HFEngine.__init__ = timed("load", hf.HFEngine.__init__)
    cfg = RunConfig(inputs=(args.shard,), out=args.out, model=args.model, dtype="float32", batch_size=args.batch_size,
                    fresh=True, select=SelectConfig(keep=0.1, min_tokens=args.min_tokens), generate=GenerateConfig(max_tokens=1))
    t0 = time.perf_counter()
    summary = run(cfg, Progress(quiet=True))
    wall = time.perf_counter() - t0 - spent["load"]
    print(json.dumps({
        "rows": summary.rows, "failed": summary.failed, "wall_s": wall, "model_s": spent["model"],
        "tokenize_s": spent["engine"] - spent["model"], "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "parts": len(list(Path(args.out).glob("part-*"))),
    }))


def rss_after_load(model: str) -> float:
    """Peak RSS of a process that only imports spcli and loads the engine (the fixed cost)."""
    code = ("import resource; from spcli.config.run import RunConfig; from spcli.engines.hf.engine import HFEngine; "
            f"HFEngine(RunConfig(inputs=('x',), out='x', model={model!r}, dtype='float32')); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=3000, help="rows at 1x")
    p.add_argument("--scale", type=int, default=4, help="the second run has scale x rows")
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--row-group-rows", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--min-tokens", type=int, default=256, help="prompts shorter than this skip the speculator")
    p.add_argument("--workdir", default="/tmp/spcli-bench-io")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shard", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = build_model(work / "tiny-model")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    base_rss = rss_after_load(str(model))
    print(f"tiny random Llama (3 layers, hidden 64, vocab 49152); --max-tokens 1, --batch-size {args.batch_size}, "
          f"prompts ~{args.prompt_chars} chars; RSS after model load {base_rss:.0f} MiB")
    print(f"{'size':>4} {'rows':>9} {'text MB':>8} {'file MB':>8} {'rows/s':>9} {'wall s':>8} {'model':>7} {'tokenize':>9} "
          f"{'io+commit':>9} {'outside':>8} {'parts':>6} {'peak RSS MiB':>13} {'growth':>7}")
    for mult in (1, args.scale):
        rows = args.rows * mult
        shard = build_shard(work / f"shard-{rows}-{args.prompt_chars}.parquet", rows, args.prompt_chars, args.row_group_rows)
        out = work / f"out-{rows}"
        cmd = [sys.executable, __file__, "--child", "--shard", str(shard), "--out", str(out), "--model", str(model),
               "--batch-size", str(args.batch_size), "--min-tokens", str(args.min_tokens)]
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1])
        wall = res["wall_s"]
        io = wall - res["model_s"] - res["tokenize_s"]
        print(f"{mult:>3}x {res['rows']:>9} {rows * args.prompt_chars / 1e6:>8.1f} {shard.stat().st_size / 1e6:>8.1f} {res['rows'] / wall:>9.0f} {wall:>8.1f} "
              f"{res['model_s'] / wall:>7.1%} {res['tokenize_s'] / wall:>9.1%} {io / wall:>9.1%} "
              f"{(wall - res['model_s']) / wall:>8.1%} {res['parts']:>6} {res['peak_rss_mib']:>13.0f} "
              f"{res['peak_rss_mib'] - base_rss:>+7.0f}")


if __name__ == "__main__":
    main()
