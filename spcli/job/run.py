"""`spcli run`: the one place that wires the stages together.

shards -> read (validate, stable ids, duplicate ids) -> engine batch (tokenize, speculate, score,
select, prefill + decode) -> commit parts + manifest. Resume continues after the last committed
row of each shard; a signal commits what is finished and exits 75 (resumable).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson

from spcli.config.run import RunConfig
from spcli.errors import Interrupted, OutputError, StopAtSafePoint
from spcli.io import commit
from spcli.io.count import count_rows
from spcli.io.ids import mark_duplicates, rebuild_ids
from spcli.io.lock import WriterLock
from spcli.io.manifest import (
    Manifest,
)
from spcli.io.outdir import check_not_ray, check_out, prepare_out
from spcli.io.groups import Whole, after, own_rows
from spcli.io.read import check_shard, first_record
from spcli.io.records import Record
from spcli.io.shards import Shard, discover
from spcli.job import retry
from spcli.job.banner import banner_lines, resume_line
from spcli.job.batch import note_warnings, row_notes, run_batch, sharing_line
from spcli.job.manifest import fingerprint_fields, groups_for, open_manifest, speculator_dtype_for
from spcli.job.progress import Progress
from spcli.job.reading import shard_records
from spcli.job.shares import WorkerShare, my_shards
from spcli.job.stop import StopRequest
from spcli.job.summary import RunSummary
from spcli.models.resolved import ResolvedRun, resolve_run

log = logging.getLogger("spcli")


def batches(records: Iterator[Record], size: int, group_max: int | None = None) -> Iterator[list[Record]]:
    """Batches of `size` records, each extended to the end of its last group (never cut inside one)."""
    whole = Whole(records, group_max or 1, is_on=group_max is not None)
    while batch := whole.take(size):
        yield batch


def run(cfg: RunConfig, progress: Progress | None = None, share: WorkerShare | None = None) -> RunSummary:
    """Everything that can refuse the start (inputs, model, fields) is checked before the output
    directory is touched; a start that fails before its first commit leaves the directory as it was.
    A Ray job (`cfg.ray` set) is started by spcli.api.run on spcli/ray/driver.py, whose actors call this with
    their share."""
    assert cfg.ray is None or share is not None, "a Ray job starts through spcli.api.run (spcli.ray.driver)"
    out = Path(cfg.out)
    check_out(out)
    if share is None:
        check_not_ray(out)
    all_shards = discover(cfg.inputs, exclude=out)
    shards, task = my_shards(all_shards, share)
    resolved = resolve_run(cfg)  # once, before anything loads: what the banner, fingerprint and engines read
    cfg = resolved.cfg
    warnings = {s.index: check_shard(s, cfg.fields) for s in shards}
    pass_through = _pass_through(cfg, shards)
    existed = out.exists()
    prepare_out(out)
    lock = WriterLock(out, task["index"] if task else None, warn=log.warning,
                      job=task.get("job_id") if share is not None else None)
    try:
        with StopRequest(log=log.warning) as stop:
            lock.acquire()
            try:
                return _run_locked(resolved, out, all_shards, shards, task, stop, progress or Progress(total=None),
                                   warnings, pass_through, share)
            except KeyboardInterrupt:
                raise Interrupted("stopped at once by a second SIGINT (the batch in flight was dropped); "
                                  "run the same command again to resume") from None
            finally:
                lock.release()
    except BaseException:
        if not existed:
            _remove_if_empty(out)
        raise


def _pass_through(cfg: RunConfig, shards: list[Shard]):
    """--pass-through: its columns checked against every shard (before the output directory is touched)."""
    if not cfg.pass_through:
        return None
    from spcli.io import passthrough

    passthrough.check_columns(cfg.pass_through)
    for s in shards:
        passthrough.check_shard(s, cfg.pass_through, first_record(s))
    return passthrough.PassThrough(cfg.pass_through, cfg.max_record_bytes)


def _remove_if_empty(out: Path) -> None:
    try:
        out.rmdir()  # only an empty directory: one this run created and never committed to
    except OSError:
        pass


def _run_locked(resolved: ResolvedRun, out: Path, all_shards: list[Shard], shards: list[Shard], task: dict | None,
                stop: StopRequest, progress: Progress, warnings: dict[int, str | None], pass_through=None,
                share: WorkerShare | None = None) -> RunSummary:
    resolved = speculator_dtype_for(groups_for(resolved, out, task), out, task)
    cfg = resolved.cfg
    manifest = open_manifest(resolved, out, shards, task, all_shards if share is not None else None)
    make_engine = build_engine if share is None else lambda r: kept_engine(share.engines, r)
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
    for line in banner_lines(resolved, shards, rows_total, out):
        log.info("%s", line)
    if before["rows"] and todo:
        first = todo[0]
        prog = manifest.shards[first.index]
        log.info("%s", resume_line(before["rows"], rows_total, first.path, prog.next_row, prog.order is not None))
    committer = commit.Committer(out, manifest, cfg.output_format, cfg.save_scores, cfg.model,
                                 cfg.commit_interval, committed, pass_through)
    engine = None
    old_parts: set[str] = set()  # --fresh: the parts the directory's manifest had committed
    if cfg.fresh and manifest.path.exists():
        engine = make_engine(resolved)  # before anything is deleted: a model that cannot load leaves the old outputs
        old_parts = _committed_before(manifest.path)
        committer.save()  # first, so that --fresh un-commits the old parts before they are deleted
    # a Slurm task cleans up after its own shards only; a plain run owns every part in the directory
    indices = None if task is None else {s.index for s in shards}
    removed = commit.remove_uncommitted(out, committed, indices, manifest.path.name)
    outputs = [name for name in removed if name in old_parts]
    if outputs:
        log.info("--fresh: removed the %d committed output file%s of the earlier run", len(outputs),
                 "" if len(outputs) == 1 else "s")
    if len(removed) > len(outputs):
        log.info("removed %d uncommitted file(s) from an earlier run", len(removed) - len(outputs))
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
            engine = engine or make_engine(resolved)
            return engine

        retried = retry.retry_failed(cfg, out, manifest, committer, shards, failed, ids, paths, get_engine, stop,
                                     lambda: _check_stop(stop, committer, manifest), progress)
    notes: Counter = Counter()  # batch.row_notes, said at the run's end
    if todo and cfg.engine == "vllm":  # the streaming job loop (spcli/job/loop.py): vLLM kept full across shards
        from spcli.job.loop import stream_shards

        engine = engine or make_engine(resolved)
        _check_stop(stop, committer, manifest)
        notes = stream_shards(engine, cfg, todo, manifest, committer, ids, paths, stop, progress, warned,
                              lambda: _check_stop(stop, committer, manifest), notes)
        todo = []
    for shard in todo:
        prog = manifest.shards[shard.index]
        with committer.keeping_finished_rows(lambda: stop.requested):
            for batch in batches(shard_records(shard, prog, cfg, notes), cfg.hf_batch, cfg.grouped):
                _check_stop(stop, committer, manifest)
                mark_duplicates(batch, ids, paths)
                if engine is None:
                    engine = make_engine(resolved)
                    _check_stop(stop, committer, manifest)
                try:
                    rows = run_batch(engine, batch, cfg, paths, on_stage=progress.stage, should_stop=stop.is_urgent)
                except StopAtSafePoint:
                    log.warning("the batch in flight (%d rows) was dropped at a safe point; it is redone on resume",
                                len(batch))
                    _check_stop(stop, committer, manifest)
                    raise
                assert len(rows) == len(batch), "every record gives exactly one row"
                batch, rows = own_rows(batch, rows)  # a group's records before the resume point made theirs before
                notes += row_notes(batch, rows, cfg.select)
                committer.add(shard.index, after(batch[-1]), rows)
                progress.update(rows)
                _check_stop(stop, committer, manifest)
                if committer.due():
                    committer.commit()
        committer.commit(shard.index, done=True)
        if prog.rows == 0 and shard.index not in warned:
            log.warning("%s: no records", shard.key)
    if (line := sharing_line(notes, cfg)) is not None:
        log.info("%s", line)
        for key, count in notes.items():  # for spcli inspect's summary
            if key.startswith(("rows ", "groups ")) and count:
                manifest.sharing[key] = manifest.sharing.get(key, 0) + count
    for warning in note_warnings(notes, progress.rows - progress.failed, cfg.select):
        log.warning("%s", warning)
    committer.save(finished=True)
    progress.close()
    t = manifest.totals()
    return RunSummary(out, t["rows"], t["failed"], t["prompt_tokens"], t["kept_tokens"], manifest.wall_s,
                      len(shards), t["rows_total"], t["rows"] - before["rows"], committer.elapsed_s,
                      prompt_tokens_this_run=progress.prompt_tokens, kept_tokens_this_run=progress.kept_tokens,
                      retried=retried.rows, retried_ok=retried.fixed, output_tokens_this_run=progress.output_tokens)


def _committed_before(path: Path) -> set[str]:
    try:
        return Manifest.load(path).committed_parts()
    except OutputError:
        return set()  # unreadable: its files are removed as uncommitted ones


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


def kept_engine(engines: dict, resolved: ResolvedRun):
    """A pool worker's engine for this run's settings: built once, kept for its next shards."""
    key = orjson.dumps(fingerprint_fields(resolved, []) | {"vllm": resolved.cfg.to_dict()["vllm"],
                                                           "device": resolved.cfg.device}, option=orjson.OPT_SORT_KEYS)
    if key not in engines:
        for old in engines.values():
            getattr(old, "close", lambda: None)()
        engines.clear()
        engines[key] = build_engine(resolved)
    return engines[key]


def build_engine(resolved: ResolvedRun):
    if resolved.cfg.engine == "hf":
        from spcli.engines.hf.engine import HFEngine

        return HFEngine(resolved, log=log.info)
    from spcli.engines.vllm.driver.engine import VllmEngine

    return VllmEngine(resolved, log=log.info)
