"""`spcli run`: the one place that wires the stages together.

shards -> read (validate, stable ids, duplicate ids) -> engine batch (tokenize, speculate, score,
select, prefill + decode) -> commit parts + manifest. Resume continues after the last committed
row of each shard; a signal commits what is finished and exits 75 (resumable).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli import models
from spcli.config import RunConfig
from spcli.errors import Interrupted, OutputError
from spcli.io import commit
from spcli.io.ids import IdIndex
from spcli.io.manifest import (
    Manifest, ShardProgress, WriterLock, describe_difference, fingerprint, input_identity, manifest_name,
)
from spcli.io.read import check_shard, count_rows, read_records
from spcli.io.records import Record, Shard, discover, shard_kind, where
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
    rows_total: int | None = None


def my_shards(shards: list[Shard]) -> tuple[list[Shard], dict | None]:
    """The shards this process owns: all of them, or its share inside a Slurm array task."""
    from spcli.slurm.tasks import array_task, assign_shards

    task = array_task()
    if task is None:
        return shards, None
    mine = assign_shards([s.path for s in shards], task.index, task.count)
    return [shards[i] for i in mine], {"index": task.index, "count": task.count, "job_id": task.job_id,
                                       "restart_count": task.restart_count}


def prepare_out(out: Path) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError as e:
        raise OutputError(f"{out}: output path exists and is not a directory") from e
    except OSError as e:
        raise OutputError(f"{out}: output directory cannot be created ({e.strerror})") from e
    if not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a directory")
    return out


def fingerprint_fields(cfg: RunConfig, shards: list[Shard], model_path: str) -> dict:
    fields = cfg.fingerprint_fields()
    fields["model_path"] = model_path
    fields["dtype"] = cfg.dtype or models.default_dtype(cfg.model)
    fields["speculator"] = cfg.speculator or models.default_speculator(cfg.model)
    fields["inputs"] = [{k: v for k, v in s.items() if k != "index"} for s in input_identity(shards)]
    return fields


def open_manifest(cfg: RunConfig, out: Path, shards: list[Shard], task: dict | None, model_path: str) -> Manifest:
    fields = fingerprint_fields(cfg, shards, model_path)
    path = out / manifest_name(task["index"] if task else None)
    if cfg.fresh or not path.exists():
        return Manifest(path, cfg.to_dict(), fields, {s.index: ShardProgress(s.path) for s in shards}, task)
    old = Manifest.load(path)
    if old.fingerprint != fingerprint(fields):
        diffs = describe_difference(old.fingerprint_fields, fields)
        what = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not cfg.force:
            raise OutputError(
                f"{out} holds a run with another configuration ({what}); "
                "rerun with --fresh to start over (deletes its outputs) or --force to append anyway"
            )
        log.warning("--force: appending to outputs made with another configuration (%s)", what)
    old.config, old.fingerprint_fields, old.task, old.finished = cfg.to_dict(), fields, task, False
    old.shards = merge_progress(old.shards, shards)
    return old


def merge_progress(old: dict[int, ShardProgress], shards: list[Shard]) -> dict[int, ShardProgress]:
    """This run's shards, each with its committed progress (matched by path); others keep theirs, re-keyed."""
    by_path = {p.path: p for p in old.values()}
    merged = {s.index: by_path.pop(s.path, None) or ShardProgress(s.path) for s in shards}
    key = max([*merged, *old, -1]) + 1
    for prog in by_path.values():  # shards not in this run's inputs: their parts stay committed
        merged[key], key = prog, key + 1
    return merged


