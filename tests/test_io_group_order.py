"""--groups shard (spcli/io/group_order.py): a document's records grouped wherever they stand in their shard, so a
record's row does not depend on the order of its shard's records; old directories resume with the consecutive rule."""

import dataclasses
import gzip
import json
import random
import traceback

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.run import FieldConfig, RunConfig
from spcli.io.group_order import order, read_in_order, scan
from spcli.io.shards import Shard
from test_job_run import ARGS, read_outputs
from test_stages_share import DOCS, qa_rows

FIELDS = FieldConfig(instruction="question")
TIMING = ("_s",)


def _groups(path, group_max=16, **kw):
    """{frozenset of ids in one group} from reading `path` in its group order."""
    records = list(read_in_order(Shard(0, str(path), "in"), FIELDS, 0, 1 << 20, group_max, **kw))
    groups: dict[int, list] = {}
    for r in records:
        groups.setdefault(r.group_id, []).append(r)
    return records, {frozenset(r.id for r in g) for g in groups.values()}


def test_groups_do_not_depend_on_order_and_are_cut_by_the_records_themselves(tmp_path, write_jsonl):
    rows = [{"id": f"a{i}", "prompt": "doc a", "question": f"q{i}"} for i in range(7)]
    rows += [{"id": f"b{i}", "prompt": "doc b", "question": f"q{i}"} for i in range(2)]
    rows += [{"id": "c0", "prompt": "doc c"}, {"id": "nokey", "messages": [{"role": "user", "content": "hi"}]}]
    found = []
    for seed in range(3):
        shuffled = random.Random(seed).sample(rows, len(rows))
        records, groups = _groups(write_jsonl(shuffled, f"in{seed}.jsonl"), group_max=3)
        found.append(groups)
        assert sorted(r.order_pos for r in records) == list(range(len(rows)))  # every record once
        # groups come in the order of their last row: a reader that reads the file once finishes them so
        lasts = [max(r.row for r in records if r.group_id == g) for g in dict.fromkeys(r.group_id for r in records)]
        assert lasts == sorted(lasts)
    assert found[0] == found[1] == found[2]
    assert sorted(map(len, found[0])) == [1, 1, 1, 2, 3, 3]  # a's 7 cut 3 + 3 + 1 by the records' digests


def test_the_processing_order_is_the_one_directories_were_begun_in(tmp_path):
    """The order of a fixed shard, as the code that began directories before the key digest became Python's hash
    (and before gzip and Parquet were read through decoded copies) computed it: a resume counts committed records in
    this order, so it must not move. Only key equality, the records' own digests and rows decide it."""
    rows = random.Random(11).sample(qa_rows() * 3, 27)
    rows = [{**r, "id": f"{r['id']}-{i}"} for i, r in enumerate(rows)]
    plain = tmp_path / "p.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    pqf = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqf, row_group_size=5)
    jsonl_order = [3, 2, 7, 5, 10, 4, 14, 16, 20, 13, 1, 21, 17, 22, 19, 18, 23, 12, 15, 24, 6, 11, 25, 8, 26, 0, 9]
    parquet_order = [0, 3, 1, 10, 5, 15, 17, 2, 13, 7, 20, 8, 9, 14, 21, 18, 24, 6, 11, 23, 12, 25, 19, 4, 16, 22, 26]
    for path, want in ((plain, jsonl_order), (gz, jsonl_order), (pqf, parquet_order)):
        assert [r.row for r in read_in_order(Shard(0, str(path), "p"), FIELDS, 0, 1 << 20, 4)] == want, path.name


def test_gzip_and_parquet_read_the_same_order_as_plain_jsonl(tmp_path, write_jsonl):
    rows = random.Random(5).sample(qa_rows(), 9) + ["not json"]
    plain = write_jsonl(rows)
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    want = [(r.row, r.group_id, r.order_pos) for r in _groups(plain)[0]]
    assert [(r.row, r.group_id, r.order_pos) for r in _groups(gz)[0]] == want
    table = [r for r in rows if isinstance(r, dict)]
    pqf = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(table), pqf)
    records, groups = _groups(pqf)
    assert groups == {g for g in _groups(plain)[1] if "in:9" not in g}


