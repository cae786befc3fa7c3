"""What a run says before it starts: the banner, and where a resumed run continues."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spcli import models, profiles
from spcli.config import RunConfig
from spcli.io.records import Shard


def banner_lines(cfg: RunConfig, shards: list[Shard], rows_total: int | None, model_path: str, out: Path,
                 scoring: str | None = None, dtype_why: str = "") -> list[str]:
    """What this run is about to do, one line per part: inputs, model, speculator, keep, engine, output.
    `scoring`: which path scores the base's tokens (spcli.engine.load.scoring_path), when the speculator runs;
    dtype_why: how cfg.dtype was picked (spcli.dtype.resolve_dtype)."""
    from spcli.device import pick_device

    speculator = cfg.speculator or models.default_speculator(cfg.model)
    score = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cfg.score).items())
    unused = {"keep"} | ({"keep_scale", "keep_min", "keep_max"} if cfg.select.keep != "auto" else set())
    unused |= {"max_unit", "unit_score"} if cfg.select.unit == "chunk" else set()  # fixed chunks read neither
    select = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cfg.select).items() if k not in unused)
    rows = "rows unknown" if rows_total is None else f"{rows_total} row{'' if rows_total == 1 else 's'}"
    model = cfg.model if cfg.model == model_path else f"{cfg.model} ({model_path})"
    source = profiles.settings_source(cfg.score, cfg.select, cfg.model, Path(model_path), speculator)
    return [
        f"inputs: {len(shards)} shard{'' if len(shards) == 1 else 's'}, {rows}",
        f"model: {model}, {cfg.dtype}" + (f" ({dtype_why})" if dtype_why else ""),
        f"speculator: {speculator}{f', {scoring}' if scoring else ''} ({score})"
        + (" (not used at keep 1.0)" if not cfg.select.prunes else f"; settings from {source}"),
        f"keep: {cfg.select.keep} ({select})",
        f"engine: {cfg.engine}, device {pick_device(cfg.device)}{placement(cfg)}, batch size {cfg.batch_size}",
        f"output: {out} ({cfg.output_format})",
    ]


def placement(cfg: RunConfig) -> str:
    """Where the speculator runs on --engine vllm (nothing to say on hf: the engine's own process)."""
    if cfg.engine != "vllm" or not cfg.select.prunes:
        return ""
    if cfg.vllm.speculator_placement == "workers":
        return ", speculator in vLLM's workers (one replica per GPU)"
    return ", speculator in this process (--speculator-placement driver)"


def resume_line(rows_done: int, rows_total: int | None, shard: str, next_row: int) -> str:
    of = "" if rows_total is None else f" of {rows_total}"
    return f"resuming: {rows_done}{of} rows done, shard {shard} at row {next_row}"
