"""`spcli run`: the one place that wires the stages together.

shards -> read (validate, stable ids) -> engine batch (tokenize, speculate, score, select,
prefill + decode) -> write part -> commit manifest. Resume continues after the last committed
row of each shard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from spcli import models
from spcli.config import RunConfig
from spcli.errors import Interrupted, OutputError
from spcli.io import commit
from spcli.io.manifest import (
    Manifest, ShardProgress, WriterLock, describe_difference, input_identity, manifest_name,
)
from spcli.io.read import count_rows, read_records
from spcli.io.records import Record, Shard, discover
from spcli.progress import Progress
from spcli.stop import StopRequest

log = logging.getLogger("spcli")


@dataclass
class RunSummary:
    out: Path
    rows: int
    failed: int
    prompt_tokens: int
    kept_tokens: int
    wall_s: float
    shards: int


def my_shards(shards: list[Shard]) -> tuple[list[Shard], dict | None]:
    """The shards this process owns: all of them, or its share inside a Slurm array task."""
    from spcli.slurm.tasks import array_task, assign_shards

    task = array_task()
    if task is None:
        return shards, None
    mine = assign_shards([s.path for s in shards], task.index, task.count)
    return [shards[i] for i in mine], {"index": task.index, "count": task.count, "job_id": task.job_id,
                                       "restart_count": task.restart_count}


def open_manifest(cfg: RunConfig, out: Path, shards: list[Shard], task: dict | None, model_path: str) -> Manifest:
    fields = cfg.fingerprint_fields()
    fields["model_path"] = model_path
    fields["inputs"] = [{k: v for k, v in s.items() if k != "index"} for s in input_identity(shards)]
    path = out / manifest_name(task["index"] if task else None)
    fresh = {s.index: ShardProgress(s.path) for s in shards}
    if path.exists() and not cfg.fresh:
        old = Manifest.load(path)
        if old.fingerprint != Manifest(path, {}, fields, {}).fingerprint and not cfg.force:
            diffs = describe_difference(old.fingerprint_fields, fields)
            raise OutputError(
                f"{out} holds a run with another configuration ({'; '.join(diffs[:5])}); "
                "rerun with --fresh to start over (deletes its outputs) or --force to append anyway"
            )
        old.config, old.fingerprint_fields, old.task = cfg.to_dict(), fields, task
        for idx, prog in fresh.items():
            old.shards.setdefault(idx, prog)
        return old
    if cfg.fresh:
        mine = {s.index for s in shards}
        for p in out.glob("part-*"):
            if commit.part_shard(p.name) in mine:
                p.unlink()
        path.unlink(missing_ok=True)
    return Manifest(path, cfg.to_dict(), fields, fresh, task)


def batches(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
    while batch := list(islice(records, size)):
        yield batch


def run(cfg: RunConfig, progress: Progress | None = None) -> RunSummary:
    t0 = time.perf_counter()
    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".spcli-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(f"{out}: output directory is not writable ({e.strerror})") from e
    all_shards = discover(cfg.inputs)
    shards, task = my_shards(all_shards)
    lock = WriterLock(out, task["index"] if task else None, warn=log.warning)
    lock.acquire()
    try:
        model_path = str(models.locate(cfg.model))
        manifest = open_manifest(cfg, out, shards, task, model_path)
        removed = commit.remove_uncommitted(
            out, {p for m in _all_committed(out, manifest) for p in m}, {s.index for s in shards}
        )
        if removed:
            log.info("removed %d uncommitted part file(s) from an interrupted run", len(removed))
        manifest.save()
        progress = progress or Progress(total=None)
        todo = [s for s in shards if not manifest.shards[s.index].done]
        progress.start(total=_total_rows(todo, manifest), done=0)
        engine = None
        with StopRequest(log=log.warning) as stop:
            for shard in todo:
                prog = manifest.shards[shard.index]
                for batch in batches(read_records(shard, cfg.fields, prog.next_row), cfg.batch_size):
                    if engine is None:
                        engine = build_engine(cfg, {s.index: s.path for s in all_shards})
                    rows = engine.run_batch(batch)
                    assert len(rows) == len(batch), "every record gives exactly one row"
                    name = commit.part_name(shard.index, len(prog.parts), "parquet" if cfg.output_format == "parquet" else "jsonl")
                    commit.write_part(out, name, rows, cfg.output_format, cfg.save_scores)
                    prog.parts.append(name)
                    prog.next_row = batch[-1].row + 1
                    prog.rows += len(rows)
                    prog.failed += sum(r.error is not None for r in rows)
                    prog.prompt_tokens += sum(r.num_prompt_tokens for r in rows)
                    prog.kept_tokens += sum(r.num_kept_tokens for r in rows)
                    manifest.wall_s += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    manifest.save()
                    progress.update(rows)
                    if stop.requested:
                        raise Interrupted(f"stopped by {stop.signal_name}; committed through {shard.path} row {prog.next_row}; run the same command again to resume")
                prog.done = True
                manifest.save()
        manifest.finished = True
        manifest.wall_s += time.perf_counter() - t0
        manifest.save()
        progress.close()
        t = manifest.totals()
        return RunSummary(out, t["rows"], t["failed"], t["prompt_tokens"], t["kept_tokens"], manifest.wall_s, len(shards))
    finally:
        lock.release()


def _all_committed(out: Path, mine: Manifest) -> list[set[str]]:
    """Committed part names from this manifest and every other task's manifest in the directory."""
    sets = [mine.committed_parts()]
    for p in out.glob("manifest*.json"):
        if p != mine.path:
            try:
                sets.append(Manifest.load(p).committed_parts())
            except OutputError:
                continue
    return sets


def _total_rows(shards: list[Shard], manifest: Manifest) -> int | None:
    total = 0
    for s in shards:
        n = count_rows(s)
        if n is None:
            return None
        total += max(0, n - manifest.shards[s.index].rows)
    return total


def build_engine(cfg: RunConfig, shard_paths: dict[int, str]):
    if cfg.engine == "hf":
        from spcli.engine.hf import HFEngine

        return HFEngine(cfg, shard_paths, log=log.info)
    from spcli.errors import NotImplementedFeature

    raise NotImplementedFeature("--engine vllm is not wired into `spcli run` yet; use --engine hf")
