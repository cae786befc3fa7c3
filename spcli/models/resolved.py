"""A run resolved once, before anything loads: what every later stage reads instead of deriving it again.

`resolve_run(cfg)` answers each question about a RunConfig once: the base model's folder (lookup.locate), the
speculator (lookup.default_speculator) and, where a separate one will run, its folder; the scoring settings
and where they came from (spcli.models.profiles); the device (spcli.models.device, NVML only) and the dtype and why
(spcli.models.dtype, per engine) and the speculator's; where the vLLM engine's speculator runs (`placement_for`); and which path scores
the base's tokens. It reads configs and tokenizers, no
weights. The banner, the manifest's fingerprint, the vLLM engine's memory plan and both engines read the
ResolvedRun; none of them locates or picks anything again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from spcli.config.run import RunConfig
from spcli.models import lookup, profiles
from spcli.models.device import pick_device
from spcli.models.dtype import resolve_dtype, resolve_speculator_dtype
from spcli.models.files import max_positions_of, read_config
from spcli.models.positions import check_base_positions
from spcli.models.speculator import parse_self, scoring_path


@dataclass(frozen=True)
class ResolvedRun:
    cfg: RunConfig  # score, the selection chunk and dtype filled in: what every stage runs with
    model_path: Path  # the base model's folder
    speculator: str  # a preset name, a folder, an HF id, "self" or "self:K" (named even where keep 1.0 runs none)
    speculator_path: Path | None  # a separate speculator's folder; None for self/self:K and at keep 1.0 (not located)
    dtype_why: str  # how cfg.dtype was picked (spcli.models.dtype.resolve_dtype)
    device: torch.device  # --device resolved: the hf engine's, the vLLM driver speculator's
    settings_source: str  # where the scoring settings came from: flags, a profile, a preset or a fallback
    scoring: str | None  # which path scores the base's tokens (load.SAME_TOKENIZER / CROSS_TOKENIZER); None at keep 1.0
    speculator_dtype_why: str = ""  # how cfg.speculator_dtype was picked (spcli.models.dtype.resolve_speculator_dtype)
    is_speculator_dtype_auto: bool = False  # --speculator-dtype auto: job.manifest may resolve it against a directory

    @property
    def dtype(self) -> str:
        return self.cfg.dtype

    @property
    def speculator_dtype(self) -> str:
        return self.cfg.speculator_dtype or self.cfg.dtype

    @property
    def prunes(self) -> bool:
        return self.cfg.select.prunes

    @property
    def scores_while_vllm_starts(self) -> bool:
        """The vLLM engine's speculator is in this process on the CPU: vLLM starts on a thread of its own and the
        job loop scores meanwhile (vllm_start.py). What the banner says and the engine does."""
        return self.cfg.engine == "vllm" and self.cfg.vllm.speculator_placement == "driver" and self.device.type == "cpu"


def placement_for(setting: str, device: torch.device, overlap: str) -> str:
    """--speculator-placement auto: `workers` on GPUs (a replica per GPU, each scoring its share) and wherever
    --speculator-overlap is on (the replicas' own threads); `driver` on a CPU, whose cores vLLM's workers and
    this process share anyway, and where the driver's copy scores while vLLM starts (vllm_engine.py)."""
    if setting != "auto":
        return setting
    return "workers" if device.type != "cpu" or overlap == "on" else "driver"


def resolve_run(cfg: RunConfig) -> ResolvedRun:
    """`cfg` resolved; a model or speculator that is not on this machine is refused here (a keep 1.0 run never
    locates its speculator)."""
    model_path = lookup.locate(cfg.model)
    speculator = cfg.speculator or lookup.default_speculator(cfg.model)
    cfg, source = profiles.resolve_with_source(cfg, cfg.model, model_path, speculator)
    device = pick_device(cfg.device)
    dtype, dtype_why = resolve_dtype(cfg.dtype, cfg.model, device, engine=cfg.engine)
    is_spec_auto = cfg.speculator_dtype in (None, "auto")
    spec_dtype, spec_why = resolve_speculator_dtype(cfg.speculator_dtype, dtype, device)
    cfg = dataclasses.replace(cfg, dtype=dtype, speculator_dtype=spec_dtype)  # what every engine loads, and the fingerprint records
    placement = placement_for(cfg.vllm.speculator_placement, device, cfg.vllm.speculator_overlap)
    cfg = dataclasses.replace(cfg, vllm=dataclasses.replace(cfg.vllm, speculator_placement=placement))
    prunes = cfg.select.prunes
    if prunes:
        base_config = read_config(model_path)
        check_base_positions(base_config, max_positions_of(base_config), cfg.model)
    speculator_path = lookup.locate(speculator) if prunes and parse_self(speculator) is None else None
    scoring = scoring_path(model_path, speculator, speculator_path) if prunes else None
    return ResolvedRun(cfg, model_path, speculator, speculator_path, dtype_why, device, source, scoring, spec_why,
                       is_spec_auto)