def test_a_resume_inside_a_group_reads_its_earlier_members_as_context(tmp_path, write_jsonl):
    path = write_jsonl(random.Random(1).sample(qa_rows(), 9))
    shard = Shard(0, str(path), "in")
    every = list(read_in_order(shard, FIELDS, 0, 1 << 20, 16))
    later = list(read_in_order(shard, FIELDS, 4, 1 << 20, 16))
    assert [r.order_pos for r in later if not r.is_context] == list(range(4, 9))
    assert [r.order_pos for r in later if r.is_context] == [3]  # the group of position 4 began at 3
    assert [r.id for r in later] == [r.id for r in every[3:]]
    failed = list(read_in_order(shard, FIELDS, 0, 1 << 20, 16, wanted_rows={every[4].row}))
    assert [(r.id, r.is_context) for r in failed] == [(r.id, r.id != every[4].id) for r in every[3:6]]


def test_the_compiled_scanner_reads_what_the_parser_reads(tmp_path, monkeypatch):
    """Plain JSONL's first pass (spcli.io.line_scan, in parts on threads) gives the arrays of parsing every line,
    digests included, on lines of every kind: blank, not JSON, a chat, compact and spaced, CRLF, a nested prompt, an
    escaped quote, a number prompt, escaped text (\\u escapes, a surrogate pair, \\/), a lone surrogate, a BOM, a
    line over the limit, a row range, no final newline."""
    from spcli.io import group_order, line_scan
    from spcli.io.count import line_offsets

    docs = ["doc one", "doc \\u00e9 two", "doc \u00e9 two", 'doc with \\"quote\\" in', "line\\nbreak", "plain doc",
            "smile \\ud83d\\ude00", "smile \U0001F600", "a\\/b", "a/b", "lone \\ud800 half", "x" * 300]
    kinds = ["", "   ", "{not json", '{"id": "m%d", "messages": [{"role": "user", "content": "x"}, {"role": "user", '
             '"content": "q"}]}', '{"id":"c%d","prompt":"%s","question":"q"}', '{"id": "r%d", "prompt": "%s"}\r',
             '{"meta": {"prompt": "x"}, "id": "n%d", "prompt": "%s"}', '{"id": "t%d", "q": "say \\"prompt", "prompt": "%s"}',
             '{"id": "p%d", "prompt": 7}', '{"id": "k%d", "prompt": "%s", "question": "q"}', ' {"id": "s%d", "prompt": "%s"}',
             '{"id": "d%d", "prompt": "%s", "prompt": "again"}', '{"custom_id": "b%d", "body": {"prompt": "%s"}}']
    rng = random.Random(0)
    lines = []
    for i in range(400):
        kind = rng.choice(kinds)
        lines.append(kind % ((i, rng.choice(docs)) if kind.count("%") == 2 else (i,) if "%" in kind else ()))
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())
    shard = Shard(0, str(path), "mixed")
    monkeypatch.setattr(line_scan, "PART_BYTES", 1000)  # parts of ~1 kB on 3 threads
    monkeypatch.setattr(group_order, "PARSE_CHUNK", 7)  # the parser's lines a few at a time
    monkeypatch.setattr(line_scan.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    for rows in (None, (7, 333)):
        part = shard if rows is None else dataclasses.replace(shard, rows=rows, offset=line_offsets(str(path), [7])[0])
        by_parser = group_order._scan_jsonl(part, FIELDS, 250, parse_all=True)
        by_kernel = group_order._scan_jsonl(part, FIELDS, 250)
        for name in ("rows", "keys", "has_key", "own", "offsets", "lengths"):
            assert getattr(by_kernel, name).tolist() == getattr(by_parser, name).tolist(), (rows, name)
        assert by_kernel.over_long == by_parser.over_long and len(by_kernel.over_long) > 3
        assert 0 < by_kernel.has_key.sum() < len(by_kernel.rows) < len(lines)
    lines_read = line_scan.scan_lines(np.frombuffer(path.read_bytes(), np.uint8), 0, 0, -1, 250, "prompt", "messages")
    assert (lines_read.states == line_scan.OK).sum() > 100  # the kernel read most prompts itself
    texts = ["", "a", "é", "12345678", "123456789", "x" * 300]
    assert len({group_order.text_key(t.encode()) for t in texts}) == len(texts)


def test_first_pass_memory_per_record(tmp_path, write_jsonl):
    path = write_jsonl(qa_rows() * 4)
    s = scan(Shard(0, str(path), "in"), FIELDS, 1 << 20)
    o = order(s, 16)
    assert s.nbytes == 41 * 36 and o.members.nbytes == 8 * 36  # bytes per record: 41 (plain JSONL), then 8 + groups'


def _far_apart(tmp_path, num_docs=1500):
    """A shard whose documents' questions stand far apart: document d's two questions at rows d and num_docs + d, so
    a reader that holds the records of unfinished groups holds half the shard. As JSONL, gzip and Parquet (row groups
    of 256 rows)."""
    rows = [{"id": f"d{d}q{q}", "prompt": f"document {d}: " + "words of its text " * 200, "question": f"question {q}"}
            for q in range(2) for d in range(num_docs)]
    plain = tmp_path / "far.jsonl"
    plain.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    gz = tmp_path / "far.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    pqf = tmp_path / "far.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqf, row_group_size=256)
    return rows, (plain, gz, pqf)


