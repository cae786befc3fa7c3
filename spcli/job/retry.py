"""`spcli run --retry-failed`: the committed error rows redone, each replacing its old row in place.

The records of the error rows are read again from their shards (same shard, same row) and go through
the same batch as any row (`batch.run_batch`). After each batch, every part holding one of its rows is
rewritten and the manifest replaced once (io/replace.py): a kill loses at most that batch, and a row
is never committed twice. A record that is still bad gives its error row again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from spcli.errors import StopAtSafePoint
from spcli.io import replace
from spcli.io.commit import batch_prefill_s
from spcli.io.ids import IdIndex, mark_duplicates
from spcli.io.read import read_records
from spcli.io.records import Record
from spcli.io.shards import Shard
from spcli.job.batch import error_row, run_batch

log = logging.getLogger("spcli")


@dataclass
class Retried:
    rows: int = 0  # error rows redone
    fixed: int = 0  # of them, now without error


def find_failed(out: Path, manifest, shards: list[Shard]) -> dict[int, dict[int, str]]:
    """This run's shards' committed error rows: shard index -> {row -> part}."""
    found = {s.index: replace.failed_rows(out, manifest.shards[s.index]) for s in shards}
    return {i: rows for i, rows in found.items() if rows}


def records_at(shard: Shard, rows: set[int], cfg) -> list[Record]:
    """The shard's records at `rows`, read again (one pass from the first of them)."""
    last = max(rows)
    found = []
    for rec in read_records(shard, cfg.fields, min(rows), cfg.max_record_bytes):
        if rec.row in rows:
            found.append(rec)
        if rec.row >= last:
            break
    return found


def retry_failed(cfg, out: Path, manifest, committer, shards: list[Shard], failed: dict[int, dict[int, str]],
                 ids: IdIndex, paths: dict[int, str], get_engine, stop, check_stop, progress) -> Retried:
    """Redo `failed` (find_failed), batch by batch; check_stop() raises when `stop` was asked for."""
    done = Retried()
    for shard in shards:
        where = failed.get(shard.index)
        if not where:
            continue
        records = iter(records_at(shard, set(where), cfg))
        while batch := list(islice(records, cfg.hf_batch)):
            check_stop()
            mark_duplicates(batch, ids, paths)
            try:
                if all(rec.error is not None for rec in batch):  # bad as read: no model needed to say so again
                    rows = [error_row(rec, paths, rec.error) for rec in batch]
                else:
                    engine = get_engine()
                    check_stop()
                    rows = run_batch(engine, batch, cfg, paths, on_stage=progress.stage, should_stop=stop.is_urgent)
            except StopAtSafePoint:
                log.warning("the retried batch in flight (%d rows) was dropped at a safe point; "
                            "its rows stay failed until the next --retry-failed", len(batch))
                check_stop()
                raise
            by_part: dict[str, dict] = {}
            for r in rows:
                by_part.setdefault(where[r.row], {})[r.row] = r
            gone = []
            for part, redone in by_part.items():
                now, unlisted = replace.rewrite_part(out, manifest, shard.index, part, redone, committer.taken, cfg.model)
                gone += unlisted
                for row in [row for row, p in where.items() if p == part]:  # later batches find its rows there
                    where[row] = now
            manifest.shards[shard.index].prefill_s += batch_prefill_s(rows)
            if gone:
                committer.save()  # the commit: the new parts are listed, the old ones no longer
                replace.delete(out, gone)
            done.rows += len(rows)
            done.fixed += sum(r.error is None for r in rows)
            progress.update(rows)
    return done

