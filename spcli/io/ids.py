"""Duplicate ids: where each id was first seen, in ~32 bytes per row; rebuilt from committed parts.

Open addressing with linear probing over 64-bit BLAKE2b hashes of the ids (0 marks an empty
slot); a value packs the first occurrence as (shard << 40) | row. A Python dict of strings would
cost ~10x the memory on a multi-million-row run. Two different ids share a hash with probability
~n^2 / 2^65 (3e-4 at 10^8 rows), which would show as a false duplicate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import OutputError
from spcli.io.records import Record, where
from spcli.io.shards import shard_kind

if TYPE_CHECKING:
    from spcli.io.manifest import Manifest

ROW_BITS = 40
MAX_LOAD = 0.6


def id_hash(row_id: str) -> int:
    h = int.from_bytes(hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    return h or 1


class IdIndex:
    def __init__(self, capacity: int = 1 << 12):
        assert capacity & (capacity - 1) == 0, "capacity is a power of two"
        self.keys = np.zeros(capacity, np.uint64)  # [capacity] id hashes, 0 = empty
        self.values = np.zeros(capacity, np.int64)  # [capacity] (shard << 40) | row
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def setdefault(self, row_id: str, shard: int, row: int) -> tuple[int, int] | None:
        """Remember `row_id` at (shard, row) unless already seen; returns its first (shard, row) if it was."""
        h = id_hash(row_id)
        keys, mask = self.keys, len(self.keys) - 1
        i = h & mask
        while (k := keys.item(i)) != 0:
            if k == h:
                v = self.values.item(i)
                return v >> ROW_BITS, v & ((1 << ROW_BITS) - 1)
            i = (i + 1) & mask
        keys[i] = h
        self.values[i] = (shard << ROW_BITS) | row
        self.size += 1
        if self.size > MAX_LOAD * len(keys):
            self._grow()
        return None

    def _grow(self) -> None:
        """Double the table and reinsert every entry, vectorised in rounds of linear probing."""
        used = self.keys != 0
        keys, values = self.keys[used], self.values[used]
        self.keys = np.zeros(2 * len(self.keys), np.uint64)
        self.values = np.zeros(len(self.keys), np.int64)
        mask = np.uint64(len(self.keys) - 1)
        slot = (keys & mask).astype(np.int64)  # [n] next slot each pending key tries
        pending = np.arange(len(keys))
        while pending.size:
            s = slot[pending]
            free = self.keys[s] == 0
            # among keys trying one free slot, the first wins; the others probe on
            cand, cs = pending[free], s[free]
            _, first = np.unique(cs, return_index=True)
            won = cand[first]
            self.keys[slot[won]] = keys[won]
            self.values[slot[won]] = values[won]
            placed = np.zeros(len(keys), bool)
            placed[won] = True
            pending = pending[~placed[pending]]
            slot[pending] = (slot[pending] + 1) & (len(self.keys) - 1)


def mark_duplicates(batch: list[Record], ids: IdIndex, paths: dict[int, str]) -> None:
    """A repeated id makes an error row naming where the id was first seen (the first occurrence is kept).
    A record seen at its own place before (redone by --retry-failed) is not a repeat."""
    for rec in batch:
        first = ids.setdefault(rec.id, rec.shard, rec.row)
        if first is not None and first != (rec.shard, rec.row) and rec.error is None:
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
