"""vLLM engine arguments for the base model, and the GPU share the speculator needs.

Pure functions of the run configuration and of files in the model folders (config.json, the
safetensors headers): nothing here imports vLLM or loads weights, so all of it is testable anywhere.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from spcli import models
from spcli.config import RunConfig, ScoreConfig
from spcli.errors import ConfigError

GiB = 1 << 30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's own default, used when the GPU is not shared
MIN_GPU_MEMORY_UTILIZATION = 0.1
CONTEXT_BYTES = 1 * GiB  # this process's CUDA context and allocator slack
CPU_ENV_KVCACHE_GIB = "2"


@dataclass(frozen=True)
class SpeculatorShape:
    """What the speculator's memory depends on, read from its folder (no weights loaded)."""

    num_params: int  # from the safetensors headers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int

    @classmethod
    def from_folder(cls, folder: Path, num_layers: int | None = None) -> SpeculatorShape:
        """num_layers: only the first layers are loaded (`self:K` on vLLM): their tensors, plus the
        embeddings, final norm and LM head, are what the speculator holds."""
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise ConfigError(
                f"speculator folder {folder} has no *.safetensors files, so its GPU memory cannot be "
                "computed; pass --gpu-memory-utilization explicitly"
            )
        c = json.loads((Path(folder) / "config.json").read_text())
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        layers = c["num_hidden_layers"] if num_layers is None else num_layers
        return cls(
            num_params=sum(safetensors_numel(f, layers) for f in files), num_layers=layers,
            num_heads=heads, num_kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads, hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
        )


def safetensors_numel(path: Path, num_layers: int | None = None) -> int:
    """Elements stored in one safetensors file, from its JSON header (8-byte length + JSON); with
    num_layers, only those of decoder layers below it (and every tensor outside the layers)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items()
               if k != "__metadata__" and (num_layers is None or _layer_of(k) is None or _layer_of(k) < num_layers))


def _layer_of(name: str) -> int | None:
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m[1]) if m else None


def speculator_reserve_bytes(shape: SpeculatorShape, num_tokens: int, score: ScoreConfig, dtype_bytes: int) -> int:
    """GPU bytes the speculator holds for prompts of up to `num_tokens` tokens (`score` resolved).

    With T = max(N, SPECULATOR_BATCH_TOKENS) tokens in one batched pass (prompts of similar length
    share one), L layers, S scored layers, R = W + A query rows (W window rows, A look-ahead):

        W    = P * b                                  weights (P parameters of the layers loaded)
        KV   = 2 * L * KVH * D * (T + A) * b          look-ahead: the DynamicCache, keys and values of all layers
             = (S + 2) * KVH * D * T * b              early exit (A = 0): keys of the scored layers, one layer's k, v
        Q    = S * H * R * D * b                      the scored query rows (copies: no layer's whole query is pinned)
        ACT  = T * (3 * I + 4 * h) * b                one decoder layer's peak: 3 MLP intermediates, 4 hidden-size tensors
        MASK = N * T                                  the boolean attention mask of one batch (at most T tokens)
        SC   = 2 * H * R * N * 4                      scoring: one layer's softmax and its pooled copy, fp32
        C    = 1 GiB                                  this process's CUDA context and allocator slack
        reserve = W + KV + Q + ACT + MASK + SC + C

    Llama-3.1-8B in bf16 at N = 32768 with the paper's recipe (A = 8, every layer, R = 9):
    16.1 + 4.3 + 0.0 + 3.9 + 1.1 + 0.1 + 1.1 = 26.5 GB.
    """
    from spcli.engine.prepare import SPECULATOR_BATCH_TOKENS

    n, b = num_tokens, dtype_bytes
    t = max(n, SPECULATOR_BATCH_TOKENS)
    a = score.lookahead or 0
    rows = score.num_prompt_rows + a
    scored = len(score.layers(shape.num_layers))
    weights = shape.num_params * b
    if a:
        kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * (t + a) * b
    else:
        kv = (scored + 2) * shape.num_kv_heads * shape.head_dim * t * b
    queries = scored * shape.num_heads * rows * shape.head_dim * b
    act = t * (3 * shape.intermediate_size + 4 * shape.hidden_size) * b
    scoring = 2 * shape.num_heads * rows * n * 4
    return weights + kv + queries + act + n * t + scoring + CONTEXT_BYTES


def gpu_memory_utilization(total_bytes: int, reserve_bytes: int) -> float:
    """vLLM's share of the GPU when the speculator shares it:

        gpu_memory_utilization = min(0.9, (T - reserve) / T), rounded down to 0.01

    T = the GPU's total memory. vLLM takes that fraction of T for weights, activations and KV
    cache on every rank; the speculator lives in the rest.
    """
    share = math.floor(100 * (total_bytes - reserve_bytes) / total_bytes) / 100
    if share < MIN_GPU_MEMORY_UTILIZATION:
        raise ConfigError(
            f"the speculator needs {reserve_bytes / GiB:.1f} GiB of the GPU's {total_bytes / GiB:.1f} GiB, "
            "leaving too little for the base model: lower --max-model-len (it bounds the speculator's "
            "prompt), put the speculator on another GPU (--device cuda:N, N >= --tp), or use a smaller one"
        )
    return min(DEFAULT_GPU_MEMORY_UTILIZATION, share)


def read_model_config(path: Path) -> dict:
    c = json.loads((Path(path) / "config.json").read_text())
    return {**c.get("text_config", {}), **c}


def engine_args(cfg: RunConfig, model_path: Path, is_cpu: bool) -> dict:
    """VllmRunnerConfig fields for the base model: the preset's, overridden by --tp, --max-model-len,
    --gpu-memory-utilization and --max-num-batched-tokens.

    Quantization: a checkpoint that declares its own (config.json `quantization_config`, e.g. the
    FP8 405B's fbgemm_fp8) is read by vLLM as it is; otherwise the preset's (fp8 = vLLM quantizes
    the bf16 weights to FP8 while loading).
    """
    preset = models.PRESETS.get(cfg.model)
    v = cfg.vllm
    quantization = preset.quantization if preset else None
    if quantization and "quantization_config" in read_model_config(model_path):
        quantization = None
    kwargs = {"quantization": quantization} if quantization else {}
    args = dict(
        model=str(model_path), dtype=cfg.dtype or models.default_dtype(cfg.model),
        tensor_parallel_size=v.tp or (preset.tp if preset else 1),
        max_model_len=v.max_model_len or (preset.max_model_len if preset else None),
        max_num_batched_tokens=v.max_num_batched_tokens, max_num_seqs=v.max_num_seqs,
        kv_cache_dtype=v.kv_cache_dtype, seed=cfg.generate.seed,
        enforce_eager=is_cpu if v.enforce_eager is None else v.enforce_eager,  # compiling costs minutes on CPU
        engine_kwargs=kwargs,
    )
    if v.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = v.gpu_memory_utilization
    return args


def cpu_env_defaults(tp: int) -> dict[str, str]:
    """vLLM CPU settings when unset: bind OpenMP to every CPU this process may use (vLLM's
    "auto" takes one per physical core, a single core on small machines), split across ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = max(1, len(cpus) // tp)
    groups = [cpus[r * per_rank : (r + 1) * per_rank] or cpus[-1:] for r in range(tp)]
    return {
        "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, g)) for g in groups),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(per_rank),
        "VLLM_CPU_KVCACHE_SPACE": CPU_ENV_KVCACHE_GIB,  # GiB of KV cache per rank
    }
