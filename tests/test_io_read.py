"""Reading shards (spcli/io/read.py, records.py, ids.py) without a model: every problem named exactly."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spcli.config.run import FieldConfig
from spcli.errors import ConfigError, InputError
from spcli.io.ids import IdIndex
from spcli.io.read import check_shard, read_records
from spcli.io.count import count_rows
from spcli.io.records import to_record
from spcli.io.shards import Shard, discover, id_prefixes

FIELDS = FieldConfig()


def records(path, start_row: int = 0, limit: int = 8 << 20):
    (shard,) = discover([str(path)])
    return list(read_records(shard, FIELDS, start_row, limit))


def one_error(tmp_path, line: bytes | str) -> str:
    path = tmp_path / "one.jsonl"
    path.write_bytes((line if isinstance(line, bytes) else line.encode()) + b"\n")
    (rec,) = records(path)
    return rec.error


@pytest.mark.parametrize("line, message", [
    ('{"id": "x", "prompt": "a" ', "malformed JSON (unexpected end of data at column 27)"),
    ("[1, 2]", "record must be a JSON object, got list"),
    ('"text"', "record must be a JSON object, got str"),
    ('{"id": "x"}', "field 'prompt' (or 'messages') is missing or null"),
    ('{"id": "x", "prompt": null}', "field 'prompt' (or 'messages') is missing or null"),
    ('{"id": "x", "prompt": "  "}', "field 'prompt' is empty"),
    ('{"id": "x", "prompt": ["a"]}', "field 'prompt' must be a string, got list"),
    ('{"id": "x", "messages": "hi"}', "field 'messages' must be a non-empty list of {role, content} objects"),
    ('{"id": "x", "messages": []}', "field 'messages' must be a non-empty list of {role, content} objects"),
    ('{"id": "x", "messages": ["hi"]}', "field 'messages'[0] must be an object with role and content"),
    ('{"id": "x", "messages": [{"content": "hi"}]}',
     "field 'messages'[0].role must be one of system, user, assistant, tool, developer, got None"),
    ('{"id": "x", "messages": [{"role": "wizard", "content": "hi"}]}',
     "field 'messages'[0].role must be one of system, user, assistant, tool, developer, got 'wizard'"),
    ('{"id": "x", "messages": [{"role": "user"}]}', "field 'messages'[0].content must be a string or a list of text parts"),
    ('{"id": "x", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
     "record has both 'prompt' and 'messages'; give one"),
    ('{"id": "x", "prompt": "a", "keep": 0}', "field 'keep' must be in (0, 1], got 0"),
    ('{"id": "x", "prompt": "a", "keep": 1.5}', "field 'keep' must be in (0, 1], got 1.5"),
    ('{"id": "x", "prompt": "a", "keep": "half"}', "field 'keep' must be a number in (0, 1] or \"auto\", got 'half'"),
    ('{"id": "x", "prompt": "a", "max_tokens": 0}', "field 'max_tokens' must be in [1, 1048576], got 0"),
    ('{"id": "x", "prompt": "a", "max_tokens": 2.5}', "field 'max_tokens' must be an integer, got 2.5"),
    ('{"id": "x", "prompt": "a", "max_tokens": true}', "field 'max_tokens' must be an integer, got True"),
    ('{"id": ["x"], "prompt": "a"}', "field 'id' must be a non-empty string or integer, got ['x']"),
])
def test_record_problems_name_file_line_and_field(tmp_path, line, message):
    assert one_error(tmp_path, line) == f"{tmp_path}/one.jsonl:row 0 (line 1): {message}"


def test_invalid_utf8_is_an_error_row_and_reading_goes_on(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n{"id": "b", "prompt": "fine"}\n')
    bad, good = records(path)
    assert (bad.id, bad.error) == ("u:0", f"{path}:row 0 (line 1): invalid UTF-8 at byte 26")
    assert (good.id, good.prompt, good.error) == ("b", "fine", None)


def test_a_line_over_the_record_limit_is_skipped_without_being_held(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"id": "a", "prompt": "short"}\n')
        f.write(b'{"id": "huge", "prompt": "' + b"x" * (3 << 20) + b'"}\n')
        f.write(b'{"id": "c", "prompt": "after"}')  # no final newline
    a, huge, c = records(path, limit=1 << 20)
    assert huge.id == "huge" and huge.prompt is None, "named by its own id (it was big:1)"
    assert huge.error == f"{path}:row 1 (line 2): record is {(3 << 20) + 28} bytes, more than --max-record-bytes {1 << 20}"
    assert (a.prompt, c.prompt, c.row) == ("short", "after", 2)


def test_blank_lines_and_a_bom_are_not_records_but_keep_line_numbers(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "one"}\n\n   \n{"prompt": "two"}\r\n')
    one, two = records(path)
    assert (one.id, one.prompt, two.id, two.prompt) == ("b:0", "one", "b:3", "two")
    assert [r.row for r in records(path, start_row=1)] == [3]
    assert count_rows(discover([str(path)])[0]) == 2


def test_openai_request_lines(tmp_path):
    path = tmp_path / "batch.jsonl"
    lines = [
        {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "keep": 0.5}},
        {"custom_id": "c2", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "hello", "temperature": 0}},
        {"custom_id": "c3", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"custom_id": "c4", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], "n": 2}},
        {"custom_id": "c5", "url": "/v1/chat/completions", "body": {"prompt": "x"}},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    c1, c2, c3, c4, c5 = records(path)
    assert (c1.id, c1.custom_id, c1.endpoint, c1.max_tokens, c1.keep, c1.error) == ("c1", "c1", "/v1/chat/completions", 3, 0.5, None)
    assert (c2.prompt, c2.endpoint, c2.temperature, c2.error) == ("hello", "/v1/completions", 0.0, None)
    assert c3.error == f"{path}:row 2 (line 3): field 'url' must be /v1/chat/completions or /v1/completions, got '/v1/embeddings'"
    assert c4.error == f"{path}:row 3 (line 4): field 'body.n' must be 1 (one completion per request), got 2"
    assert c5.error == f"{path}:row 4 (line 5): a /v1/chat/completions request needs 'body.messages', not 'body.prompt'"
    assert c3.custom_id == "c3", "an error row still carries its custom_id"


def test_parquet_reads_only_needed_columns_from_any_row(tmp_path):
    path = tmp_path / "p.parquet"
    n = 2500
    table = pa.table({"id": [f"p{i}" for i in range(n)], "prompt": [f"text {i}" for i in range(n)],
                      "unused": [b"\0" * 100] * n, "keep": [0.5] * n})
    pq.write_table(table, path, row_group_size=700)
    got = records(path, start_row=1399)
    assert [r.row for r in got] == list(range(1399, n)) and got[0].id == "p1399" and got[0].keep == 0.5
    assert len(records(path)) == n


def test_parquet_invalid_utf8_cell_is_an_error_row(tmp_path):
    offsets = pa.array([0, 2, 4], pa.int32()).buffers()[1]
    prompts = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ok\xff\xfe")])
    path = tmp_path / "u.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": prompts}), path)
    a, b = records(path)
    assert (a.prompt, b.id, b.error) == ("ok", "u:1", f"{path}:row 1: invalid UTF-8 at byte 0 of a string column")


def test_parquet_oversized_cell_is_an_error_row(tmp_path):
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x" * 5000, "small"]}), path)
    a, b = records(path, limit=4096)
    assert a.error == f"{path}:row 0: record is 5000 bytes, more than --max-record-bytes 4096"
    assert a.id == "a", "named by its own id (it was big:0)"
    assert b.prompt == "small"


def shard(path) -> Shard:
    return Shard(0, str(path))


def test_file_level_problems(tmp_path):
    (tmp_path / "empty.parquet").write_bytes(b"")  # as a 0-byte JSONL file: no records, a warning
    assert check_shard(shard(tmp_path / "empty.parquet"), FIELDS) == f"{tmp_path}/empty.parquet: empty file (no records)"
    assert records(tmp_path / "empty.parquet") == [] and count_rows(shard(tmp_path / "empty.parquet")) == 0

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["a"] * 100}), good)
    (tmp_path / "cut.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputError, match=r"cut.parquet: not a readable Parquet file \("):
        check_shard(shard(tmp_path / "cut.parquet"), FIELDS)

    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "cols.parquet")
    with pytest.raises(InputError) as e:
        check_shard(shard(tmp_path / "cols.parquet"), FIELDS)
    assert str(e.value) == (f"{tmp_path}/cols.parquet: Parquet file has no 'prompt' or 'messages' column (columns: text); "
                            "name yours with --prompt-field or --messages-field")

    (tmp_path / "plain.jsonl.gz").write_text('{"prompt": "a"}\n')
    with pytest.raises(InputError, match=r"plain.jsonl.gz: not a gzip file \(name it .jsonl if it is plain text\)$"):
        check_shard(shard(tmp_path / "plain.jsonl.gz"), FIELDS)
    (tmp_path / "zipped.jsonl").write_bytes(gzip.compress(b'{"prompt": "a"}\n'))
    with pytest.raises(InputError, match=r"zipped.jsonl: file is gzip-compressed; name it .jsonl.gz$"):
        check_shard(shard(tmp_path / "zipped.jsonl"), FIELDS)

    (tmp_path / "e.jsonl").write_bytes(b"")
    assert check_shard(shard(tmp_path / "e.jsonl"), FIELDS) == f"{tmp_path}/e.jsonl: empty file (no records)"
    assert records(tmp_path / "e.jsonl") == []


def test_truncated_gzip_is_a_file_error_after_the_rows_before_it(tmp_path):
    data = gzip.compress(b"".join(b'{"prompt": "row %d"}\n' % i for i in range(2000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    check_shard(shard(path), FIELDS)  # the header is fine: only streaming finds the cut
    seen = []
    with pytest.raises(InputError) as e:
        for rec in read_records(shard(path), FIELDS):
            seen.append(rec)
    assert str(e.value).startswith(f"{path}: compressed file is truncated or corrupt (")
    assert seen and all(r.error is None for r in seen)


def test_corrupt_parquet_pages_are_a_file_error(tmp_path):
    path = tmp_path / "rot.parquet"
    pq.write_table(pa.table({"prompt": [f"{i} " * 50 for i in range(3000)]}), path, compression="zstd", row_group_size=1000)
    data = bytearray(path.read_bytes())
    mid = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data[mid + 40: mid + 400] = bytes(360)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"rot.parquet: corrupt Parquet data in row group 1 \(rows 1000-1999\): "):
        records(path)


def test_discover(tmp_path):
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "notes.txt").write_text("x")
    with pytest.raises(InputError) as e:
        discover([str(tmp_path / "none")])
    assert str(e.value) == f"{tmp_path}/none: directory has no shards (*.jsonl, *.jsonl.gz, *.parquet); not shards: notes.txt"
    with pytest.raises(InputError, match=r"missing.jsonl: no such file or directory$"):
        discover([str(tmp_path / "missing.jsonl")])
    with pytest.raises(InputError, match=r"nothing\*.jsonl: glob matches no shards$"):
        discover([str(tmp_path / "nothing*.jsonl")])

    data = tmp_path / "data"
    (data / "out").mkdir(parents=True)
    (data / "a.jsonl").write_text("{}\n")
    (data / "out" / "part-00000-00000.jsonl").write_text("{}\n")
    assert [s.path for s in discover([str(data)], exclude=data / "out")] == [str(data / "a.jsonl")]


def test_generated_ids_stay_unique_when_file_names_repeat():
    assert id_prefixes(["/d/x.jsonl", "/d/y.parquet"]) == ["x", "y"]
    assert id_prefixes(["/d/2024/train.jsonl", "/d/2025/train.jsonl", "/d/2025/dev.jsonl"]) == ["2024/train", "2025/train", "dev"]
    assert id_prefixes(["/d/train.jsonl", "/d/train.jsonl.gz"]) == ["train.jsonl", "train.jsonl.gz"]


def test_id_index_matches_a_dict_through_growth():
    rng = random.Random(0)
    index, ref = IdIndex(capacity=16), {}
    for n in range(30000):
        key = f"id-{rng.randrange(20000)}"
        assert index.setdefault(key, n % 3, n) == ref.get(key)
        ref.setdefault(key, (n % 3, n))
    assert len(index) == len(ref) and len(index.keys) >= len(ref) / 0.6


def test_parquet_non_finite_numbers_and_openai_bodies_are_error_rows(tmp_path):
    path = tmp_path / "nf.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "max_tokens": [float("nan"), 2.0], "keep": [float("inf"), 0.5]}), path)
    a, b = records(path)
    assert a.error == f"{path}:row 0: field 'max_tokens' must be an integer, got nan"
    assert (b.max_tokens, b.keep, b.error) == (2, 0.5, None)
    assert one_error(tmp_path, '{"custom_id": "c", "body": "text"}') == f"{tmp_path}/one.jsonl:row 0 (line 1): field 'body' must be an object, got str"


@pytest.mark.parametrize("text", ['[\n  {"prompt": "a"}\n]\n', '{\n  "prompt": "a"\n}\n'])
def test_pretty_printed_json_is_not_json_lines(tmp_path, text):
    path = tmp_path / "data.json"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        check_shard(shard(path), FIELDS)
    assert str(e.value) == f"{path}: pretty-printed JSON, not JSON Lines (one record per line)"


@pytest.mark.parametrize("body, refused", [
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"tools": [{"type": "function"}]}, "tools"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"response_format": {"type": "text"}, "tools": [], "top_logprobs": 0}, None),
])
def test_openai_fields_that_are_no_generation_parameter_are_refused_by_name(tmp_path, body, refused):
    """Fields of the OpenAI request that spcli does not apply and that are not SamplingParams: an error row naming
    each, unless it holds the value that changes nothing."""
    line = {"custom_id": "c", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "x"}], **body}}
    error = one_error(tmp_path, json.dumps(line))
    if refused is None:
        assert error is None
    else:
        assert error.startswith(f"{tmp_path}/one.jsonl:row 0 (line 1): field 'body.{refused}' is not supported ("), error
        assert error.endswith("; remove it from the request")


def test_a_named_id_field_that_is_missing_is_an_error_naming_the_fields(tmp_path):
    """The issue: `--id-field id_of_ticket` (mistyped) ran with ids tickets:0, tickets:1, ..."""
    fields = FieldConfig(id="id_of_ticket")
    pq.write_table(pa.table({"ticket_id": ["a"], "prompt": ["hello"]}), tmp_path / "t.parquet")
    with pytest.raises(InputError) as e:
        check_shard(shard(tmp_path / "t.parquet"), fields)
    assert str(e.value) == (f"{tmp_path}/t.parquet: Parquet file has no 'id_of_ticket' column (--id-field); its columns: "
                            "prompt, ticket_id")
    for name, opener in (("t.jsonl", open), ("t.jsonl.gz", gzip.open)):
        with opener(tmp_path / name, "wt") as f:
            f.write('{"ticket_id": "a", "prompt": "hello"}\n')
        with pytest.raises(InputError) as e:
            check_shard(shard(tmp_path / name), fields)
        assert str(e.value) == (f"{tmp_path}/{name}: the first record has no field 'id_of_ticket' (--id-field); its "
                                "fields: prompt, ticket_id")
        assert check_shard(shard(tmp_path / name), FieldConfig(id="ticket_id")) is None
        assert check_shard(shard(tmp_path / name), FIELDS) is None, "the default id may be absent: ids are generated"


def test_row_counts_of_gzip_jsonl(tmp_path):
    path = tmp_path / "g.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(b'{"prompt": "row %d"}\n' % i for i in range(7)) + b"\n"))
    assert count_rows(shard(path)) == 7


def test_files_a_directory_input_skips_are_named(tmp_path, caplog):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    for name in ("a.jsonl", "sub/b.parquet", "c.csv", "notes.txt", "README.md"):
        (d / name).write_text("")
    with caplog.at_level("WARNING", logger="spcli"):
        shards = discover([str(d)])
    assert [Path(s.path).name for s in shards] == ["a.jsonl", "b.parquet"]
    assert (f"{d}: skipped 3 files that are not shards (*.jsonl, *.jsonl.gz, *.parquet): README.md, c.csv, notes.txt"
            in caplog.messages)
    (d / "a.jsonl").unlink()
    (d / "sub" / "b.parquet").unlink()
    with pytest.raises(InputError, match=r"directory has no shards \(\*.jsonl, \*.jsonl.gz, \*.parquet\); not shards: "
                                         r"README.md, c.csv, notes.txt$"):
        discover([str(d)])


def test_an_over_long_record_is_named_by_its_id_where_it_has_one(tmp_path):
    """The issue: an over-long record was named `huge:2`, not by its id. Its id is read from the record's first
    64 KiB (the record itself is never held); an id after the long text, or none, leaves `<stem>:<row>`."""
    path = tmp_path / "huge.jsonl"
    long = "x" * 5000
    lines = [{"id": 7, "prompt": long}, {"prompt": long, "id": "late"}, {"prompt": long},
             {"custom_id": "req-1", "body": {"messages": [{"role": "user", "content": long}]}},
             {"ticket": "t\"q", "prompt": long}]
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    recs = records(path, limit=4096)
    assert [r.id for r in recs[:4]] == ["7", "huge:1", "huge:2", "req-1"]
    assert recs[3].custom_id == "req-1" and recs[0].custom_id is None
    assert all("more than --max-record-bytes 4096" in r.error for r in recs)
    (rec,) = list(read_records(Shard(0, str(path)), FieldConfig(id="ticket"), 4, 4096))
    assert rec.id == 't"q'


def test_instruction_field_is_read_from_parquet_as_from_jsonl(tmp_path):
    """`--instruction-field question`: the same record gives the same prompt and protected text in both formats
    (Parquet dropped the column: 6 prompt tokens against 14, exit 0, issue 40)."""
    row = {"ticket_id": "t1", "body": "The printer on floor three jams on duplex pages.", "question": "Which floor?"}
    fields = FieldConfig(prompt="body", id="ticket_id", instruction="question")
    jl = tmp_path / "t.jsonl"
    jl.write_text(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "t.parquet")
    got = {}
    for name in ("t.jsonl", "t.parquet"):
        (shard,) = discover([str(tmp_path / name)])
        (rec,) = read_records(shard, fields)
        got[name] = (rec.id, rec.prompt, rec.protected, rec.error)
    assert got["t.jsonl"] == got["t.parquet"] == ("t1", row["body"] + "\n\nWhich floor?", ("Which floor?",), None)
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in row.items() if k != "question"}]), tmp_path / "n.parquet")
    (shard,) = discover([str(tmp_path / "n.parquet")])
    with pytest.raises(InputError, match="no 'question' column .--instruction-field.; its columns: body, ticket_id"):
        list(read_records(shard, fields))


def test_instruction_goes_after_the_last_user_message_or_before_the_first():
    """--instruction-at after (default): after the prompt, or the last user message's content (the question right
    before the answer); before: before the prompt or the first user message's content. Other messages unchanged."""
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ticket one."},
            {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Ticket two."}]
    shard = Shard(0, "x.jsonl")
    for at, prompt, contents in (
            ("after", "Body.\n\nWhich floor?", ["Be brief.", "Ticket one.", "Noted.", "Ticket two.\n\nWhich floor?"]),
            ("before", "Which floor?\n\nBody.", ["Be brief.", "Which floor?\n\nTicket one.", "Noted.", "Ticket two."])):
        fields = FieldConfig(instruction_at=at)
        raw = to_record({"prompt": "Body.", "instruction": "Which floor?"}, shard, 0, "jsonl", fields)
        msgs = to_record({"messages": chat, "instruction": "Which floor?"}, shard, 1, "jsonl", fields)
        assert (raw.prompt, raw.protected, raw.error) == (prompt, ("Which floor?",), None)
        assert [m["content"] for m in msgs.messages] == contents and msgs.error is None
    assert chat[3]["content"] == "Ticket two."  # the input's own messages are not changed
    with pytest.raises(ConfigError, match="--instruction-at must be one of after, before, got 'middle'"):
        FieldConfig(instruction_at="middle")