def test_gzip_and_parquet_are_read_in_group_order_holding_no_records(tmp_path):
    """Read in group order, a shard whose questions stand far apart holds no more than a few records' worth of Python
    memory beyond the first pass's arrays (under 1 MB; the records' text is ~3.6 kB each: half the shard is 5.4 MB), and
    each record read equals the one the plain reader makes of its row. The decoded copies leave nothing behind."""
    import tracemalloc

    from spcli.io.read import read_records

    rows, paths = _far_apart(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for path in paths:
        shard = Shard(0, str(path), "far")
        by_row = {r.row: r for r in read_records(shard, FIELDS)}
        arrays = scan(shard, FIELDS, 1 << 20).nbytes + 2 * 8 * len(rows)  # the scan and its order
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            count, peak = 0, 0
            for rec in read_in_order(shard, FIELDS, 0, 1 << 20, 16, tmp_dir=str(tmp)):
                placed = {k: getattr(rec, k) for k in ("group_id", "order_pos", "is_context")}
                assert rec == dataclasses.replace(by_row[rec.row], **placed)
                assert rec.group_id == rec.order_pos // 2  # both questions of a document, one after the other
                count += 1
                peak = max(peak, tracemalloc.get_traced_memory()[0] - base)
        finally:
            tracemalloc.stop()
        assert count == len(rows)
        assert peak < arrays + 1_000_000, (path.name, peak, arrays)
        assert list(tmp.iterdir()) == []


def _run(tmp_path, tiny_dir, path, name, *extra):
    out = tmp_path / name
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--model", str(tiny_dir),
                                   "--instruction-field", "question", *ARGS, "--max-prune-cost", "inf", *extra])
    assert res.exit_code == 0, res.output
    return {r["id"]: {k: v if k != "error" else v and v.split(": ", 2)[-1]  # its message less file:line
                      for k, v in r.items() if not k.endswith(TIMING) and k not in ("row", "shard")}
            for r in read_outputs(out)}, res.output


def test_the_same_shard_in_three_orders_gives_the_same_rows_and_an_error_row_leaves_its_group_grouped(
        tmp_path, tiny_dir, write_jsonl):
    rows = qa_rows()
    rows[4] = {**rows[4], "n": 3}  # d1q1: an error row (n > 1 is refused), inside d1's group
    runs = []
    for seed, name in ((None, "ordered"), (2, "shuffled"), (7, "shuffled-again")):
        order_of = rows if seed is None else random.Random(seed).sample(rows, len(rows))
        got, output = _run(tmp_path, tiny_dir, write_jsonl(order_of, f"{name}.jsonl"), name, "--batch-size", "2")
        runs.append(got)
    assert runs[0] == runs[1] == runs[2]
    rows_out = runs[0]
    assert rows_out["d1q1"]["error"] is not None
    assert {i: (r["group"], r["group_size"]) for i, r in rows_out.items() if r["error"] is None} == {
        **{f"d{d}q{q}": (f"d{d}q0", 3) for d in (0, 2) for q in range(3)}, "d1q0": ("d1q0", 2), "d1q2": ("d1q0", 2)}
    assert all(r["num_kept_tokens"] < r["num_prompt_tokens"] for r in rows_out.values() if r["error"] is None)
    assert ("groups (by the same prompt text (or messages but the last), wherever they stand in a shard, at most 16 "
            "a group): 3 documents, 9 records of documents asked more than once; 3 groups (8 rows) pruned together"
            in " ".join(output.split()))
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "shuffled")])
    assert res.exit_code == 0, res.output
    assert "groups 3 (8 rows) pruned together, 0 (0 rows) prefilled whole; 0 rows alone" in " ".join(res.output.split())


