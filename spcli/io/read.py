"""Stream records from JSONL (plain or gzip) and Parquet shards, starting at a given row.

File-level problems (unreadable, not the format its name says, truncated compression, a Parquet
file without the prompt column) raise `InputError`; everything wrong with one record becomes an
error row. A line is never held in memory beyond `max_record_bytes`.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator

import orjson

from spcli.config.run import FieldConfig
from spcli.errors import InputError
from spcli.io.groups import same_group, window_start
from spcli.io.parquet import open_parquet, parquet_columns, read_parquet
from spcli.io.records import Record, bad_record, to_record, too_long_record
from spcli.io.shards import Shard, shard_kind

DRAIN_BYTES = 1 << 20
ID_SCAN_BYTES = 1 << 16  # an over-long JSONL record's id is looked for in its first 64 KiB
GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
UTF8_BOM = b"\xef\xbb\xbf"


def read_records(shard: Shard, fields: FieldConfig, start_row: int = 0, max_record_bytes: int = 8 << 20) -> Iterator[Record]:
    """Yield the shard's records from `start_row` on (within its row range, where it has one), in order; bad
    records carry `error`."""
    kind = shard_kind(shard.path)
    start_row = max(start_row, shard.first_row)
    if kind == "parquet":
        records = read_parquet(shard, fields, start_row, max_record_bytes)
    else:
        records = _read_jsonl(shard, fields, start_row, kind, max_record_bytes)
    if shard.rows is None:
        yield from records
        return
    for rec in records:
        if rec.row >= shard.rows[1]:
            return
        yield rec


def read_from(shard: Shard, fields: FieldConfig, start_row: int, max_record_bytes: int,
              group_max: int | None = None) -> Iterator[Record]:
    """read_records from start_row; with groups (group_max given), the records before start_row that share its group
    come first, marked is_context (a group cut by a resume point or a range edge is read whole; spcli.io.groups)."""
    if group_max is None or start_row == 0:
        yield from read_records(shard, fields, start_row, max_record_bytes)
        return
    before: list[Record] = []
    for rec in read_records(shard, fields, window_start(start_row, group_max), max_record_bytes):
        if rec.row < start_row:
            before.append(rec)
            continue
        context, cur = [], rec
        while before and same_group(before[-1], cur, group_max):
            cur = before.pop()
            context.append(cur)
        for c in reversed(context):
            c.is_context = True
            yield c
        before = []
        yield rec


def check_shard(shard: Shard, fields: FieldConfig) -> str | None:
    """Cheap checks before any model is loaded: raises InputError, or returns a warning (empty file)."""
    kind = shard_kind(shard.path)
    try:
        with open(shard.path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e
    if kind == "parquet":
        if not head:
            return f"{shard.path}: empty file (no records)"  # as a 0-byte JSONL shard
        pf = open_parquet(shard)
        parquet_columns(pf, shard, fields)
        return f"{shard.path}: Parquet file has no rows" if pf.metadata.num_rows == 0 else None
    if not head:
        return f"{shard.path}: empty file (no records)"
    if kind == "jsonl.gz" and not head.startswith(GZIP_MAGIC):
        raise InputError(f"{shard.path}: not a gzip file (name it .jsonl if it is plain text)")
    if kind == "jsonl" and head.startswith(GZIP_MAGIC):
        raise InputError(f"{shard.path}: file is gzip-compressed; name it .jsonl.gz")
    if kind == "jsonl" and head == PARQUET_MAGIC:
        raise InputError(f"{shard.path}: file is Parquet; name it .parquet")
    try:
        first = _first_line(shard.path, gzip.open if kind == "jsonl.gz" else open)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    if kind == "jsonl" and first in (b"[", b"{"):
        raise InputError(f"{shard.path}: pretty-printed JSON, not JSON Lines (one record per line)")
    check_id_field(shard, fields, first)
    return None


def first_record(shard: Shard) -> object:
    """A JSONL shard's first record decoded (None where it is not JSON, or the shard is Parquet or empty)."""
    kind = shard_kind(shard.path)
    if kind == "parquet":
        return None
    try:
        return orjson.loads(_first_line(shard.path, gzip.open if kind == "jsonl.gz" else open))
    except (orjson.JSONDecodeError, OSError, EOFError, zlib.error):
        return None


