"""Which reader a shard's records come from: its group order (--groups shard) or its rows in order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spcli.config.run import RunConfig
from spcli.errors import OutputError
from spcli.io.group_order import ORDER, Order, read_in_order
from spcli.io.manifest import ShardProgress
from spcli.io.read import read_from
from spcli.io.records import Record
from spcli.io.shards import Shard


def shard_records(shard: Shard, prog: ShardProgress, cfg: RunConfig, notes: Counter | None = None) -> Iterator[Record]:
    """The shard's records not committed yet (prog.next_row on), in the order its commits count them; `notes` hears
    what the first pass found (documents, questions: order_notes)."""
    order = ORDER if cfg.order_free else None
    if prog.next_row > shard.first_row and prog.order != order:
        was = "--groups shard" if prog.order == ORDER else "rows in order"
        raise OutputError(f"{shard.key}: its committed rows were read in another order ({was}); finish it with the "
                          "--groups it was begun with, or rerun with --fresh")
    prog.order = order
    if order is None:
        yield from read_from(shard, cfg.fields, prog.next_row, cfg.max_record_bytes, cfg.grouped)
        return
    on_order = (lambda o: notes.update(order_notes(o))) if notes is not None else (lambda o: None)
    yield from read_in_order(shard, cfg.fields, prog.next_row, cfg.max_record_bytes, cfg.group_max, on_order=on_order,
                             tmp_dir=str(cfg.out))


def order_notes(o: Order) -> Counter:
    """What a shard's first pass found, for the run's end (spcli.job.batch.sharing_line)."""
    return Counter({"documents": o.documents, "questions": o.questions, "no_key": o.no_key, "cut": o.cut})
