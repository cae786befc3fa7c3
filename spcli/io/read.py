"""Stream records from JSONL (plain or gzip) and Parquet shards, starting at a given row.

File-level problems (unreadable, not the format its name says, truncated compression, a Parquet
file without the prompt column) raise `InputError`; everything wrong with one record becomes an
error row. A line is never held in memory beyond `max_record_bytes`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator
from itertools import islice

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.config import FieldConfig
from spcli.errors import InputError
from spcli.io.records import Record, Shard, bad_record, shard_kind, to_record

PARQUET_BATCH_ROWS = 1024
PARQUET_BUFFER_BYTES = 1 << 20  # stream column chunks page by page: memory stays flat with row-group size
DRAIN_BYTES = 1 << 20
SCAN_BYTES = 1 << 22  # a plain JSONL file's newlines are counted 4 MiB at a time (line_offsets, count_positions)
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
        records = _read_parquet(shard, fields, start_row, max_record_bytes)
    else:
        records = _read_jsonl(shard, fields, start_row, kind, max_record_bytes)
    if shard.rows is None:
        yield from records
        return
    for rec in records:
        if rec.row >= shard.rows[1]:
            return
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
        pf = _open_parquet(shard)
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


def _too_long(shard: Shard, row: int, size: int, limit: int, found: tuple[str, bool] | None) -> Record:
    """The error row of a record over --max-record-bytes, named by its own id where it has one."""
    rec = bad_record(shard, row, f"record is {size} bytes, more than --max-record-bytes {limit}")
    if found is not None:
        rec.id, is_custom = found
        rec.custom_id = rec.id if is_custom else None
    return rec


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
                if line is None:
                    yield _too_long(shard, row, size, limit, _id_in(head, fields))
                    continue
                if row == 0 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM):]
                if not line.strip():
                    continue  # blank lines are not records
                line = line.rstrip(b"\r\n")
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    yield _surrogate_record(line, shard, row, kind, fields) or bad_record(shard, row, _json_problem(line, e))
                    continue
                yield to_record(obj, shard, row, kind, fields)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e


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


def _open_parquet(shard: Shard) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(shard.path, buffer_size=PARQUET_BUFFER_BYTES)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{shard.path}: not a readable Parquet file ({e})") from e


def parquet_columns(pf: pq.ParquetFile, shard: Shard, fields: FieldConfig) -> list[str]:
    names = set(pf.schema_arrow.names)
    if fields.prompt not in names and fields.messages not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.prompt!r} or {fields.messages!r} column "
                         f"(columns: {', '.join(sorted(names))}); name yours with --prompt-field or --messages-field")
    if fields.id != FieldConfig().id and fields.id not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.id!r} column (--id-field); its columns: "
                         f"{', '.join(sorted(names))}")
    if fields.instruction != FieldConfig().instruction and fields.instruction not in names:
        raise InputError(f"{shard.path}: Parquet file has no {fields.instruction!r} column (--instruction-field); its "
                         f"columns: {', '.join(sorted(names))}")
    wanted = [fields.id, fields.prompt, fields.messages, fields.instruction, "max_tokens", "keep", "temperature"]
    return list(dict.fromkeys(c for c in wanted if c in names))


def _record_bytes(obj: dict, fields: FieldConfig, limit: int) -> int:
    """UTF-8 size of a row's prompt or message contents (exact only where it could exceed `limit`)."""
    texts = [obj.get(fields.prompt)]
    if isinstance(obj.get(fields.messages), list):
        texts += [m.get("content") for m in obj[fields.messages] if isinstance(m, dict)]
    texts = [t for t in texts if isinstance(t, (str, bytes))]
    size = sum(len(t) for t in texts)
    if 4 * size <= limit:  # a character is at most 4 bytes
        return size
    return sum(len(t) if isinstance(t, bytes) else len(t.encode("utf-8", "surrogatepass")) for t in texts)


