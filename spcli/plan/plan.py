"""`spcli plan`: the per-GPU memory plan and the speed-up limit, from configs, without loading weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig, check
from spcli.models import lookup, profiles
from spcli.models.files import read_model_config
from spcli.models.speculator import parse_self
from spcli.plan import memory
from spcli.plan.configs import local_folder, model_shape
from spcli.plan.flops import PLACEMENTS, SpeedupLimit, speedup_limit
from spcli.plan.memory import GiB, Reserve
from spcli.plan.refusals import base_quantization, refuse_speculator, stored_quantization
from spcli.plan.shapes import DTYPE_BYTES, ModelShape

KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class PlanConfig:
    model: str = "llama-405b-fp8"
    speculator: str | None = None  # None = the model's default
    tp: int | None = None  # None = the preset's
    gpu_memory_gib: float = 80.0  # per GPU, GiB (an H100 80GB reports 81559 MiB = 79.6 GiB)
    length: int = 32768  # prompt tokens n
    keep: float = 0.1
    batch: int = 16
    max_tokens: int = 64
    placement: str | None = None  # None = both
    kv_cache_dtype: str = "auto"
    speculator_chunk: int = SPECULATOR_CHUNK
    max_model_len: int | None = None  # None = the preset's, else the model's context
    max_prompt_len: int | None = None  # the speculator's longest prompt (its reserve); None = the base's positions
    score: ScoreConfig = field(default_factory=ScoreConfig)  # unset fields: the model's defaults

    def __post_init__(self) -> None:
        check(self.tp is None or self.tp >= 1, f"--tp must be >= 1, got {self.tp}")
        check(self.gpu_memory_gib > 0, f"--gpu-memory must be > 0 GiB, got {self.gpu_memory_gib}")
        check(self.length >= 1, f"--length must be >= 1, got {self.length}")
        check(0.0 < self.keep <= 1.0, f"--keep must be in (0, 1], got {self.keep}")
        check(self.batch >= 1, f"--batch must be >= 1, got {self.batch}")
        check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        check(self.placement is None or self.placement in PLACEMENTS,
               f"--placement must be driver or workers, got {self.placement!r}")
        check(self.kv_cache_dtype in KV_CACHE_DTYPES, f"--kv-cache-dtype must be auto or fp8, got {self.kv_cache_dtype!r}")
        check(self.speculator_chunk >= 1, f"--speculator-chunk must be >= 1, got {self.speculator_chunk}")
        check(self.max_model_len is None or self.max_model_len >= 1, f"--max-model-len must be >= 1, got {self.max_model_len}")
        check(self.max_prompt_len is None or self.max_prompt_len >= 1, f"--max-prompt-len must be >= 1, got {self.max_prompt_len}")


@dataclass(frozen=True)
class Plan:
    cfg: PlanConfig
    base: ModelShape
    speculator: ModelShape | None  # None at keep 1.0: no speculator runs
    speculator_name: str
    score: ScoreConfig
    tp: int
    quantization: str | None
    dtype: str
    gpu_total_bytes: int
    max_model_len: int  # the base's longest request: kept + generated tokens
    max_prompt_len: int  # the speculator's longest prompt, which its reserve is sized for
    kv_bytes_per_element: int
    base_weights: int  # per GPU
    reserve: Reserve | None  # per GPU
    gpu_memory_utilization: float
    kv_bytes: int  # per GPU
    kv_per_token: int  # per GPU
    kv_tokens: int  # per GPU
    kept_tokens: int  # per prompt: ceil(keep * n)
    longest_max_model_len: int  # the longest max_model_len whose KV fits beside the reserve (0: none)
    limits: tuple[SpeedupLimit, ...]

    @property
    def prompts_at_once(self) -> int:
        return self.kv_tokens // (self.kept_tokens + self.cfg.max_tokens)

    @property
    def full_prompts_at_once(self) -> int:
        return self.kv_tokens // (self.cfg.length + self.cfg.max_tokens)


def speculator_shape(base: ModelShape, model: str, name: str, score: ScoreConfig, quantization: str | None) -> ModelShape:
    """What the speculator loads: a separate model, or the base's layers up to the last scored one (self:K);
    what the vllm engine refuses is refused here by the same function (vllm_refusals.refuse_speculator)."""
    folder = local_folder(model)
    stored = stored_quantization(read_model_config(folder)) if folder else ("quantized" if base.is_quantized else None)
    refuse_speculator(name, model, score, base_quantization(model, stored), base.num_layers)
    k = parse_self(name)
    if k is None:
        return model_shape(name)
    return base.first_layers(score.layers(k or base.num_layers)[-1] + 1)


def default_prompt_len(base: ModelShape, spec: ModelShape, score: ScoreConfig, chunk: int, total_bytes: int,
                       dtype_bytes: int, tp: int, quantization: str | None, kv_element_bytes: int,
                       max_model_len: int) -> int:
    """The default --max-prompt-len, for `spcli plan` and the vllm engine alike: the base's positions where the
    speculator's reserve for them leaves vLLM the KV cache of one max_model_len request, else the longest
    multiple of memory.PROMPT_LEN_STEP that does (the base's positions where none does: the plan says it does
    not fit)."""
    weights = memory.base_weight_bytes_per_gpu(base, tp, quantization)
    kv_per_token = memory.kv_bytes_per_token_per_gpu(base, tp, kv_element_bytes)
    kv_tokens_for = lambda n: memory.kv_tokens_beside(
        memory.speculator_reserve(spec, n, score, dtype_bytes, chunk).total, total_bytes, weights, kv_per_token)
    return memory.default_prompt_len(base.max_position_embeddings, max_model_len, kv_tokens_for) or base.max_position_embeddings


def make_plan(cfg: PlanConfig) -> Plan:
    preset = lookup.PRESETS.get(cfg.model)
    base = model_shape(cfg.model)
    tp = cfg.tp or (preset.tp if preset else 1)
    check(base.num_heads % tp == 0, f"--tp {tp} does not divide {cfg.model}'s {base.num_heads} attention heads")
    quantization = preset.quantization if preset else None
    dtype = lookup.default_dtype(cfg.model)
    name = cfg.speculator or lookup.default_speculator(cfg.model)
    score = profiles.resolve_score(cfg.score, cfg.model, local_folder(cfg.model), name)
    spec = speculator_shape(base, cfg.model, name, score, quantization) if cfg.keep < 1.0 else None
    max_model_len = cfg.max_model_len or (preset.max_model_len if preset else None) or base.max_position_embeddings
    total = int(cfg.gpu_memory_gib * GiB)
    kv_element = memory.KV_CACHE_BYTES.get(cfg.kv_cache_dtype, DTYPE_BYTES[dtype])
    weights = memory.base_weight_bytes_per_gpu(base, tp, quantization)
    kv_per_token = memory.kv_bytes_per_token_per_gpu(base, tp, kv_element)

    max_prompt_len = min(cfg.max_prompt_len or base.max_position_embeddings, base.max_position_embeddings)
    if cfg.max_prompt_len is None and spec is not None:
        max_prompt_len = default_prompt_len(base, spec, score, cfg.speculator_chunk, total, DTYPE_BYTES[dtype], tp,
                                            quantization, kv_element, max_model_len)
    check(cfg.length <= max_prompt_len, f"--length {cfg.length} exceeds max_prompt_len {max_prompt_len}: "
                                         "pass --max-prompt-len (it sizes the speculator's cache)")
    kept = math.ceil(cfg.keep * cfg.length) + cfg.max_tokens
    check(kept <= max_model_len, f"--length {cfg.length} at --keep {cfg.keep:g} needs {kept} KV tokens per request "
                                  f"(kept + --max-tokens), beyond max_model_len {max_model_len}: pass --max-model-len")

    def kv_at() -> tuple[Reserve | None, float, int]:
        """(reserve, utilization, KV bytes per GPU) with the speculator sized for prompts of max_prompt_len."""
        if spec is None:
            util = memory.DEFAULT_GPU_MEMORY_UTILIZATION
            return None, util, memory.kv_cache_bytes_per_gpu(total, util, weights)
        share = memory.speculator_share(spec, score, max_prompt_len, cfg.speculator_chunk, total, DTYPE_BYTES[dtype])
        return share.reserve, share.gpu_memory_utilization, memory.kv_cache_bytes_per_gpu(
            total, share.gpu_memory_utilization, weights)

    reserve, util, kv_bytes = kv_at()
    kv_tokens = memory.kv_capacity_tokens(kv_bytes, kv_per_token)
    placements = (cfg.placement,) if cfg.placement else PLACEMENTS
    limits = () if spec is None else tuple(
        speedup_limit(base, spec, score, cfg.length, cfg.keep, cfg.batch, tp, p) for p in placements)
    return Plan(
        cfg=cfg, base=base, speculator=spec, speculator_name=name, score=score, tp=tp, quantization=quantization,
        dtype=dtype, gpu_total_bytes=total, max_model_len=max_model_len, max_prompt_len=max_prompt_len,
        kv_bytes_per_element=kv_element,
        base_weights=weights, reserve=reserve, gpu_memory_utilization=util, kv_bytes=kv_bytes,
        kv_per_token=kv_per_token, kv_tokens=kv_tokens,
        kept_tokens=math.ceil(cfg.keep * cfg.length),
        longest_max_model_len=min(base.max_position_embeddings, kv_tokens),  # one request of it fits the KV cache
        limits=limits,
    )
