"""Row ranges of large shards (spcli/ray/pieces.py, `--split-rows`): how files are cut, how a directory's ranges
stand on resume, and reading a range of real JSONL and Parquet files (no Ray needed)."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spcli.config.run import FieldConfig
from spcli.io.manifest import Manifest, ShardProgress
from spcli.io.read import read_records
from spcli.io.count import count_positions, count_rows
from spcli.io.shards import Shard
from spcli.ray.pieces import cut, group_split_rows, split, uncovered
from spcli.ray.slots import Slots, read_slots
from spcli.job.manifest import merge_progress

FILES = [Shard(0, "/in/a.parquet", "a"), Shard(1, "/in/b.parquet", "b"), Shard(2, "/in/c.parquet", "c")]
SPANS = {"/in/a.parquet": 25, "/in/b.parquet": 4, "/in/c.parquet": 10}


def units(slots: Slots, split_rows: int) -> list[tuple[int, str, tuple | None]]:
    return [(u.index, u.path, u.rows) for u in split(FILES, slots, split_rows, lambda s: SPANS[s.path])]


def listed(*entries) -> Slots:
    """Slots whose manifests list (slot, index, path, row range, done)."""
    slots = Slots()
    for slot, index, path, rows, done in entries:
        key = Shard(index, path, rows=rows).key
        slots.owner[key], slots.index[key], slots.path[key], slots.row_range[key] = slot, index, path, rows
        slots.rows[key] = 0
        if done:
            slots.done.add(key)
    return slots


def test_large_files_are_cut_small_ones_stay_whole_and_indices_follow_the_files():
    assert units(Slots(), 10) == [(3, "/in/a.parquet", (0, 10)), (4, "/in/a.parquet", (10, 20)),
                                  (5, "/in/a.parquet", (20, 25)), (1, "/in/b.parquet", None), (2, "/in/c.parquet", None)]
    assert units(Slots(), 0) == [(s.index, s.path, None) for s in FILES]
    assert [u.key for u in split(FILES[:1], Slots(), 20, lambda s: 25)] == ["/in/a.parquet[0:20]", "/in/a.parquet[20:25]"]


def test_a_resume_keeps_the_listed_ranges_and_cuts_only_the_rows_no_manifest_lists():
    """The first run cut a by 10 and started [0:10] (index 3) and [20:25] (index 5); c ran whole. Resumed with
    --split-rows 4: a's listed ranges keep their bounds and indices, the gap [10:20) is cut by 4 into new indices
    above every one in use; c stays whole though it has more than 4 rows."""
    slots = listed((0, 3, "/in/a.parquet", (0, 10), True), (1, 5, "/in/a.parquet", (20, 25), False),
                   (1, 2, "/in/c.parquet", None, False))
    assert units(slots, 4) == [(3, "/in/a.parquet", (0, 10)), (6, "/in/a.parquet", (10, 14)),
                               (7, "/in/a.parquet", (14, 18)), (8, "/in/a.parquet", (18, 20)),
                               (5, "/in/a.parquet", (20, 25)), (1, "/in/b.parquet", None), (2, "/in/c.parquet", None)]
    assert units(slots, 0)[1] == (6, "/in/a.parquet", (10, 20))  # whole files from now on: the gap is one range
    covered = sorted(r for _, p, r in units(slots, 4) if p == "/in/a.parquet")
    assert uncovered(covered, 25) == []


def test_gaps_and_cuts():
    assert uncovered([(5, 8), (0, 2)], 12) == [(2, 5), (8, 12)]
    assert uncovered([(0, 30)], 25) == []  # a file that shrank under --force: nothing left to cut
    assert cut([(2, 5), (8, 12)], 3) == [(2, 5), (8, 11), (11, 12)]
    assert cut([(2, 5)], 0) == [(2, 5)]


def test_read_slots_reads_row_ranges_with_their_manifest_index(tmp_path):
    doc = {"task": {"index": 1, "count": 2, "ray": True}, "shards": {
        "7": {"path": "/in/a.parquet", "row_range": [10, 20], "done": False, "rows": 4, "next_row": 14, "total_rows": 10},
        "1": {"path": "/in/b.parquet", "done": True, "rows": 4, "next_row": 4, "total_rows": 4}}}
    (tmp_path / "manifest-task-00001.json").write_text(json.dumps(doc))
    slots = read_slots(tmp_path)
    assert slots.index == {"/in/a.parquet[10:20]": 7, "/in/b.parquet": 1}
    assert slots.row_range["/in/a.parquet[10:20]"] == (10, 20) and slots.done == {"/in/b.parquet"}
    assert slots.keys_by_path()["/in/a.parquet"] == ["/in/a.parquet[10:20]"]


def test_a_range_starts_at_its_first_row_and_its_manifest_entry_says_its_bounds(tmp_path):
    piece = Shard(4, "/in/a.parquet", "a", rows=(10, 20))
    prog = ShardProgress.start(piece)
    assert (prog.next_row, prog.row_range, prog.key) == (10, [10, 20], piece.key)
    assert "row_range" not in ShardProgress.start(FILES[1]).to_doc()  # a whole file's entry is as it always was
    m = Manifest(tmp_path / "manifest-task-00000.json", {}, {}, {4: prog, 1: ShardProgress.start(FILES[1])})
    m.save()
    again = Manifest.load(m.path)
    assert again.shards[4].row_range == [10, 20] and again.shards[1].row_range is None
    other = Shard(5, "/in/a.parquet", "a", rows=(20, 25))  # same file, another range: its own progress
    merged = merge_progress(again.shards, [piece, other])
    assert merged[4] is again.shards[4] and merged[5].next_row == 20 and merged[6].path == "/in/b.parquet"


def test_reading_a_range_of_jsonl_keeps_line_numbers_and_ids(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [json.dumps({"prompt": f"p{i}"}) for i in range(10)]
    lines[4] = ""  # a blank line: no record, but it has a row number (line index)
    lines[6] = '{"prompt": '  # malformed: an error row at its own line
    path.write_text("\n".join(lines) + "\n")
    whole = Shard(0, str(path), "d")
    piece = Shard(3, str(path), "d", rows=(3, 8))
    recs = list(read_records(piece, FieldConfig()))
    assert [r.row for r in recs] == [3, 5, 6, 7] and [r.id for r in recs] == ["d:3", "d:5", "d:6", "d:7"]
    assert recs[2].error.startswith(f"{path}:row 6 (line 7): malformed JSON")
    assert [r.row for r in read_records(piece, FieldConfig(), start_row=6)] == [6, 7]  # resumed inside the range
    assert (count_rows(piece), count_rows(whole), count_positions(whole)) == (4, 9, 10)


@pytest.mark.parametrize("scan_bytes", [7, 1 << 22])
def test_a_jsonl_range_seeks_to_its_first_line_and_reads_what_a_scan_from_the_start_reads(tmp_path, monkeypatch,
                                                                                             scan_bytes):
    """Each plain JSONL range carries the byte offset of its first line (newlines counted in blocks: 7 bytes, so
    that lines cross blocks, and the real 4 MiB) and reads from there the same records, row numbers, ids and
    errors as a read of the range from the file's start; the ranges together read the whole file."""
    import spcli.io.count as count

    monkeypatch.setattr(count, "SCAN_BYTES", scan_bytes)
    path = tmp_path / "d.jsonl"
    lines = [json.dumps({"prompt": f"p{i} " + "x" * (i % 5)}) for i in range(23)]
    lines[0] = "\ufeff" + lines[0]  # a byte-order mark before the first record
    lines[4], lines[9] = "", "   "  # blank lines: no records, but row numbers
    lines[6] = '{"prompt": '  # malformed
    lines[11] = json.dumps({"prompt": "y" * 300})  # over --max-record-bytes below: an error row, drained
    path.write_bytes(("\r\n".join(lines[:8]) + "\r\n" + "\n".join(lines[8:])).encode())  # CRLF, then LF, no final newline
    whole = Shard(0, str(path), "d")
    assert count_positions(whole) == 23
    pieces = split([whole], Slots(), 5)
    raw = path.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
    assert [(u.rows, u.offset) for u in pieces] == [((a, min(a + 5, 23)), starts[a]) for a in range(0, 23, 5)]

    def rows(shard, start_row=0):
        return [(r.row, r.id, r.prompt, r.error) for r in read_records(shard, FieldConfig(), start_row, max_record_bytes=200)]

    by_range = [rows(u) for u in pieces]
    assert by_range == [rows(dataclasses.replace(u, offset=0)) for u in pieces]
    assert sum(by_range, []) == rows(whole)
    assert rows(pieces[2], start_row=12) == rows(whole, 12)[:3]  # resumed inside a range: rows 12, 13, 14
    assert [r[0] for r in by_range[2] if r[3]] == [11]  # the over-long line, drained, its own row