def _rows(batch: pa.RecordBatch) -> Iterator[dict | str]:
    """A batch's rows as dicts; a row whose strings are not valid UTF-8 comes as the problem's text."""
    try:
        yield from batch.to_pylist()
    except UnicodeDecodeError:
        for i in range(batch.num_rows):
            try:
                yield batch.slice(i, 1).to_pylist()[0]
            except UnicodeDecodeError as u:
                yield f"invalid UTF-8 at byte {u.start} of a string column"


def _read_parquet(shard: Shard, fields: FieldConfig, start_row: int, limit: int) -> Iterator[Record]:
    if _is_empty(shard.path):
        return
    pf = _open_parquet(shard)
    columns = parquet_columns(pf, shard, fields)
    first = 0  # first row of row group g
    for g in range(pf.num_row_groups):
        num_rows = pf.metadata.row_group(g).num_rows
        if first + num_rows > start_row:
            yield from _read_row_group(pf, g, first, num_rows, columns, shard, fields, start_row, limit)
        first += num_rows


def _read_row_group(pf: pq.ParquetFile, g: int, first: int, num_rows: int, columns: list[str], shard: Shard,
                    fields: FieldConfig, start_row: int, limit: int) -> Iterator[Record]:
    row = first
    batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[g], columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"{shard.path}: corrupt Parquet data in row group {g} (rows {first}-{first + num_rows - 1}): {e}") from e
        if batch is None:
            return
        if row + batch.num_rows <= start_row:
            row += batch.num_rows
            continue
        for obj in _rows(batch):
            if row >= start_row:
                if isinstance(obj, str):
                    yield bad_record(shard, row, obj)
                elif (size := _record_bytes(obj, fields, limit)) > limit:
                    row_id = obj.get(fields.id)
                    yield _too_long(shard, row, size, limit, None if row_id in (None, "") else (str(row_id), False))
                else:
                    yield to_record({k: v for k, v in obj.items() if v is not None}, shard, row, "parquet", fields)
            row += 1


def count_rows(shard: Shard) -> int | None:
    """Records in a shard (in its row range, where it has one): Parquet metadata, or a count of JSONL's non-blank
    lines (gzip decompressed on the way)."""
    return _count(shard, blank=False)


def count_positions(shard: Shard) -> int | None:
    """Row numbers a whole file spans (what a row range cuts): its Parquet rows, or its JSONL lines, blank ones
    included (a JSONL record's row is its line index)."""
    return _count(shard, blank=True)


def line_offsets(path: str, rows: list[int]) -> list[int]:
    """Where each of these lines (ascending line indices) of a plain JSONL file starts, in bytes: what a range's
    reader seeks to (Shard.offset). Newlines are counted a block at a time, not read line by line; a line past
    the file's end gets 0 (read from the start)."""
    found, want = [], iter(rows)
    target = next(want, None)
    line, at = 0, 0
    with open(path, "rb") as f:
        while target is not None and (block := f.read(SCAN_BYTES)):
            pos = 0
            while target is not None and line + block.count(b"\n", pos) >= target:
                while line < target:
                    pos = block.index(b"\n", pos) + 1
                    line += 1
                found.append(at + pos)
                target = next(want, None)
            line += block.count(b"\n", pos)
            at += len(block)
    return found + [0] * (len(rows) - len(found))


def _count(shard: Shard, blank: bool) -> int | None:
    kind = shard_kind(shard.path)
    start, stop = shard.rows or (0, None)
    try:
        if _is_empty(shard.path):
            return 0
        if kind == "parquet":
            n = pq.ParquetFile(shard.path).metadata.num_rows
            return n if shard.rows is None else max(0, min(n, stop) - start)
        if kind == "jsonl" and blank and shard.rows is None:
            return _count_lines(shard.path)
        with (gzip.open if kind == "jsonl.gz" else open)(shard.path, "rb") as f:
            lines = islice(f, start, stop) if shard.rows else f
            return sum(1 for line in lines if blank or line.strip())
    except (OSError, EOFError, zlib.error, pa.ArrowException):
        return None


def _count_lines(path: str) -> int:
    """A plain file's lines (the last one with or without its newline), counted a block at a time."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def _is_empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False
