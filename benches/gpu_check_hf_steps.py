"""The steps of benches/gpu_check_hf.py, each in a process of its own, so its exit status is the step's.

    python3 benches/gpu_check_hf_steps.py kernel WORK SCALE       part 1: the scoring kernel against the torch
                                                                   reference (parity and time), a plain matmul's rate
    python3 benches/gpu_check_hf_steps.py build WORK SCALE        random-weight models from configs, prompt shards,
                                                                   the plan's numbers for the same shapes (parts 2, 3)
    python3 benches/gpu_check_hf_run.py WORK SCALE KEEP           `spcli run --engine hf` on the shards; at keep < 1
                                                                   also one profiled speculator pass

Each writes WORK/<step>.json (run: WORK/run_<keep>.json); the driver reads them. SCALES holds what differs
between the H200 ("full") and this CPU ("tiny"). Nothing here re-implements a stage: scoring is
spcli.kernels.score, the runs are spcli.cli's `run`, the limits and reserves spcli.plan's formulas.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE
from spcli.plan.configs import SHIPPED_CONFIGS

KEEP = 0.1
MIN_TOKENS = 512  # --min-tokens of the runs: every prompt here is pruned, the warm-up included
EOS_ID = 2  # "</s>" of the word-level tokenizer (ids 0-2: "<unk>", "<s>", "</s>"; word "t{i}" is id i)
PROFILE_ROWS = 25


@dataclass(frozen=True)
class Scale:
    name: str
    device: str
    dtype: str  # the models are built and run in it
    base: dict  # config.json fields (full: Llama-3.1-8B's)
    speculator: dict  # (full: Llama-3.2-1B's)
    max_positions: int
    warmup: tuple[int, int]  # (prompts, tokens), run first and not reported: speculator load, kernel compile
    cases: tuple[tuple[int, int], ...]  # (prompts, tokens) of the timed batches, keep 0.1 against 1.0 (part 2)
    long: tuple[int, int]  # the longest chunked speculator pass (part 3, keep 0.1 run only)
    speculator_chunk: int
    score_impl: str  # --score-impl of the runs
    kernel_lengths: tuple[int, ...]  # part 1's n
    kernel_shape: tuple[int, int, int]  # (H, KVH, D) of one scored layer
    kernel_window: int  # window rows, each limited to the keys up to its own position
    kernel_repeats: int
    matmul_size: int  # a square matmul in the models' dtype: what "the plain matmul rate" means here
    profile_length: int  # one speculator pass under torch.profiler
    max_tokens: int = 4  # TTFT is the point; a few decode steps check that generation goes on


# Llama-3.1-8B and Llama-3.2-1B as spcli plan knows them; positions raised by 1024 so that a prompt of
# 131072 tokens plus its generated ones fits (random weights: RoPE's range changes no cost).
FULL = Scale(
    name="full", device="cuda", dtype="bfloat16",
    base=SHIPPED_CONFIGS["llama-8b"], speculator=SHIPPED_CONFIGS["llama-1b"], max_positions=131072 + 1024,
    warmup=(4, 2048), cases=((16, 8192), (4, 32768)), long=(1, 131072), speculator_chunk=8192, score_impl="triton",
    kernel_lengths=(8192, 32768, 131072), kernel_shape=(32, 8, 128), kernel_window=32, kernel_repeats=20,
    matmul_size=8192, profile_length=32768,
)
# The same steps on this CPU in about a minute: float32 (no AMX here), the kernel under TRITON_INTERPRET=1.
TINY_BASE = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, vocab_size=1024, tie_word_embeddings=False)
TINY_SPECULATOR = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
TINY = Scale(
    name="tiny", device="cpu", dtype="float32", base=TINY_BASE, speculator=TINY_SPECULATOR, max_positions=4096,
    warmup=(2, 512), cases=((16, 512), (4, 1024)), long=(1, 2048), speculator_chunk=256, score_impl="torch",
    kernel_lengths=(64, 128, 256), kernel_shape=(4, 2, 32), kernel_window=8, kernel_repeats=1,
    matmul_size=256, profile_length=1024,
)
SCALES = {s.name: s for s in (FULL, TINY)}


def shards(scale: Scale, keep: float) -> list[tuple[str, int, int]]:
    """The run's input shards in order, (file name, prompts, tokens): the warm-up, the timed cases, and at
    keep < 1 the long prompt. One shard is one batch (`spcli run` never batches across shards)."""
    batches = [scale.warmup, *scale.cases, *([scale.long] if keep < 1 else [])]
    return [(f"{i}_b{b}_n{n}.jsonl", b, n) for i, (b, n) in enumerate(batches)]


def score_config(scale: Scale):
    from spcli.config.scoring import ScoreConfig

    return ScoreConfig(**PAPER_SCORE, impl=scale.score_impl)  # the paper's recipe: look-ahead 8, every layer


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1))


# --- part 1 -----------------------------------------------------------------------------------------


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn, device, repeats: int) -> float:
    """Median milliseconds of fn() over repeats (run it once before: the kernel compiles on its first call)."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def matmul_rate(scale: Scale, device) -> dict:
    """TFLOP/s of one square matmul in the models' dtype: 3 warm-ups, the mean of 10."""
    import torch

    n, dtype = scale.matmul_size, getattr(torch, scale.dtype)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    seconds = (time.perf_counter() - t0) / 10
    return {"size": n, "dtype": scale.dtype, "ms": seconds * 1e3, "tflops": 2 * n**3 / seconds / 1e12}