@pytest.mark.parametrize("row_group_size", [3, 100])
def test_reading_a_range_of_parquet_across_row_groups(tmp_path, row_group_size):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(10)], "prompt": [f"p{i}" for i in range(10)]}), path,
                   row_group_size=row_group_size)
    piece = Shard(1, str(path), "d", rows=(4, 9))
    assert [r.id for r in read_records(piece, FieldConfig(id="id"))] == ["r4", "r5", "r6", "r7", "r8"]
    assert [r.row for r in read_records(piece, FieldConfig(id="id"), start_row=8)] == [8]
    assert count_rows(piece) == 5 and count_rows(Shard(1, str(path), rows=(8, 20))) == 2
    assert count_positions(Shard(0, str(path))) == 10


def test_status_counts_the_rows_no_range_covers_yet_as_waiting(tmp_path):
    """A Ray driver stopped after its slots finished the ranges they were given, before it handed out the rest:
    every slot is done, the job is not. `spcli status` says which rows are waiting (the file's uncovered rows,
    found from the file itself, and a file no slot listed) and exits 3, not 0; `spcli inspect` counts them pending."""
    from spcli.inspect.outputs import RunOutputs
    from spcli.inspect.summary import pending_rows
    from spcli.io.manifest import read_manifests
    from spcli.slurm.status import EXIT_NOT_DONE, collect

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(12)))
    b.write_text(json.dumps({"prompt": "q"}) + "\n")
    out = tmp_path / "out"
    out.mkdir()

    def write(slot, entries):
        shards = {str(i): {"path": str(path), "done": True, "rows": r[1] - r[0], "failed": 0, "next_row": r[1],
                           "total_rows": r[1] - r[0], "parts": [], **({"row_range": list(r)} if path == a else {})}
                  for i, path, r in entries}
        doc = {"task": {"index": slot, "count": 2, "ray": True},
               "fingerprint_fields": {"inputs": [{"path": str(a)}, {"path": str(b)}]}, "shards": shards}
        (out / f"manifest-task-{slot:05d}.json").write_text(json.dumps(doc))

    def pending():  # what `spcli inspect` counts pending: the listed entries' rows left, plus what none lists
        docs = read_manifests(out)
        return pending_rows(RunOutputs(out, docs, {}, {}, [p for d in docs for p in d["shards"].values()], []))

    write(0, [(2, a, (0, 4))])
    write(1, [(4, a, (8, 12))])
    assert pending() == 4 + 1
    status = collect(out, ask_slurm=False)
    assert [(t.index, t.phase) for t in status.tasks] == [(0, "done"), (1, "done"), (None, "waiting")]
    assert status.tasks[-1].shards == 2 and "1 file(s), 1 row range(s)" in status.tasks[-1].message
    assert status.exit_code == EXIT_NOT_DONE
    write(1, [(4, a, (8, 12)), (1, b, (0, 1))])  # every file listed, a's rows 4-7 in none: still waiting
    status = collect(out, ask_slurm=False)
    assert [t.phase for t in status.tasks] == ["done", "done", "waiting"] and status.exit_code == EXIT_NOT_DONE
    assert "no Ray actor has started 1 row range(s)" in status.tasks[-1].message and pending() == 4
    write(1, [(4, a, (8, 12)), (1, b, (0, 1)), (5, a, (4, 8))])  # the gap run too: done
    status = collect(out, ask_slurm=False)
    assert [t.phase for t in status.tasks] == ["done", "done"] and status.exit_code == 0 and pending() == 0


