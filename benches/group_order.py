"""What --groups shard's first pass costs (issue 57): its time against plain reading of the shard, and its memory.

    flock /tmp/spcli-timing.lock .venv/bin/python benches/group_order.py [--records 1000000] [--questions 4]
        [--repeat 3] [--keep FILE] [--formats jsonl,jsonl.gz,parquet] [--chat]

Writes a JSONL shard of N short records (D = N / Q documents of ~40 words, Q questions each, in random order:
{"id", "doc_id", "prompt", "question"}; with --chat {"id", "messages": [system, user: the document, user: the
question]}, whose key is its messages but the last, which the compiled scanner leaves to the parser), then times, alternating, --repeat times each (best of the repeats):

    read     plain reading: every record parsed into a Record (spcli.io.read.read_records, what `spcli run` reads
             with --groups consecutive or off)
    scan     the first pass alone (spcli.io.group_order.scan + order: key digests, processing order), its JSONL
             line scan on as many threads as it picks (the cores this process may use, up to 8)
    scan1    the same on one thread
    ordered  reading in the group order, first pass included (read_in_order: what `spcli run` reads by default)

and prints scan / read (the first pass's overhead) and ordered / read - 1 (what reading in group order adds in all),
with the first pass's arrays in bytes per record and its peak of traced Python memory (tracemalloc, in a separate
untimed pass). The process's first scan (with importing numba and loading the compiled kernels from its cache) is
timed apart as `first_call`. With --formats, the same shard is also written as gzip JSONL and Parquet (row groups of 64k
rows), and read, scan and ordered are timed on each. No model is loaded.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spcli.config.run import GROUP_MAX, FieldConfig  # noqa: E402
from spcli.io.group_order import order, read_in_order, scan  # noqa: E402
from spcli.io.read import read_records  # noqa: E402
from spcli.io.shards import Shard  # noqa: E402

FIELDS = FieldConfig(instruction="question")
LIMIT = 8 << 20


def write_shard(path: Path, records: int, questions: int, seed: int = 0, chat: bool = False) -> None:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(500)]
    docs = records // questions
    rows = [(d, q) for d in range(docs) for q in range(questions)]
    rng.shuffle(rows)
    texts = {}
    with open(path, "w") as f:
        for d, q in rows:
            if d not in texts:
                texts[d] = " ".join(rng.choice(words) for _ in range(40))
            question = f"what is word {q} of the note?"
            if chat:
                messages = [{"role": "system", "content": "You answer from the note."},
                            {"role": "user", "content": texts[d]}, {"role": "user", "content": question}]
                f.write(json.dumps({"id": f"d{d}q{q}", "messages": messages}) + "\n")
            else:
                f.write(json.dumps({"id": f"d{d}q{q}", "doc_id": f"d{d}", "prompt": texts[d], "question": question})
                        + "\n")


def time_read(shard: Shard) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in read_records(shard, FIELDS, 0, LIMIT))
    assert n
    return time.perf_counter() - t0


def time_scan(shard: Shard, threads: int | None = None) -> float:
    t0 = time.perf_counter()
    order(scan(shard, FIELDS, LIMIT, threads=threads), GROUP_MAX)
    return time.perf_counter() - t0


def time_ordered(shard: Shard) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in read_in_order(shard, FIELDS, 0, LIMIT, GROUP_MAX))
    assert n
    return time.perf_counter() - t0


def write_formats(path: Path, formats: list[str]) -> dict[str, Path]:
    """The shard at `path` also as gzip JSONL and Parquet, where asked."""
    import gzip

    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    out = {"jsonl": path}
    if "jsonl.gz" in formats:
        out["jsonl.gz"] = path.with_suffix(".jsonl.gz")
        if not out["jsonl.gz"].exists():
            with open(path, "rb") as f, gzip.open(out["jsonl.gz"], "wb", compresslevel=6) as z:
                while chunk := f.read(1 << 20):
                    z.write(chunk)
    if "parquet" in formats:
        out["parquet"] = path.with_suffix(".parquet")
        if not out["parquet"].exists():
            table = pj.read_json(path, parse_options=pj.ParseOptions(explicit_schema=pa.schema(
                [(n, pa.string()) for n in ("id", "doc_id", "prompt", "question")])))
            pq.write_table(table, out["parquet"], row_group_size=65536)
    return out


def measure(shard: Shard, repeat: int) -> dict:
    times = {"read": [], "scan": [], "scan1": [], "ordered": []}
    for _ in range(repeat):
        times["read"].append(time_read(shard))
        times["scan"].append(time_scan(shard))
        times["scan1"].append(time_scan(shard, threads=1))
        times["ordered"].append(time_ordered(shard))
    best = {k: min(v) for k, v in times.items()}
    return {"seconds": {k: round(v, 3) for k, v in best.items()}, "all_seconds": times,
            "scan_over_read": round(best["scan"] / best["read"], 4),
            "scan1_over_read": round(best["scan1"] / best["read"], 4),
            "ordered_over_read_minus_1": round(best["ordered"] / best["read"] - 1, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the shard here (default: a temporary directory)")
    ap.add_argument("--formats", default="jsonl", help="comma-separated: jsonl, jsonl.gz, parquet")
    ap.add_argument("--chat", action="store_true", help="chat records (messages) instead of prompt records")
    args = ap.parse_args()
    if args.chat and "parquet" in args.formats:
        ap.error("--chat writes JSONL records of nested messages: use --formats jsonl or jsonl,jsonl.gz")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "short.jsonl"
        if not path.exists():
            write_shard(path, args.records, args.questions, chat=args.chat)
        shard = Shard(0, str(path), "short")
        t0 = time.perf_counter()
        scan(shard, FIELDS, LIMIT)
        first_call = time.perf_counter() - t0
        tracemalloc.start()
        s = scan(shard, FIELDS, LIMIT)
        o = order(s, GROUP_MAX)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        n = len(s.rows)
        result = {"records": n, "documents": o.documents, "groups": o.num_groups, "bytes": path.stat().st_size,
                  "first_call_s": round(first_call, 3), "scan_bytes_per_record": round(s.nbytes / n, 1),
                  "order_bytes_per_record": round(o.nbytes / n, 1), "scan_peak_mb": round(peak / 1e6, 1),
                  "scan_peak_bytes_per_record": round(peak / n, 1), "formats": {}}
        for kind, p in write_formats(path, args.formats.split(",")).items():
            result["formats"][kind] = measure(Shard(0, str(p), "short"), args.repeat)
        print(json.dumps(result, indent=1))
        for kind, r in result["formats"].items():
            sec = r["seconds"]
            print(f"{kind}: first pass {sec['scan']:.2f} s = {100 * r['scan_over_read']:.1f}% of plain reading "
                  f"({sec['read']:.2f} s; on one thread {sec['scan1']:.2f} s = {100 * r['scan1_over_read']:.1f}%); "
                  f"reading in group order, first pass included: {100 * r['ordered_over_read_minus_1']:+.1f}%")
        extra = result["first_call_s"] - result["formats"]["jsonl"]["seconds"]["scan"]
        print(f"memory {result['scan_peak_mb']} MB peak ({result['scan_peak_bytes_per_record']} B per record); "
              f"the process's first scan {result['first_call_s']:.2f} s, {extra:.2f} s more than the best "
              "(importing numba, loading its compiled kernels)")


if __name__ == "__main__":
    main()