def batches(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
    while batch := list(islice(records, size)):
        yield batch


def run(cfg: RunConfig, progress: Progress | None = None) -> RunSummary:
    out = prepare_out(Path(cfg.out))
    all_shards = discover(cfg.inputs, exclude=out)
    shards, task = my_shards(all_shards)
    lock = WriterLock(out, task["index"] if task else None, warn=log.warning)
    with StopRequest(log=log.warning) as stop:
        lock.acquire()
        try:
            return _run_locked(cfg, out, all_shards, shards, task, stop, progress or Progress(total=None))
        except KeyboardInterrupt:
            raise Interrupted("stopped at once by a second SIGINT (the batch in flight was dropped); "
                              "run the same command again to resume") from None
        finally:
            lock.release()


def _run_locked(cfg: RunConfig, out: Path, all_shards: list[Shard], shards: list[Shard], task: dict | None,
                stop: StopRequest, progress: Progress) -> RunSummary:
    model_path = str(models.locate(cfg.model))
    manifest = open_manifest(cfg, out, shards, task, model_path)
    committed = set().union(*_all_committed(out, manifest, strict=task is None))
    missing = sorted(p for p in manifest.committed_parts() if not (out / p).is_file())
    if missing:
        raise OutputError(f"{out}: committed part file(s) missing ({', '.join(missing[:3])}); "
                          "the outputs are incomplete: rerun with --fresh to start over")
    committer = commit.Committer(out, manifest, cfg.output_format, cfg.save_scores, cfg.model,
                                 cfg.commit_interval, committed)
    committer.save()  # first, so that --fresh un-commits the old parts before they are deleted
    # a Slurm task cleans up after its own shards only; a plain run owns every part in the directory
    indices = None if task is None else {s.index for s in shards}
    removed = commit.remove_uncommitted(out, committed, indices, manifest.path.name)
    if removed:
        log.info("removed %d uncommitted file(s) from an earlier run", len(removed))
    todo = [s for s in shards if not manifest.shards[s.index].done]
    warned = set()
    for s in todo:
        if (warning := check_shard(s, cfg.fields)) is not None:
            log.warning("%s", warning)
            warned.add(s.index)
        prog = manifest.shards[s.index]
        prog.total_rows = prog.total_rows if prog.total_rows is not None else count_rows(s)
    ids = rebuild_ids(out, manifest)
    totals = [manifest.shards[s.index].total_rows for s in todo]
    done = sum(manifest.shards[s.index].rows for s in todo)
    progress.start(total=None if None in totals else sum(totals) - done, done=manifest.totals()["rows"])
    paths = {s.index: s.path for s in all_shards} | {i: p.path for i, p in manifest.shards.items()}
    engine = None
    for shard in todo:
        prog = manifest.shards[shard.index]
        try:
            for batch in batches(read_records(shard, cfg.fields, prog.next_row, cfg.max_record_bytes), cfg.batch_size):
                _check_stop(stop, committer, manifest)
                mark_duplicates(batch, ids, paths)
                if engine is None:
                    engine = build_engine(cfg, paths)
                    _check_stop(stop, committer, manifest)
                rows = engine.run_batch(batch)
                assert len(rows) == len(batch), "every record gives exactly one row"
                committer.add(shard.index, batch[-1].row + 1, rows)
                progress.update(rows)
                _check_stop(stop, committer, manifest)
                if committer.due():
                    committer.commit()
        except (Interrupted, OutputError):
            raise
        except Exception:
            committer.commit()  # a file-level problem mid-shard: keep what is finished, then stop
            raise
        committer.commit(shard.index, done=True)
        if prog.rows == 0 and shard.index not in warned:
            log.warning("%s: no records", shard.path)
    committer.save(finished=True)
    progress.close()
    t = manifest.totals()
    return RunSummary(out, t["rows"], t["failed"], t["prompt_tokens"], t["kept_tokens"], manifest.wall_s,
                      len(shards), t["rows_total"])


def _check_stop(stop: StopRequest, committer: commit.Committer, manifest: Manifest) -> None:
    if stop.requested:
        committer.commit()
        t = manifest.totals()
        of = "" if t["rows_total"] is None else f" of {t['rows_total']}"
        raise Interrupted(f"stopped by {stop.signal_name} with {t['rows']}{of} rows committed; "
                          "run the same command again to resume")


def mark_duplicates(batch: list[Record], ids: IdIndex, paths: dict[int, str]) -> None:
    """A repeated id makes an error row naming where the id was first seen (the first occurrence is kept)."""
    for rec in batch:
        first = ids.setdefault(rec.id, rec.shard, rec.row)
        if first is not None and rec.error is None:
            path, first_path = paths[rec.shard], paths.get(first[0], "?")
            rec.error = (f"{where(path, rec.row, shard_kind(path))}: duplicate id {rec.id!r} "
                         f"(first at {where(first_path, first[1], shard_kind(first_path))}); ids must be unique")


def rebuild_ids(out: Path, manifest: Manifest) -> IdIndex:
    """The ids of every committed row, in commit order, so a resumed run still catches duplicates."""
    ids = IdIndex()
    for index, prog in sorted(manifest.shards.items()):
        for name in prog.parts:
            for row_id, row in _part_ids(out / name):
                ids.setdefault(row_id, index, row)
    return ids


def _part_ids(path: Path) -> Iterator[tuple[str, int]]:
    try:
        if path.suffix == ".parquet":
            t = pq.read_table(path, columns=["id", "row"])
            yield from zip(t.column("id").to_pylist(), t.column("row").to_pylist())
            return
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    doc = orjson.loads(line)
                    yield doc["id"], doc["row"]
    except (OSError, pa.ArrowException, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise OutputError(f"{path}: committed part file is unreadable ({e}); rerun with --fresh to start over") from e


def _all_committed(out: Path, mine: Manifest, strict: bool) -> list[set[str]]:
    """Committed part names from this manifest and every other task's manifest in the directory.

    strict: an unreadable manifest is an error (a plain run cleans up every unlisted part, so it must
    know them all); a Slurm task only touches its own shards' parts and can skip it.
    """
    sets = [mine.committed_parts()]
    for p in out.glob("manifest*.json"):
        if p != mine.path:
            try:
                sets.append(Manifest.load(p).committed_parts())
            except OutputError:
                if strict:
                    raise
    return sets


def build_engine(cfg: RunConfig, shard_paths: dict[int, str]):
    if cfg.engine == "hf":
        from spcli.engine.hf import HFEngine

        return HFEngine(cfg, shard_paths, log=log.info)
    from spcli.engine.vllm_engine import VllmEngine

    return VllmEngine(cfg, shard_paths, log=log.info)
