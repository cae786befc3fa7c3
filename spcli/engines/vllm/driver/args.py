"""vLLM engine arguments for the base model (the speculator's GPU share: spcli/plan/memory.py).

Pure functions of the run configuration and of config.json: nothing here imports vLLM or loads
weights, so all of it is testable anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from spcli.config.run import RunConfig
from spcli.models import lookup
from spcli.models.cpu_memory import MALLOC_ENV
from spcli.models.files import read_model_config

CPU_ENV_KVCACHE_GIB = "2"
VLLM_CPU_NICE = 19  # vLLM's processes below this one where its speculator shares their CPU cores (start.py)


def engine_dtype(cfg: RunConfig, is_cpu: bool) -> str:
    """The dtype of vLLM's base and of the speculator (driver copy or worker replicas): --dtype, or for auto
    the one spcli.models.dtype picks for the vllm engine on vLLM's device type (CUDA: the model's; the CPU build:
    per the CPU's features, spcli.models.dtype.CPU_DTYPE), so base, speculator and the resume fingerprint agree."""
    import torch

    from spcli.models.dtype import resolve_dtype

    return resolve_dtype(cfg.dtype, cfg.model, torch.device("cpu" if is_cpu else "cuda"), engine="vllm")[0]


def engine_args(cfg: RunConfig, model_path: Path, is_cpu: bool, dtype: str | None = None) -> dict:
    """VllmRunnerConfig fields for the base model: the preset's, overridden by --tp, --max-model-len,
    --gpu-memory-utilization and --max-num-batched-tokens. `dtype`: the run's, where already resolved
    (spcli.models.resolved); else engine_dtype's.

    Quantization: a checkpoint that declares its own (config.json `quantization_config`, e.g. the
    FP8 405B's fbgemm_fp8) is read by vLLM as it is; otherwise the preset's (fp8 = vLLM quantizes
    the bf16 weights to FP8 while loading).
    """
    preset = lookup.PRESETS.get(cfg.model)
    v = cfg.vllm
    quantization = preset.quantization if preset else None
    if quantization and "quantization_config" in read_model_config(model_path):
        quantization = None
    kwargs = {"quantization": quantization} if quantization else {}
    args = dict(
        model=str(model_path), dtype=dtype or engine_dtype(cfg, is_cpu),
        tensor_parallel_size=v.tp or (preset.tp if preset else 1),
        max_model_len=v.max_model_len or (preset.max_model_len if preset else None),
        max_num_batched_tokens=v.max_num_batched_tokens, max_num_seqs=v.max_num_seqs,
        kv_cache_dtype=v.kv_cache_dtype, seed=cfg.generate.seed,
        enforce_eager=is_cpu if v.enforce_eager is None else v.enforce_eager,  # compiling costs minutes on CPU
        # a document shared by a group (or by whole prompts) is prefilled once; salts keep kept sets apart
        enable_prefix_caching=True,
        engine_kwargs=kwargs,
    )
    if v.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = v.gpu_memory_utilization
    # In a Ray actor (spcli/ray/worker.py) vLLM would pick Ray's executor for TP; its own processes keep the ranks
    # on the actor's node, on the GPUs of the actor's placement group.
    if args["tensor_parallel_size"] > 1 and os.environ.get("SPCLI_VLLM_EXECUTOR"):
        kwargs["distributed_executor_backend"] = os.environ["SPCLI_VLLM_EXECUTOR"]
    return args


def cpu_env_defaults(tp: int) -> dict[str, str]:
    """vLLM CPU settings when unset: bind OpenMP to every CPU this process may use (vLLM's
    "auto" takes one per physical core, a single core on small machines), split across ranks; malloc
    keeping freed memory in vLLM's processes (cpu_memory.py)."""
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = max(1, len(cpus) // tp)
    groups = [cpus[r * per_rank : (r + 1) * per_rank] or cpus[-1:] for r in range(tp)]
    return {
        "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, g)) for g in groups),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(per_rank),
        "VLLM_CPU_KVCACHE_SPACE": CPU_ENV_KVCACHE_GIB,  # GiB of KV cache per rank
        **MALLOC_ENV,
    }


def beside_speculator_env() -> dict[str, str]:
    """vLLM's waits, when unset, for an engine started `VLLM_CPU_NICE` below the speculator (start.py): its start and
    each of its steps make no headway while a speculator window holds the cores (minutes for long prompts on a few
    cores), so its ready and step timeouts (600 s and 300 s in vLLM 0.32) are an hour instead."""
    return {"VLLM_ENGINE_READY_TIMEOUT_S": "3600", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
