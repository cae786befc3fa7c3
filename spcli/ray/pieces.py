"""Row ranges of large shards: the units of work of `spcli run --ray` (`--split-rows N`).

A file of more than N rows is cut into ranges of N row numbers (Parquet rows; JSONL lines), each a Shard with
`rows=(start, stop)`, its own manifest entry, parts and resume point, taken by whichever actor frees up: one
large file keeps a whole cluster busy. A range keeps the file's row numbers, so ids made from them
(`<file>:<row>`) are the same as a whole-file run's.

What the directory's manifests list stays as it was listed: a file run whole stays whole, a range keeps its
bounds and its index (which names its part files). Only the rows no manifest lists yet are cut, with this
run's N, so a resume with another --split-rows goes on without a row run twice. A plain JSONL range carries
where its first line starts in the file (Shard.offset, found by counting newlines a block at a time), so its
reader seeks there: reading a large file's last range costs what its first does. A new range's index comes
after every index in use (the files' own are 0..F-1), so no two units ever name their parts alike; a range
handed out but never committed lists nowhere, and its index may name another range on the next run (its
uncommitted files are removed by whichever slot takes that index).

Pure bookkeeping: the driver (driver.py) calls `split` under its lock, before any actor starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from spcli.io.count import count_positions, line_offsets
from spcli.io.manifest import progress_rows
from spcli.io.shards import Shard, shard_kind
from spcli.ray.slots import Slots


def group_split_rows(split_rows: int, cfg) -> int:
    """--split-rows as document groups allow: with --groups shard (a document's records anywhere in its file) files
    run whole (0), since a row range could cut a group; with the consecutive rule, ranges end at multiples of
    --group-max, where every group is cut anyway (spcli.io.groups); with groups off, as asked."""
    if cfg.grouped is None:
        return split_rows
    if cfg.order_free:
        return 0
    return split_rows + (-split_rows) % cfg.grouped


def split(shards: list[Shard], slots: Slots, split_rows: int,
          positions: Callable[[Shard], int | None] = count_positions) -> list[Shard]:
    """The job's units of work, in input order: each file whole, or its row ranges. split_rows 0: files whole
    (the ranges a directory already lists still stand, and the rows between them are one range each)."""
    next_index = max([len(shards) - 1, *slots.index.values()]) + 1
    by_path = slots.keys_by_path()
    units: list[Shard] = []
    for shard in shards:
        listed = by_path.get(shard.path, [])
        if any(slots.row_range[k] is None for k in listed):
            units.append(shard)  # run whole before: it stays whole
            continue
        span = positions(shard) if listed or split_rows else None
        if span is None or (not listed and span <= split_rows):
            units.append(shard)
            continue
        ranges = [(slots.row_range[k], slots.index[k]) for k in listed]
        for start, stop in cut(uncovered([r for r, _ in ranges], span), split_rows):
            ranges.append(((start, stop), next_index))
            next_index += 1
        ranges.sort()
        starts = line_offsets(shard.path, [r[0] for r, _ in ranges]) if shard_kind(shard.path) == "jsonl" else None
        units += [dataclasses.replace(shard, index=i, rows=r, offset=starts[n] if starts else 0)
                  for n, (r, i) in enumerate(ranges)]
    return units


def not_started(docs: list[dict]) -> list[Shard]:
    """What no actor slot of a Ray directory has started, from its manifests: each input file none lists (whole),
    and each run of rows of a file cut in ranges that no listed range covers (a driver stopped before handing
    them out), found from the file itself. What `spcli status` shows waiting and `spcli inspect` counts pending."""
    ray_docs = [d for d in docs if (d.get("task") or {}).get("ray")]
    if not ray_docs:
        return []
    whole, ranges = set(), {}
    for p in (p for d in ray_docs for p in d["shards"].values()):
        rows = progress_rows(p)
        if rows is None:
            whole.add(p["path"])
        else:
            ranges.setdefault(p["path"], []).append(rows)
    left = []
    for path in (s["path"] for s in (ray_docs[0].get("fingerprint_fields") or {}).get("inputs", [])):
        if path in whole:
            continue
        if path not in ranges:
            left.append(Shard(0, path))
        elif (span := count_positions(Shard(0, path))) is not None:
            left += [Shard(0, path, rows=gap) for gap in uncovered(ranges[path], span)]
    return left


def uncovered(ranges: list[tuple[int, int]], span: int) -> list[tuple[int, int]]:
    """The parts of [0, span) that no range covers, in order."""
    gaps, at = [], 0
    for start, stop in sorted(ranges):
        if start > at:
            gaps.append((at, start))
        at = max(at, stop)
    if at < span:
        gaps.append((at, span))
    return gaps


def cut(gaps: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Each gap in ranges of `size` rows (the last of a gap may be shorter); size 0: each gap whole."""
    if not size:
        return list(gaps)
    return [(a, min(a + size, stop)) for start, stop in gaps for a in range(start, stop, size)]