def test_a_short_document_with_long_rows_is_one_group_prefilled_whole(tmp_path, tiny_dir, write_jsonl):
    """A document under --min-tokens (~55 tokens in its template) whose rows, with their short questions, are over it
    (~70): one group prefilled whole, not each row scored (the issue's case)."""
    doc = ("A short note about the weather: it rained on Monday, the wind turned on Tuesday, and by Friday the river "
           "had risen over the old stone bridge.")
    rows = [{"id": f"q{i}", "prompt": doc, "question": q}
            for i, q in enumerate(["Why did it rain?", "How high was the river?", "When did the wind turn?"])]
    got, output = _run(tmp_path, tiny_dir, write_jsonl(rows), "short", "--min-tokens", "60")
    assert all(r["num_prompt_tokens"] >= 60 for r in got.values())  # each row alone would be scored
    assert all(r["group"] == "q0" and r["group_size"] == 3 for r in got.values())
    assert all(r["num_kept_tokens"] == r["num_prompt_tokens"] for r in got.values())  # whole, not scored alone
    assert all(r["speculate_s"] == 0 for r in got.values()) if "speculate_s" in got["q0"] else True
    assert "1 groups (3 rows) prefilled whole (short 1)" in " ".join(output.split())
    assert "tokens prefilled whole, speculator 0.0 s" in output and "scored 0 tokens" in output
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "short")])
    assert "groups 0 (0 rows) pruned together, 1 (3 rows) prefilled whole (short 1); 0 rows alone (one question" \
        not in " ".join(res.output.split())
    assert "groups 0 (0 rows) pruned together, 1 (3 rows) prefilled whole (short 1); 0 rows alone" in " ".join(
        res.output.split())
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "short"), "--id", "q1"])
    assert res.exit_code == 0, "".join(traceback.format_exception(*res.exc_info))
    said = " ".join(res.output.split())
    assert "the document they share" in said and "is under --min-tokens 60" in said, said
    assert "would not beat" not in said


def test_records_of_a_short_shared_part_with_long_own_parts_are_pruned_alone(tmp_path, tiny_dir, write_jsonl):
    """Chats that share a system prompt under --min-tokens: those whose own message has more tokens to drop than they
    keep alone are pruned alone, in any order; those with a short own message (a question) stay one group prefilled
    whole; a lone short one left of its system prompt runs alone. The end line and inspect count each."""
    log = " ".join(f"Ship {i} came in at {i + 5} o'clock with {i * 3} crates of apples." for i in range(9))
    chat = lambda i, system, user: {"id": i, "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": user}]}
    log_keeper, ferry = ("You keep the harbour log of the island, ship by ship, day by day.",
                         "You run the ferry between the island and the mainland, twice a day.")  # ~22 tokens each
    rows = [chat("a0", log_keeper, log + " Which ship came first?"), chat("a1", log_keeper, log + " Which ship came last?"),
            chat("a2", log_keeper, "When does the harbour open?"), chat("a3", log_keeper, "Who keeps the log?"),
            chat("b0", ferry, log + " How many crates came?"), chat("b1", ferry, "Is the ferry late?")]
    args = ("--keep", "0.5", "--min-tokens", "30")
    got, output = _run(tmp_path, tiny_dir, write_jsonl(rows), "ordered", *args)
    shuffled, _ = _run(tmp_path, tiny_dir, write_jsonl(random.Random(1).sample(rows, 6), "s.jsonl"), "shuffled", *args)
    assert shuffled == got
    assert all(got[i]["num_prompt_tokens"] >= 30 for i in ("a2", "b1"))  # each long enough to prune alone
    for i in ("a0", "a1", "b0"):  # pruned alone
        assert got[i]["group"] is None and got[i]["num_kept_tokens"] < got[i]["num_prompt_tokens"], got[i]
    assert {i: (got[i]["group"], got[i]["group_size"]) for i in ("a2", "a3")} == {"a2": ("a2", 2), "a3": ("a2", 2)}
    assert all(got[i]["num_kept_tokens"] == got[i]["num_prompt_tokens"] for i in ("a2", "a3"))  # whole, not scored
    assert got["b1"]["group"] is None
    line = " ".join(output.split())
    assert ("0 groups (0 rows) pruned together, 1 groups (2 rows) prefilled whole (short 1), 4 rows alone that could "
            "share (own part long 3, rest pruned alone 1)") in line, line
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "shuffled")])
    assert ("groups 0 (0 rows) pruned together, 1 (2 rows) prefilled whole (short 1); 4 rows alone (own part long 3, "
            "rest pruned alone 1)") in " ".join(res.output.split()), res.output


