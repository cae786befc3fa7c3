"""The streaming job loop (`--engine vllm`): shards -> records -> windows scored ahead -> vLLM kept full ->
rows back in any order -> put back in read order -> committed per shard, as `spcli run` commits batches.

Records are read lazily across shards, in order (a job never waits at a shard boundary); each one read, and
each shard's end, joins `order`. A finished row waits in `finished` until every row read before it has
finished too; then the run of rows at the head of `order` is committed, and a shard's end marks it done. So
what is committed is always a prefix of each shard in read order: resume continues after it, exactly once,
and rows that were in flight at a stop are redone. Memory: rows waiting here are at most what the loop holds
in flight (spcli.job.batch.stream_rows: twice what vLLM runs at once, plus one window waiting to be submitted).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass

from spcli.config.run import RunConfig
from spcli.errors import StopAtSafePoint
from spcli.io.ids import mark_duplicates
from spcli.io.groups import after
from spcli.io.records import Record
from spcli.io.schema import RowResult
from spcli.io.shards import Shard
from spcli.job.batch import row_notes, stream_rows
from spcli.job.reading import shard_records

log = logging.getLogger("spcli")


@dataclass
class ShardEnd:
    shard: Shard


class Reorder:
    """Finished rows back in read order, committed as runs of one shard; a shard's end commits it done."""

    def __init__(self, committer, manifest, cfg: RunConfig, progress, warned: set[int], notes: Counter | None = None):
        self.order: deque[Record | ShardEnd] = deque()
        self.finished: dict[int, RowResult] = {}  # id(record) -> its row
        self.committer, self.manifest, self.cfg, self.progress, self.warned = committer, manifest, cfg, progress, warned
        self.notes: Counter = Counter() if notes is None else notes  # batch.row_notes, reading.order_notes

    def read(self, shards: list[Shard]):
        """Every shard's records from its committed row on, in order; each record and shard end joins `order`."""
        for shard in shards:
            prog = self.manifest.shards[shard.index]
            for rec in shard_records(shard, prog, self.cfg, self.notes):
                if not rec.is_context:  # read for its group's shared part only: its row was committed before
                    self.order.append(rec)
                yield rec
            self.order.append(ShardEnd(shard))

    def add(self, rec: Record, row: RowResult) -> None:
        if rec.is_context:
            return
        self.finished[id(rec)] = row
        self.flush()

    def flush(self) -> None:
        run: list[tuple[Record, RowResult]] = []
        while self.order:
            head = self.order[0]
            if isinstance(head, ShardEnd):
                self._emit(run)
                run = []
                self.order.popleft()
                self.committer.commit(head.shard.index, done=True)
                if self.manifest.shards[head.shard.index].rows == 0 and head.shard.index not in self.warned:
                    log.warning("%s: no records", head.shard.key)
                continue
            row = self.finished.pop(id(head), None)
            if row is None:
                break
            self.order.popleft()
            run.append((head, row))
        self._emit(run)

    def _emit(self, run: list[tuple[Record, RowResult]]) -> None:
        if not run:
            return
        records, rows = [r for r, _ in run], [row for _, row in run]
        self.notes += row_notes(records, rows, self.cfg.select)
        self.committer.add(records[-1].shard, after(records[-1]), rows)
        self.progress.update(rows)
        if self.committer.due():
            self.committer.commit()

    def needed(self) -> set[int]:
        """id() of each unfinished record read before the last finished one: the rows finished rows wait on (a Ctrl-C
        lets these finish, so that every finished row commits: commits are prefixes of a shard in read order)."""
        waiting: list[int] = []
        needed: set[int] = set()
        for item in self.order:
            if not isinstance(item, Record):
                continue
            if id(item) in self.finished:
                needed.update(waiting)
                waiting.clear()
            else:
                waiting.append(id(item))
        return needed

    @property
    def num_waiting(self) -> int:
        return sum(isinstance(x, Record) for x in self.order)


def stream_shards(engine, cfg: RunConfig, shards: list[Shard], manifest, committer, ids, paths: dict[int, str],
                  stop, progress, warned: set[int], check_stop, notes: Counter | None = None) -> Counter:
    """Run `shards` through the streaming loop; what the run's end says about its rows (batch.row_notes).
    A first SIGTERM/SIGUSR1 stops reading and lets the requests in flight finish (as a batch finished before);
    Ctrl-C stops at the next engine step, dropping those no finished row waits on (redone on resume) and finishing
    the others, so no finished row is lost (issue 40). check_stop() commits and raises Interrupted once a stop was
    asked for."""
    reorder = Reorder(committer, manifest, cfg, progress, warned, notes)
    in_vllm = 0  # requests in vLLM when a stop dropped them
    with committer.keeping_finished_rows(lambda: stop.requested):
        try:
            with engine.streaming() as stream:  # an engine that dies in here leaves it as EngineDied
                rows = stream_rows(stream, engine, reorder.read(shards), cfg, paths, cfg.batch_size,
                                   on_window=lambda batch: mark_duplicates(batch, ids, paths), on_stage=progress.stage,
                                   should_stop=stop.is_urgent, should_drain=lambda: stop.requested,
                                   overlap=engine.overlap, needed=reorder.needed,
                                   on_settle=lambda finishing, dropped: _settling(reorder, finishing, dropped))
                try:
                    for rec, row in rows:
                        reorder.add(rec, row)
                    reorder.flush()
                except StopAtSafePoint:
                    in_vllm = stream.num_in_flight
                    raise
                finally:
                    rows.close()
            check_stop()
        except StopAtSafePoint:
            log.warning("%d rows read and not finished (%d of them in vLLM) were dropped at a safe point; they are "
                        "redone on resume", reorder.num_waiting, in_vllm)
            check_stop()
            raise
    return reorder.notes


def _settling(reorder: Reorder, finishing: int, dropped: int) -> None:
    if finishing:
        log.warning("finishing the %d rows in vLLM that %d finished rows wait on, so that they commit; %d rows dropped "
                    "(redone on resume); press Ctrl-C again to stop at once", finishing, len(reorder.finished), dropped)