def check_id_field(shard: Shard, fields: FieldConfig, first: bytes) -> None:
    """A named --id-field that the first record lacks is a mistyped name, not rows to number: refuse it,
    naming the fields present (the default `id` may be absent: ids are then <file stem>:<row>)."""
    if fields.id == FieldConfig().id:
        return
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return  # that record becomes an error row of its own
    if isinstance(obj, dict) and fields.id not in obj and not ("custom_id" in obj and "body" in obj):
        raise InputError(f"{shard.path}: the first record has no field {fields.id!r} (--id-field); its fields: "
                         f"{', '.join(sorted(map(str, obj)))}")


def _first_line(path: str, opener=open) -> bytes:
    with opener(path, "rb") as f:
        for line in iter(lambda: f.readline(1 << 16), b""):
            if line.strip():
                return line.strip().lstrip(UTF8_BOM)
    return b""


def _lines(f, limit: int, row: int = 0) -> Iterator[tuple[int, bytes | None, int, bytes]]:
    """(line index, counted from `row`, line or None when longer than `limit`, its size in bytes, the first
    ID_SCAN_BYTES of an over-long line: where its id may be found)."""
    while line := f.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            size = len(line)
            while (chunk := f.readline(DRAIN_BYTES)) and not chunk.endswith(b"\n"):
                size += len(chunk)
            size += len(chunk) - (1 if chunk.endswith(b"\n") else 0)
            yield row, None, size, line[:ID_SCAN_BYTES]
        else:
            yield row, line, len(line), b""
        row += 1


def _id_in(head: bytes, fields: FieldConfig) -> tuple[str, bool] | None:
    """An over-long JSONL record's id, and whether it is an OpenAI custom_id, where it comes before the text
    that is too long."""
    for key in ("custom_id", fields.id):
        m = re.search(rb'"' + re.escape(key.encode()) + rb'"\s*:\s*("(?:[^"\\]|\\.){1,1024}"|-?\d{1,30})\s*[,}]', head)
        if m:
            try:
                value = orjson.loads(m.group(1))
            except orjson.JSONDecodeError:
                continue
            if str(value):
                return str(value), key == "custom_id"
    return None


def _read_jsonl(shard: Shard, fields: FieldConfig, start_row: int, kind: str, limit: int) -> Iterator[Record]:
    opener = gzip.open if kind == "jsonl.gz" else open
    try:
        with opener(shard.path, "rb") as f:
            first = 0
            if shard.offset and kind == "jsonl":
                f.seek(shard.offset)
                first = shard.first_row
            for row, line, size, head in _lines(f, limit, first):
                if row < start_row:
                    continue
                rec = line_record(shard, row, line, size, head, kind, fields, limit)
                if rec is not None:  # blank lines are not records
                    yield rec
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e


def line_record(shard: Shard, row: int, line: bytes | None, size: int, head: bytes, kind: str, fields: FieldConfig,
                limit: int) -> Record | None:
    """The record of one JSONL line (None for a blank line; `line` None: longer than `limit`, `head` its start)."""
    if line is None:
        return too_long_record(shard, row, size, limit, _id_in(head, fields))
    if row == 0 and line.startswith(UTF8_BOM):
        line = line[len(UTF8_BOM):]
    if not line.strip():
        return None
    line = line.rstrip(b"\r\n")
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        return _surrogate_record(line, shard, row, kind, fields) or bad_record(shard, row, _json_problem(line, e))
    return to_record(obj, shard, row, kind, fields)


def _surrogate_record(line: bytes, shard: Shard, row: int, kind: str, fields: FieldConfig) -> Record | None:
    """A line that is valid JSON but not valid Unicode (a lone surrogate escape such as \\ud800, which
    orjson refuses): an error row that keeps the record's own id where the id itself is valid."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    rec = to_record(obj, shard, row, kind, fields)
    fallback = bad_record(shard, row, "record is valid JSON but not valid Unicode (a lone surrogate escape such as "
                                      "\\ud800); encode its text as UTF-8")
    if not all(_is_unicode(v) for v in (rec.id, rec.custom_id)):
        return fallback
    rec.error, rec.prompt, rec.messages = fallback.error, None, None
    return rec


def _is_unicode(text: str | None) -> bool:
    try:
        text is None or text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_problem(line: bytes, e: orjson.JSONDecodeError) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as u:
        return f"invalid UTF-8 at byte {u.start}"
    return f"malformed JSON ({e.msg} at column {e.pos + 1})"


