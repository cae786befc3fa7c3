"""vLLM engine arguments for the base model, and the GPU share the speculator needs.

Pure functions of the run configuration and of files in the model folders (config.json, the
safetensors headers): nothing here imports vLLM or loads weights, so all of it is testable anywhere.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from spcli import models
from spcli.config import RunConfig
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
    def from_folder(cls, folder: Path) -> SpeculatorShape:
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise ConfigError(
                f"speculator folder {folder} has no *.safetensors files, so its GPU memory cannot be "
                "computed; pass --gpu-memory-utilization explicitly"
            )
        c = json.loads((Path(folder) / "config.json").read_text())
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        return cls(
            num_params=sum(safetensors_numel(f) for f in files), num_layers=c["num_hidden_layers"],
            num_heads=heads, num_kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads, hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
        )


def safetensors_numel(path: Path) -> int:
    """Elements stored in one safetensors file, from its JSON header (8-byte length + JSON)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def speculator_reserve_bytes(shape: SpeculatorShape, num_tokens: int, lookahead: int, dtype_bytes: int) -> int:
    """GPU bytes the speculator needs for one prompt of up to `num_tokens` tokens.

        W    = P * b                            weights (P parameters, b bytes per element)
        KV   = 2 * L * KVH * D * (N + A) * b    its DynamicCache: keys and values of N prompt + A look-ahead tokens
        ACT  = N * (3 * I + 4 * h) * b          one decoder layer's peak: 3 MLP intermediates, 4 hidden-size tensors
        MASK = N * N                            a materialised boolean causal mask (the worst case; sdpa may skip it)
        SC   = 2 * H * (A + 1) * N * 4          scoring: one layer's softmax and its pooled copy, fp32
        C    = 1 GiB                            this process's CUDA context and allocator slack
        reserve = W + KV + ACT + MASK + SC + C

    The speculator reads one prompt at a time, so N is the longest prompt: VllmEngine takes
    min(max_model_len, the base's max_position_embeddings), the longest request plain vLLM would take.
    Llama-3.1-8B in bf16 at N = 32768, A = 8: 16.1 + 4.3 + 3.9 + 1.1 + 0.1 + 1.1 = 26.5 GB.
    """
    n, a, b = num_tokens, lookahead, dtype_bytes
    weights = shape.num_params * b
    kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * (n + a) * b
    act = n * (3 * shape.intermediate_size + 4 * shape.hidden_size) * b
    scoring = 2 * shape.num_heads * (a + 1) * n * 4
    return weights + kv + act + n * n + scoring + CONTEXT_BYTES


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
    """VllmBaseConfig fields for the base model: the preset's, overridden by --tp, --max-model-len,
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
        max_num_batched_tokens=v.max_num_batched_tokens, seed=cfg.generate.seed,
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
