"""`spcli run`: the one place that wires the stages together.

shards -> read (validate, stable ids, duplicate ids) -> engine batch (tokenize, speculate, score,
select, prefill + decode) -> commit parts + manifest. Resume continues after the last committed
row of each shard; a signal commits what is finished and exits 75 (resumable).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from spcli import models, retry
from spcli.banner import banner_lines, resume_line
from spcli.batch import num_over_budget, over_budget_warning, run_batch
from spcli.config import RunConfig
from spcli.dtype import resolve_dtype
from spcli.errors import EngineDied, Interrupted, OutputError
from spcli.io import commit
from spcli.io.ids import mark_duplicates, rebuild_ids
from spcli.io.lock import WriterLock
from spcli.io.manifest import (
    Manifest, ShardProgress, describe_difference, fingerprint, input_identity, manifest_name,
)
from spcli.io.read import check_shard, count_rows, read_records
from spcli.io.records import Record, Shard, discover
from spcli.profiles import resolve
from spcli.progress import Progress
from spcli.stop import StopAtSafePoint, StopRequest

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
    rows_this_run: int = 0
    wall_this_run_s: float = 0.0
    nothing_to_do: bool = False  # every shard was already done: the directory was left as it was
    prompt_tokens_this_run: int = 0
    kept_tokens_this_run: int = 0
    retried: int = 0  # --retry-failed: error rows redone
    retried_ok: int = 0  # of them, now without error


def my_shards(shards: list[Shard]) -> tuple[list[Shard], dict | None]:
    """The shards this process owns: all of them, or its share inside a Slurm array task."""
    from spcli.slurm.tasks import array_task, assign_shards

    task = array_task()
    if task is None:
        return shards, None
    mine = assign_shards([s.path for s in shards], task.index, task.count)
    return [shards[i] for i in mine], {"index": task.index, "count": task.count, "job_id": task.job_id,
                                       "restart_count": task.restart_count}


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a directory")


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
    fields["speculator"] = cfg.speculator or models.default_speculator(cfg.model)
    from spcli.device import pick_device
    from spcli.engine.load import CROSS_TOKENIZER, scoring_path

    scoring = scoring_path(Path(model_path), fields["speculator"]) if cfg.select.prunes else None
    if scoring == CROSS_TOKENIZER:  # absent for the same ids, as before: old directories still resume
        fields["scoring"] = scoring

    fields["dtype"] = resolve_dtype(cfg.dtype, cfg.model, pick_device(cfg.device))[0]  # what the models load in
    fields["speculator"] = cfg.speculator or models.default_speculator(cfg.model)
    fields["device_type"] = pick_device(cfg.device).type  # cpu and cuda kernels round bf16 differently
    fields["inputs"] = [{k: v for k, v in s.items() if k != "index"} for s in input_identity(shards)]
    return fields


def open_manifest(cfg: RunConfig, out: Path, shards: list[Shard], task: dict | None, model_path: str) -> Manifest:
    """The manifest to continue: a new one, or the directory's (checked against this configuration).

    A manifest that committed no part holds no outputs, so it never refuses another configuration.
    """
    fields = fingerprint_fields(cfg, shards, model_path)
    path = out / manifest_name(task["index"] if task else None)
    old = None if cfg.fresh or not path.exists() else Manifest.load(path)
    if old is None or not old.committed_parts():
        return Manifest(path, cfg.to_dict(), fields, {s.index: ShardProgress(s.path) for s in shards}, task)
    if old.fingerprint != fingerprint(fields):
        diffs = describe_difference(old.fingerprint_fields, fields)
        what = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not cfg.force:
            raise OutputError(
                f"{out} holds a run with another configuration ({what}); "
                "rerun with --fresh to start over (deletes its outputs) or --force to append anyway"
            )
        if not all(old.shards[i].done for i in old.shards if old.shards[i].path in {s.path for s in shards}):
            log.warning("--force: appending to outputs made with another configuration (%s)", what)
        old.use_config(cfg.to_dict(), fields)  # the parts made so far keep their configuration
    old.task, old.finished = task, False
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
    """Everything that can refuse the start (inputs, model, fields) is checked before the output
    directory is touched; a start that fails before its first commit leaves the directory as it was."""
    out = Path(cfg.out)
    check_out(out)
    all_shards = discover(cfg.inputs, exclude=out)
    shards, task = my_shards(all_shards)
    model_path = str(models.locate(cfg.model))
    speculator = cfg.speculator or models.default_speculator(cfg.model)
    cfg = resolve(cfg, cfg.model, Path(model_path), speculator)
    from spcli.engine.load import pick_device

    dtype, dtype_why = resolve_dtype(cfg.dtype, cfg.model, pick_device(cfg.device))
    cfg = dataclasses.replace(cfg, dtype=dtype)  # every engine loads what the fingerprint records
    if cfg.select.prunes and speculator != "self" and not speculator.startswith("self:"):
        models.locate(speculator)
    warnings = {s.index: check_shard(s, cfg.fields) for s in shards}
    existed = out.exists()
    prepare_out(out)
    lock = WriterLock(out, task["index"] if task else None, warn=log.warning)
    try:
        with StopRequest(log=log.warning) as stop:
            lock.acquire()
            try:
                return _run_locked(cfg, out, all_shards, shards, task, stop, progress or Progress(total=None),
                                   model_path, warnings, dtype_why)
            except KeyboardInterrupt:
                raise Interrupted("stopped at once by a second SIGINT (the batch in flight was dropped); "
                                  "run the same command again to resume") from None
            finally:
                lock.release()
    except BaseException:
        if not existed:
            _remove_if_empty(out)
        raise


def _remove_if_empty(out: Path) -> None:
    try:
        out.rmdir()  # only an empty directory: one this run created and never committed to
    except OSError:
        pass


def _run_locked(cfg: RunConfig, out: Path, all_shards: list[Shard], shards: list[Shard], task: dict | None,
                stop: StopRequest, progress: Progress, model_path: str, warnings: dict[int, str | None],
                dtype_why: str = "") -> RunSummary:
    manifest = open_manifest(cfg, out, shards, task, model_path)
    committed = set().union(*_all_committed(out, manifest, strict=task is None))
    missing = sorted(p for p in manifest.committed_parts() if not (out / p).is_file())
    if missing:
        raise OutputError(f"{out}: committed part file(s) missing ({', '.join(missing[:3])}); "
                          "the outputs are incomplete: rerun with --fresh to start over")
    todo = [s for s in shards if not manifest.shards[s.index].done]
    before = manifest.totals()
    failed = retry.find_failed(out, manifest, shards) if cfg.retry_failed else {}
    if not todo and not failed:  # a finished directory: report, and leave its manifest as it is
        return RunSummary(out, before["rows"], before["failed"], before["prompt_tokens"], before["kept_tokens"],
                          manifest.wall_s, len(shards), before["rows_total"], nothing_to_do=True)
    warned = set()
    for s in todo:
        if warnings.get(s.index) is not None:
            log.warning("%s", warnings[s.index])
            warned.add(s.index)
        prog = manifest.shards[s.index]
        prog.total_rows = prog.total_rows if prog.total_rows is not None else count_rows(s)
    rows_total = manifest.totals()["rows_total"]
    from spcli.engine.load import SAME_TOKENIZER

    scoring = manifest.fingerprint_fields.get("scoring", SAME_TOKENIZER if cfg.select.prunes else None)
    for line in banner_lines(cfg, shards, rows_total, model_path, out, scoring, dtype_why):
        log.info("%s", line)
    if before["rows"] and todo:
        first = todo[0]
        log.info("%s", resume_line(before["rows"], rows_total, first.path, manifest.shards[first.index].next_row))
    committer = commit.Committer(out, manifest, cfg.output_format, cfg.save_scores, cfg.model,
                                 cfg.commit_interval, committed)
    engine = None
    if cfg.fresh and manifest.path.exists():
        engine = build_engine(cfg)  # before anything is deleted: a model that cannot load leaves the old outputs
        committer.save()  # first, so that --fresh un-commits the old parts before they are deleted
    # a Slurm task cleans up after its own shards only; a plain run owns every part in the directory
    indices = None if task is None else {s.index for s in shards}
    removed = commit.remove_uncommitted(out, committed, indices, manifest.path.name)
    if removed:
        log.info("removed %d uncommitted file(s) from an earlier run", len(removed))
    ids = rebuild_ids(out, manifest)
    totals = [manifest.shards[s.index].total_rows for s in todo]
    done = sum(manifest.shards[s.index].rows for s in todo)
    num_failed = sum(map(len, failed.values()))
    progress.start(total=None if None in totals else sum(totals) - done + num_failed, done=before["rows"])
    paths = {s.index: s.path for s in all_shards} | {i: p.path for i, p in manifest.shards.items()}
    retried = retry.Retried()
    if failed:
        log.info("retrying %d failed row%s", num_failed, "" if num_failed == 1 else "s")

        def get_engine():
            nonlocal engine
            engine = engine or build_engine(cfg)
            return engine

        retried = retry.retry_failed(cfg, out, manifest, committer, shards, failed, ids, paths, get_engine, stop,
                                     lambda: _check_stop(stop, committer, manifest), progress)
    over_budget = 0
    for shard in todo:
        prog = manifest.shards[shard.index]
        try:
            for batch in batches(read_records(shard, cfg.fields, prog.next_row, cfg.max_record_bytes), cfg.batch_size):
                _check_stop(stop, committer, manifest)
                mark_duplicates(batch, ids, paths)
                if engine is None:
                    engine = build_engine(cfg)
                    _check_stop(stop, committer, manifest)
                try:
                    rows = run_batch(engine, batch, cfg, paths, on_stage=progress.stage, should_stop=stop.is_urgent)
                except StopAtSafePoint:
                    log.warning("the batch in flight (%d rows) was dropped at a safe point; it is redone on resume",
                                len(batch))
                    _check_stop(stop, committer, manifest)
                    raise
                except EngineDied as e:
                    if stop.requested:  # the signal reached the engine's own processes as well
                        raise Interrupted(f"{e.stopped_message}; committed rows are safe: "
                                          "run the same command again to resume") from e
                    raise
                assert len(rows) == len(batch), "every record gives exactly one row"
                over_budget += num_over_budget(batch, rows, cfg.select)
                committer.add(shard.index, batch[-1].row + 1, rows)
                progress.update(rows)
                _check_stop(stop, committer, manifest)
                if committer.due():
                    committer.commit()
        except (Interrupted, OutputError):
            raise
        except Exception:
            if committer.has_rows:
                committer.commit()  # a file-level problem mid-shard: keep what is finished, then stop
            raise
        committer.commit(shard.index, done=True)
        if prog.rows == 0 and shard.index not in warned:
            log.warning("%s: no records", shard.path)
    if over_budget:
        log.warning("%s", over_budget_warning(over_budget, progress.rows - progress.failed, cfg.select))
    committer.save(finished=True)
    progress.close()
    t = manifest.totals()
    return RunSummary(out, t["rows"], t["failed"], t["prompt_tokens"], t["kept_tokens"], manifest.wall_s,
                      len(shards), t["rows_total"], t["rows"] - before["rows"], committer.elapsed_s,
                      prompt_tokens_this_run=progress.prompt_tokens, kept_tokens_this_run=progress.kept_tokens,
                      retried=retried.rows, retried_ok=retried.fixed)


def _check_stop(stop: StopRequest, committer: commit.Committer, manifest: Manifest) -> None:
    if stop.requested:
        if committer.has_rows:
            committer.commit()
        t = manifest.totals()
        of = "" if t["rows_total"] is None else f" of {t['rows_total']}"
        raise Interrupted(f"stopped by {stop.signal_name} with {t['rows']}{of} rows committed; "
                          "run the same command again to resume")


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


def build_engine(cfg: RunConfig):
    if cfg.engine == "hf":
        from spcli.engine.hf import HFEngine

        return HFEngine(cfg, log=log.info)
    from spcli.engine.vllm_engine import VllmEngine

    return VllmEngine(cfg, log=log.info)
