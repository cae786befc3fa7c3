"""`spcli plan`: the per-GPU memory plan and the speed-up limit, from configs, without loading weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spcli import models, profiles
from spcli.config import SPECULATOR_CHUNK, ScoreConfig, _check
from spcli.engine.load import parse_self
from spcli.engine.vllm_args import read_model_config
from spcli.engine.vllm_refusals import base_quantization, refuse_speculator, stored_quantization
from spcli.errors import ConfigError
from spcli.plan import memory
from spcli.plan.configs import local_folder, model_shape
from spcli.plan.flops import PLACEMENTS, SpeedupLimit, speedup_limit
from spcli.plan.memory import GiB, Reserve
from spcli.plan.shapes import DTYPE_BYTES, ModelShape

KV_CACHE_DTYPES = ("auto", "fp8")
LENGTH_STEP = 1024  # the longest max_model_len is searched in steps of this


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
    score: ScoreConfig = field(default_factory=ScoreConfig)  # unset fields: the model's defaults

    def __post_init__(self) -> None:
        _check(self.tp is None or self.tp >= 1, f"--tp must be >= 1, got {self.tp}")
        _check(self.gpu_memory_gib > 0, f"--gpu-memory must be > 0 GiB, got {self.gpu_memory_gib}")
        _check(self.length >= 1, f"--length must be >= 1, got {self.length}")
        _check(0.0 < self.keep <= 1.0, f"--keep must be in (0, 1], got {self.keep}")
        _check(self.batch >= 1, f"--batch must be >= 1, got {self.batch}")
        _check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(self.placement is None or self.placement in PLACEMENTS,
               f"--placement must be driver or workers, got {self.placement!r}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES, f"--kv-cache-dtype must be auto or fp8, got {self.kv_cache_dtype!r}")
        _check(self.speculator_chunk >= 1, f"--speculator-chunk must be >= 1, got {self.speculator_chunk}")
        _check(self.max_model_len is None or self.max_model_len >= 1, f"--max-model-len must be >= 1, got {self.max_model_len}")


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
    max_model_len: int
    kv_bytes_per_element: int
    base_weights: int  # per GPU
    reserve: Reserve | None  # per GPU
    gpu_memory_utilization: float
    kv_bytes: int  # per GPU
    kv_per_token: int  # per GPU
    kv_tokens: int  # per GPU
    kept_tokens: int  # per prompt: ceil(keep * n)
    longest_max_model_len: int  # the longest max_model_len whose KV fits, the reserve sized for it (0: none)
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


def make_plan(cfg: PlanConfig) -> Plan:
    preset = models.PRESETS.get(cfg.model)
    base = model_shape(cfg.model)
    tp = cfg.tp or (preset.tp if preset else 1)
    _check(base.num_heads % tp == 0, f"--tp {tp} does not divide {cfg.model}'s {base.num_heads} attention heads")
    quantization = preset.quantization if preset else None
    dtype = models.default_dtype(cfg.model)
    name = cfg.speculator or models.default_speculator(cfg.model)
    score = profiles.resolve_score(cfg.score, cfg.model, local_folder(cfg.model), name)
    spec = speculator_shape(base, cfg.model, name, score, quantization) if cfg.keep < 1.0 else None
    max_model_len = cfg.max_model_len or (preset.max_model_len if preset else None) or base.max_position_embeddings
    _check(cfg.length <= max_model_len, f"--length {cfg.length} exceeds max_model_len {max_model_len}: "
                                        "pass --max-model-len (it sizes the speculator's cache)")
    total = int(cfg.gpu_memory_gib * GiB)
    kv_element = memory.KV_CACHE_BYTES.get(cfg.kv_cache_dtype, DTYPE_BYTES[dtype])
    weights = memory.base_weight_bytes_per_gpu(base, tp, quantization)
    kv_per_token = memory.kv_bytes_per_token_per_gpu(base, tp, kv_element)

    def kv_at(num_tokens: int) -> tuple[Reserve | None, float, int]:
        """(reserve, utilization, KV bytes per GPU) with the speculator sized for prompts of num_tokens."""
        if spec is None:
            util = memory.DEFAULT_GPU_MEMORY_UTILIZATION
            return None, util, memory.kv_cache_bytes_per_gpu(total, util, weights)
        share = memory.speculator_share(spec, score, num_tokens, cfg.speculator_chunk, total, DTYPE_BYTES[dtype])
        return share.reserve, share.gpu_memory_utilization, memory.kv_cache_bytes_per_gpu(
            total, share.gpu_memory_utilization, weights)

    reserve, util, kv_bytes = kv_at(max_model_len)
    placements = (cfg.placement,) if cfg.placement else PLACEMENTS
    limits = () if spec is None else tuple(
        speedup_limit(base, spec, score, cfg.length, cfg.keep, cfg.batch, tp, p) for p in placements)
    return Plan(
        cfg=cfg, base=base, speculator=spec, speculator_name=name, score=score, tp=tp, quantization=quantization,
        dtype=dtype, gpu_total_bytes=total, max_model_len=max_model_len, kv_bytes_per_element=kv_element,
        base_weights=weights, reserve=reserve, gpu_memory_utilization=util, kv_bytes=kv_bytes,
        kv_per_token=kv_per_token, kv_tokens=memory.kv_capacity_tokens(kv_bytes, kv_per_token),
        kept_tokens=math.ceil(cfg.keep * cfg.length),
        longest_max_model_len=_longest(base.max_position_embeddings, lambda n: _fits(kv_at, n, kv_per_token)),
        limits=limits,
    )


def _fits(kv_at, num_tokens: int, kv_per_token: int) -> bool:
    """vLLM starts only when one request of max_model_len tokens fits in the KV cache."""
    try:
        return memory.kv_capacity_tokens(kv_at(num_tokens)[2], kv_per_token) >= num_tokens
    except ConfigError:  # the speculator leaves too little of the GPU
        return False


def _longest(max_positions: int, fits) -> int:
    """The largest multiple of LENGTH_STEP up to max_positions (or max_positions itself) that fits; 0 if none.
    fits is monotone: a longer max_model_len needs more KV and a larger speculator reserve."""
    if fits(max_positions):
        return max_positions
    lo, hi = 0, max_positions // LENGTH_STEP  # fits(lo * STEP) assumed (0 trivially), fits(hi * STEP) unknown
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * LENGTH_STEP) else (lo, mid - 1)
    return lo * LENGTH_STEP