def test_split_rows_needs_ray_and_a_count():
    from spcli.config.run import RunConfig
    from spcli.errors import ConfigError

    with pytest.raises(ConfigError, match="--split-rows needs --ray"):
        RunConfig(inputs=("a.jsonl",), out="o", split_rows=5)
    with pytest.raises(ConfigError, match="--split-rows must be >= 0"):
        RunConfig(inputs=("a.jsonl",), out="o", ray="", split_rows=-1)
    assert "split_rows" not in RunConfig(inputs=("a.jsonl",), out="o", ray="", split_rows=5).fingerprint_fields()


def test_ranges_never_cut_a_group():
    """--groups shard (the default: a document's records anywhere in its file): files run whole; the consecutive rule:
    ranges end at multiples of --group-max (where it cuts every group); groups off: as asked (issue 57)."""
    from spcli.config.run import RunConfig

    cfg = lambda groups: RunConfig(inputs=("x",), out="o", groups=groups, group_max=4)
    assert group_split_rows(10, cfg("auto")) == group_split_rows(10, cfg("shard")) == 0
    assert group_split_rows(10, cfg("consecutive")) == 12 and group_split_rows(8, cfg("consecutive")) == 8
    assert group_split_rows(10, cfg("off")) == 10
    shards = [Shard(0, "a.jsonl"), Shard(1, "b.jsonl")]
    units = split(shards, Slots(), group_split_rows(10, cfg("shard")), positions=lambda s: 100)
    assert [(u.path, u.rows) for u in units] == [("a.jsonl", None), ("b.jsonl", None)]