def test_a_directory_of_the_consecutive_rule_resumes_with_it(tmp_path, tiny_dir, write_jsonl):
    """A manifest as the code before --groups shard wrote it (config and fingerprint: groups "auto", the consecutive
    rule) resumes with that rule, and its fingerprint matches; a new directory groups by shard."""
    path = write_jsonl(qa_rows())
    out = tmp_path / "old"
    _, output = _run(tmp_path, tiny_dir, path, "old", "--groups", "consecutive", "--batch-size", "3",
                     "--commit-interval", "0")
    manifest = out / "manifest.json"
    doc = orjson.loads(manifest.read_bytes())
    assert doc["fingerprint_fields"]["groups"] == "auto"  # what the old code wrote
    doc["config"]["groups"] = "auto"
    shard = doc["shards"]["0"]
    last = shard["parts"].pop()
    (out / last).unlink()
    shard.update(done=False, next_row=6, rows=6, total_rows=None)
    manifest.write_bytes(orjson.dumps(doc))
    full, _ = _run(tmp_path, tiny_dir, path, "ref", "--groups", "consecutive")
    resumed, output = _run(tmp_path, tiny_dir, path, "old")
    assert "groups: consecutive" in output and "resuming" in output
    assert resumed == full
    cfg = RunConfig(inputs=("x",), out="o", model="m")
    assert cfg.fingerprint_fields()["groups"] == "shard"
    with_rule = {**cfg.fingerprint_fields(), "groups": "auto"}
    from spcli.job.manifest import resumed_groups
    assert resumed_groups(with_rule) == "consecutive" and resumed_groups(cfg.fingerprint_fields()) == "shard"


def test_slurm_tasks_own_whole_shards_so_never_a_part_of_a_group():
    """A group lies within one shard (spcli.io.group_order), and a Slurm task owns whole shards: every shard goes to
    exactly one task."""
    from spcli.slurm.tasks import assign_shards

    owned = [i for task in range(3) for i in assign_shards([f"s{i}" for i in range(7)], task, 3)]
    assert sorted(owned) == list(range(7))


def test_retry_failed_redoes_an_error_row_with_its_group_found_anywhere(tmp_path, tiny_dir, write_jsonl):
    """--retry-failed under --groups shard: the mended record is redone with its document's other questions (wherever
    they stand) as context, joining their group; their rows stand as committed."""
    rows = random.Random(3).sample(qa_rows(), 9)
    bad = next(i for i, r in enumerate(rows) if r["id"] == "d2q1")
    rows[bad] = {**rows[bad], "n": 3}
    path = write_jsonl(rows)
    before, _ = _run(tmp_path, tiny_dir, path, "r", "--batch-size", "2")
    assert before["d2q1"]["error"] is not None and before["d2q0"]["group_size"] == 2
    rows[bad] = {k: v for k, v in rows[bad].items() if k != "n"}
    write_jsonl(rows)
    after, output = _run(tmp_path, tiny_dir, path, "r", "--batch-size", "2", "--retry-failed", "--force")
    assert "1 failed row redone (1 now without error)" in output
    assert after["d2q1"]["error"] is None and after["d2q1"]["group"] == "d2q0"
    assert {i: r for i, r in after.items() if i != "d2q1"} == {i: r for i, r in before.items() if i != "d2q1"}