def kernel_case(score, scale: Scale, device, dtype, n: int, atol: float, rtol: float) -> dict:
    """One layer's window rows over n keys: the kernel (`tri`) against the reference (`ref`), then both timed."""
    import torch

    heads, kv_heads, head_dim = scale.kernel_shape
    gen = torch.Generator().manual_seed(n)
    queries = (2 * torch.randn(1, heads, scale.kernel_window, head_dim, generator=gen)).to(device, dtype)  # [1, H, S, D]
    keys = [torch.randn(kv_heads, n, head_dim, generator=gen).to(device, dtype)]  # 1 x [KVH, n, D]
    limits = torch.arange(n - scale.kernel_window + 1, n + 1, dtype=torch.int32, device=device)  # [S]
    pool = PAPER_SCORE["pool"]
    kernel = lambda: score.token_importance(queries, keys, pool=pool, impl="triton", row_limits=limits)  # noqa: E731
    reference = lambda: score.importance_reference(queries, keys, pool, limits)  # noqa: E731
    ref, tri = reference(), kernel()  # [n] float32 each
    err = (ref.double() - tri.double()).abs().nan_to_num(math.inf)  # an unwritten (NaN) element is the worst
    kernel_ms = timed_ms(kernel, device, scale.kernel_repeats)
    reference_ms = timed_ms(reference, device, scale.kernel_repeats)
    key_bytes = keys[0].numel() * keys[0].element_size()
    traffic = 2 * key_bytes  # the keys are read twice: softmax statistics, then pooled probabilities
    return {"parity_ok": bool((err <= atol + rtol * ref.double().abs()).all()), "max_abs_err": float(err.max()),
            "max_rel_err": float((err / ref.double().abs().clamp_min(1e-30)).max()), "atol": atol, "rtol": rtol,
            "kernel_ms": kernel_ms, "reference_ms": reference_ms, "speedup": reference_ms / kernel_ms,
            "key_bytes": key_bytes, "traffic_bytes": traffic, "bandwidth_gbs": traffic / kernel_ms / 1e6}


def kernel_step(work: Path, scale: Scale) -> None:
    import torch

    from spcli.kernels import score

    device = torch.device(scale.device)
    heads, kv_heads, head_dim = scale.kernel_shape
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "interpreted": score.IS_INTERPRETED, "has_triton": score.HAS_TRITON, "shape": {
                "layers": 1, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "rows": scale.kernel_window,
                "pool": PAPER_SCORE["pool"]}, "matmul": matmul_rate(scale, device), "cases": []}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(sm_count=props.multi_processor_count, memory_bytes=props.total_memory, cuda=torch.version.cuda)
    tolerance = {"bfloat16": (1e-7, 1e-4), "float32": (1e-7, 2e-5)}  # (atol, rtol): tests/test_kernels_score.py's
    for dtype_name, (atol, rtol) in tolerance.items():
        for n in scale.kernel_lengths:
            try:
                case = kernel_case(score, scale, device, getattr(torch, dtype_name), n, atol, rtol)
            except Exception as e:  # e.g. triton's OutOfResources (shared memory) at launch: recorded, not fatal
                case = {"parity_ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            info["cases"].append({"dtype": dtype_name, "n": n, **case})
            print(json.dumps(info["cases"][-1]), flush=True)
    write_json(work / "kernel.json", info)
    sys.exit(0 if all(c["parity_ok"] for c in info["cases"]) else 1)


# --- parts 2 and 3: models, shards, plan ------------------------------------------------------------


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, vocab_size)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")


