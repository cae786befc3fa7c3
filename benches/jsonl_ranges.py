"""Row ranges of a large plain JSONL file (`spcli run --ray --split-rows N`): what finding a range's first record
costs with the byte offset the driver hands each range (Shard.offset) against reading the file from its start.

    python benches/jsonl_ranges.py                          # here, ~1 minute: 400k lines of ~500 bytes (~200 MB)
    python benches/jsonl_ranges.py --lines 4000000 --split-rows 10000

Prints, in one run on the same file: the driver's cut (count the lines, then the offsets of every range's first
line: spcli.ray.pieces.split, what `spcli run --ray` calls), and the time to a range's first record through the
engine's own reader (spcli.io.read.read_records) for the first, middle and last range, with the offset and with
none (offset 0: every line before the range read). Summed over all ranges, the reads without offsets grow with
the square of the file's length; with them, with its length.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path


def build(path: Path, lines: int, chars: int) -> Path:
    if path.is_file() and sum(1 for _ in open(path, "rb")) == lines:
        return path
    rng = random.Random(0)
    words = "report quarter revenue office north review meeting customer growth cost plan risk".split()
    with open(path, "w") as f:
        for i in range(lines):
            text = " ".join(rng.choice(words) for _ in range(chars // 7))
            f.write(f'{{"id": "r{i}", "prompt": "{text}"}}\n')
    return path


def first_record_s(shard, fields) -> float:
    from spcli.io.read import read_records

    t = time.perf_counter()
    next(read_records(shard, fields))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--chars", type=int, default=500, help="about this many characters of prompt a line")
    ap.add_argument("--split-rows", type=int, default=10_000)
    ap.add_argument("--workdir", default="/tmp/spcli-bench-jsonl-ranges")
    args = ap.parse_args()

    from spcli.config.run import FieldConfig
    from spcli.io.shards import Shard
    from spcli.ray.pieces import split
    from spcli.ray.slots import Slots

    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    path = build(Path(args.workdir) / f"lines-{args.lines}-{args.chars}.jsonl", args.lines, args.chars)
    size_mb = path.stat().st_size / 1e6
    t = time.perf_counter()
    units = split([Shard(0, str(path), "d")], Slots(), args.split_rows)
    cut_s = time.perf_counter() - t
    fields = FieldConfig(id="id")
    print(f"{path.name}: {args.lines} lines, {size_mb:.0f} MB; --split-rows {args.split_rows}: {len(units)} ranges, "
          f"cut (lines counted, first lines found) in {cut_s:.2f} s")
    print(f"{'range':>22} {'with offset':>12} {'from start':>11} {'ratio':>7}")
    for name, u in (("first", units[0]), ("middle", units[len(units) // 2]), ("last", units[-1])):
        seek, scan = first_record_s(u, fields), first_record_s(dataclasses.replace(u, offset=0), fields)
        print(f"{name + ' ' + str(list(u.rows)):>22} {seek * 1e3:>10.2f}ms {scan * 1e3:>9.1f}ms {scan / seek:>6.1f}x")
    every = len(units) // 8 or 1
    sample = units[::every]
    seek = sum(first_record_s(u, fields) for u in sample)
    scan = sum(first_record_s(dataclasses.replace(u, offset=0), fields) for u in sample)
    print(f"all {len(units)} ranges' first records (estimated from every {every}th): with offsets "
          f"{seek * every:.2f} s, from the start {scan * every:.1f} s ({scan / seek:.0f}x)")


if __name__ == "__main__":
    main()
