"""`spcli run --retry-failed`: the committed error rows redone, each replacing its old row in place.

The records of the error rows are read again from their shards (same shard, same row) and go through
the same batch as any row (`batch.run_batch`). After each batch, every part holding one of its rows is
rewritten and the manifest replaced once (io/replace.py): a kill loses at most that batch, and a row
is never committed twice. A record that is still bad gives its error row again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from spcli.errors import StopAtSafePoint
from spcli.io import replace
from spcli.io.commit import batch_prefill_s
from spcli.io.ids import IdIndex, mark_duplicates
from spcli.io.groups import Whole, assign, own_rows, window_start
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
    """The shard's records at `rows`, read again (one pass from the first of them); with groups, each with its
    group's other records, marked is_context (they choose what of the shared document is kept; their rows stand)."""
    group_max = cfg.grouped
    if group_max is not None and cfg.order_free:  # --groups shard: a group's records may stand anywhere in the shard
        from spcli.io.group_order import read_in_order

        return list(read_in_order(shard, cfg.fields, 0, cfg.max_record_bytes, group_max, wanted_rows=set(rows),
                                  tmp_dir=str(cfg.out)))
    first, last = min(rows), max(rows)
    if group_max is not None:  # a group never crosses a multiple of group_max (spcli.io.groups)
        first, last = window_start(first, group_max), window_start(last, group_max) + group_max - 1
    read = []
    for rec in read_records(shard, cfg.fields, first, cfg.max_record_bytes):
        read.append(rec)
        if rec.row >= last:
            break
    if group_max is None:
        return [rec for rec in read if rec.row in rows]
    found = []
    for group in assign(read, group_max):
        members = [read[i] for i in group]
        if any(m.row in rows for m in members):
            for m in members:
                m.is_context = m.row not in rows
            found += members
    return found


def retry_failed(cfg, out: Path, manifest, committer, shards: list[Shard], failed: dict[int, dict[int, str]],
                 ids: IdIndex, paths: dict[int, str], get_engine, stop, check_stop, progress) -> Retried:
    """Redo `failed` (find_failed), batch by batch; check_stop() raises when `stop` was asked for."""
    done = Retried()
    for shard in shards:
        where = failed.get(shard.index)
        if not where:
            continue
        records = Whole(records_at(shard, set(where), cfg), cfg.group_max, is_on=cfg.grouped is not None)
        while batch := records.take(cfg.hf_batch):
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
            batch, rows = own_rows(batch, rows)  # a failed row's group-mates stand as committed
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