def build_model(dest: Path, shape: dict, scale: Scale, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**shape, "max_position_embeddings": scale.max_positions}, bos_token_id=1,
                         eos_token_id=EOS_ID, pad_token_id=EOS_ID, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, scale.dtype))  # built in its dtype: no float32 copy first
    with torch.device(scale.device):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    del model
    if scale.device == "cuda":
        torch.cuda.empty_cache()


def write_shards(folder: Path, scale: Scale) -> None:
    rng = random.Random(0)
    vocab = scale.base["vocab_size"]
    folder.mkdir(parents=True, exist_ok=True)
    for name, batch, n in shards(scale, KEEP):
        with open(folder / name, "w") as f:
            for i in range(batch):
                words = " ".join(f"t{rng.randrange(3, vocab)}" for _ in range(n))
                f.write(json.dumps({"id": f"{batch}x{n}-{i}", "prompt": words}) + "\n")


def plan_numbers(work: Path, scale: Scale) -> dict:
    """spcli plan's formulas on the built folders: the FLOP limit per timed case, the speculator's reserve."""
    from dataclasses import asdict

    from spcli.config.scoring import SelectConfig
    from spcli.stages.select import num_forced, target
    from spcli.plan.flops import prefill_flops, speedup_limit, speculator_flops
    from spcli.plan.memory import speculator_reserve
    from spcli.plan.shapes import DTYPE_BYTES, ModelShape

    base, spec = ModelShape.from_folder(work / "base"), ModelShape.from_folder(work / "speculator")
    score = score_config(scale)
    dtype_bytes = DTYPE_BYTES[scale.dtype]

    def reserve(n: int) -> dict:
        r = speculator_reserve(spec, n, score, dtype_bytes, scale.speculator_chunk)
        return {**asdict(r), "total": r.total}

    select = SelectConfig(keep=KEEP, chunk=PAPER_CHUNK, min_tokens=MIN_TOKENS)
    cases = []
    for batch, n in scale.cases:
        lim = speedup_limit(base, spec, score, n, KEEP, batch, 1, "workers")  # keeps ceil(keep x n) tokens
        kept = target(n, select, KEEP, num_forced(n, select))  # what selection keeps (more on short prompts)
        pruned = batch * prefill_flops(base, kept)
        cases.append({"batch": batch, "n": n, "plan_kept_per_prompt": math.ceil(KEEP * n), "plan_limit": lim.limit,
                      "kept_per_prompt": kept, "limit": lim.full_flops / (pruned + lim.speculator_wall_flops),
                      "full_flops": lim.full_flops, "pruned_flops": pruned, "speculator_flops": lim.speculator_flops,
                      "reserve": reserve(n)})
    chunked = [{"n": n, "speculator_flops": speculator_flops(spec, n, score), "reserve": reserve(n)}
               for n in (scale.cases[-1][1], scale.long[1])]
    shape = lambda s: {"layers": s.num_layers, "hidden": s.hidden_size, "heads": s.num_heads,  # noqa: E731
                       "kv_heads": s.num_kv_heads, "head_dim": s.head_dim, "intermediate": s.intermediate_size,
                       "vocab": s.vocab_size, "params": s.num_params}
    return {"base": shape(base), "speculator": shape(spec), "score": PAPER_SCORE, "chunk": PAPER_CHUNK, "keep": KEEP,
            "dtype": scale.dtype, "speculator_chunk": scale.speculator_chunk, "cases": cases, "chunked": chunked}


def build_step(work: Path, scale: Scale) -> None:
    t0 = time.perf_counter()
    tokenizer = build_tokenizer(scale.base["vocab_size"])
    build_model(work / "base", scale.base, scale, tokenizer)
    build_model(work / "speculator", scale.speculator, scale, tokenizer)
    built_s = time.perf_counter() - t0
    write_shards(work / "in", scale)
    write_json(work / "build.json", {**plan_numbers(work, scale), "build_s": built_s})
    print(f"models and shards built in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    step, work, scale_name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    {"kernel": kernel_step, "build": build_step}[step](work, SCALES[scale_name])
