"""What a run says before it starts: the banner, and where a resumed run continues."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spcli.config.run import RunConfig
from spcli.io.shards import Shard
from spcli.models.resolved import ResolvedRun


def banner_lines(run: ResolvedRun, shards: list[Shard], rows_total: int | None, out: Path) -> list[str]:
    """What this run is about to do, one line per part: inputs, model, speculator, keep, engine, output; all of it
    read from the resolved run, the value the fingerprint records."""
    cfg = run.cfg
    score = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cfg.score).items())
    unused = {"keep"} | ({"keep_scale", "keep_min", "keep_max"} if cfg.select.keep != "auto" else set())
    unused |= {"max_unit", "unit_score"} if cfg.select.unit == "chunk" else set()  # fixed chunks read neither
    select = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(cfg.select).items() if k not in unused)
    rows = "rows unknown" if rows_total is None else f"{rows_total} row{'' if rows_total == 1 else 's'}"
    model_path = str(run.model_path)
    model = cfg.model if cfg.model == model_path else f"{cfg.model} ({model_path})"
    return [
        f"inputs: {len(shards)} shard{'' if len(shards) == 1 else 's'}, {rows}",
        f"model: {model}, {cfg.dtype}" + (f" ({run.dtype_why})" if run.dtype_why else ""),
        f"speculator: {run.speculator}{f', {run.scoring}' if run.scoring else ''}{speculator_dtype(run)} ({score})"
        + (" (not used at keep 1.0)" if not cfg.select.prunes else f"; settings from {run.settings_source}"),
        f"keep: {cfg.select.keep} ({select})",
        f"engine: {cfg.engine}, device {run.device}{placement(run)}, {batch_text(cfg)}",
        f"output: {out} ({cfg.output_format})",
        f"groups: {group_rule_text(cfg)}, --group-rule {cfg.group_rule}" if cfg.grouped else "groups: off (each record alone)",
    ]


def speculator_dtype(run: ResolvedRun) -> str:
    """The speculator's dtype where it differs from the model's (--speculator-dtype), and why."""
    if not run.cfg.select.prunes or run.speculator_dtype == run.dtype:
        return ""
    return f", {run.speculator_dtype}" + (f" ({run.speculator_dtype_why})" if run.speculator_dtype_why else "")


def placement(run: ResolvedRun) -> str:
    """Where the speculator runs on --engine vllm (nothing to say on hf: the engine's own process)."""
    cfg = run.cfg
    if cfg.engine != "vllm" or not cfg.select.prunes:
        return ""
    if cfg.vllm.speculator_placement == "workers":
        return ", speculator in vLLM's workers (one replica per GPU)"
    if run.scores_while_vllm_starts:
        return ", speculator in this process, scoring while vLLM starts (--speculator-placement driver)"
    return ", speculator in this process (--speculator-placement driver)"


def group_rule_text(cfg: RunConfig) -> str:
    """How --groups finds a group, for the banner and the run's end."""
    key = f"--group-field {cfg.fields.group}" if cfg.fields.group else "the same prompt text (or messages but the last)"
    where = "wherever they stand in a shard" if cfg.order_free else "one after another in a shard"
    return f"by {key}, {where}, at most {cfg.group_max} a group"


def resume_line(rows_done: int, rows_total: int | None, shard: str, next_row: int, in_order: bool = False) -> str:
    of = "" if rows_total is None else f" of {rows_total}"
    at = f"record {next_row} of its group order (--groups shard)" if in_order else f"row {next_row}"
    return f"resuming: {rows_done}{of} rows done, shard {shard} at {at}"


def batch_text(cfg: RunConfig) -> str:
    if cfg.engine == "hf":
        return f"batch size {cfg.hf_batch}"
    if cfg.batch_size:
        return f"speculator window {cfg.batch_size}"
    return "speculator window from vLLM's capacity and the speculator's batch (--batch-size sets it)"
