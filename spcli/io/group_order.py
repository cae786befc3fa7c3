"""`--groups shard` (the default): a document's records form a group wherever they stand in their shard.

A first pass over the shard (`scan`) keeps, per record, three 8-byte numbers in numpy arrays: its group key's digest
(`text_key` of its prompt-field text; blake2b of its messages but the last or of its --group-field value), a digest
of the record itself (crc32 of its JSONL line; blake2b of a Parquet row's values) and its row; for JSONL also where
its line starts and its length. JSONL is read through mmap by a compiled line scanner (spcli.io.line_scan, numba, in
parts on threads), which finds the lines and, for a line naming its prompt as a string, reads its key and digest
with no Python call per line; only the other lines (chat records, --group-field, text that is not JSON) are parsed
one by one (orjson). A gzip shard is first decompressed into a temporary file (spcli.io.decoded_copy) and scanned as
plain JSONL; Parquet is read a record batch at a time and digested row by row. `order` makes of them the shard's
processing order (compiled: spcli.io.group_sort):

- a group is every record of one key (a record without a key is alone), cut into groups of at most --group-max in
  the order of the records' own digests (then rows: only identical records tie), never by where they stand; a
  group's members are in that order too, so its first member (which names it) is the same in any order of the shard;
- groups run in the order of their last row: the order a reader that reads the shard once finishes them in.

So a record's group, and so its output, depends only on which records its shard holds, not on their order. A
commit counts records in this order (the shard's `next_row` is first_row + the records committed in it, with the
shard marked `order: groups` in the manifest), and a resume computes the same order from the same file and goes on
from there; a resume point inside a group reads the group's earlier members again as context (`is_context`).

Reading in that order holds no record but the one being read, wherever a document's questions stand: plain JSONL
reads each record where the first pass found it (mmap); gzip JSONL reads it the same way from its decompressed copy;
Parquet reads it from a decoded copy of the columns records are made of, an uncompressed Arrow IPC file (one more
pass over the shard) read through mmap one row at a time. The copies (spcli.io.decoded_copy) live in the run's
output directory (`tmp_dir`), unlinked when made (a kill leaves nothing) and gone when the shard is read; they cost
disk, not memory: the decompressed shard (gzip) or those columns' values (Parquet); their pages are the page cache's.

Cost of the first pass, per million records (benches/group_order.py, 1M short records of 4-question documents,
287 MB): ~0.4 s on 2 cores, ~4% of reading the shard (the line scan ~0.23 s, the order ~0.14 s); memory: rows, keys,
digests 25 MB and 16 MB of line places (`Scan.nbytes`), then the order 8 MB + 8 MB per million groups
(`Order.nbytes`); ~81 MB at its peak while the order is sorted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from spcli.config.run import FieldConfig
from spcli.errors import InputError
from spcli.io.decoded_copy import DecodedRows, decoded, unpacked
from spcli.io.read import ID_SCAN_BYTES, UTF8_BOM, line_record
from spcli.io.records import Record
from spcli.io.shards import Shard, shard_kind

ORDER = "groups"  # ShardProgress.order: its next_row counts records of this processing order
READ_CHUNK = 4096  # records whose places are turned into Python numbers at once
PARSE_CHUNK = 65536  # lines the first pass parses with Python numbers at once (its lists' memory)


@dataclass(frozen=True)
class Scan:
    """The first pass over one shard: per record (in row order) its row, group key digest (valid where has_key), own
    digest, and for plain JSONL its line's byte offset and length (over_long: row -> size, lines over the limit)."""

    rows: np.ndarray  # int64
    keys: np.ndarray  # uint64
    has_key: np.ndarray  # bool
    own: np.ndarray  # uint64
    offsets: np.ndarray | None = None  # int64, plain JSONL
    lengths: np.ndarray | None = None  # int64, plain JSONL
    over_long: dict | None = None

    @property
    def nbytes(self) -> int:
        arrays = (self.rows, self.keys, self.has_key, self.own, self.offsets, self.lengths)
        return sum(a.nbytes for a in arrays if a is not None)


@dataclass(frozen=True)
class Order:
    """A shard's processing order: `members` (indices into the Scan's arrays) group by group, `starts` [G + 1]."""

    members: np.ndarray  # int64 [N]
    starts: np.ndarray  # int64 [G + 1]
    documents: int  # distinct keys
    questions: int  # records of documents that have more than one record in the shard
    no_key: int  # records without a group key (alone)
    cut: int  # documents over --group-max (cut into several groups)

    @property
    def nbytes(self) -> int:
        return self.members.nbytes + self.starts.nbytes

    @property
    def num_groups(self) -> int:
        return len(self.starts) - 1


def digest(data: bytes, kind: bytes = b"") -> bytes:
    return hashlib.blake2b(data, digest_size=8, person=kind).digest()


def text_key(data: bytes) -> bytes:
    """A prompt text's key digest: spcli.io.digests's text_hash of its UTF-8 bytes (as the compiled scanner hashes
    a JSONL line's prompt), little-endian. A key's digest is only compared with the others of the same pass (records
    of equal keys share), never stored, and no order depends on its value (`order`)."""
    from spcli.io.digests import bytes_key

    return bytes_key(data).to_bytes(8, "little")


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def key_digest(obj, prompt_field: str, messages_field: str, group_field: str | None) -> bytes | None:
    """The digest of a raw record's group key (spcli.io.groups.group_key's key), None where it has none."""
    if not isinstance(obj, dict):
        return None
    if "custom_id" in obj and isinstance(obj.get("body"), dict):  # an OpenAI batch request line: its body's fields
        obj, prompt_field, messages_field = obj["body"], "prompt", "messages"
    if group_field is not None:
        value = obj.get(group_field)
        return None if value is None else digest(_text(str(value)), b"field")
    prompt = obj.get(prompt_field)
    if isinstance(prompt, str):
        return text_key(_text(prompt))
    messages = obj.get(messages_field)
    if isinstance(messages, list) and len(messages) > 1:
        try:
            return digest(orjson.dumps(messages[:-1], option=orjson.OPT_SORT_KEYS), b"messages")
        except TypeError:  # a value orjson cannot write (a lone surrogate, from a Parquet row): Python's json can
            return digest(json.dumps(messages[:-1], sort_keys=True).encode(), b"messages")
    return None


class _Arrays:
    """A Parquet shard's first pass, gathered row by row."""

    def __init__(self):
        self.rows, self.keys, self.has, self.own = array("q"), bytearray(), bytearray(), bytearray()

    def add(self, row: int, key: bytes | None, own: bytes) -> None:
        self.rows.append(row)
        self.keys += key or bytes(8)
        self.has.append(key is not None)
        self.own += own

    def scan(self) -> Scan:
        """The arrays, over the buffers they were gathered in (no copy)."""
        u64 = lambda b: np.frombuffer(b, dtype="<u8") if b else np.zeros(0, dtype=np.uint64)
        has = np.frombuffer(self.has, dtype=np.uint8).view(bool) if self.has else np.zeros(0, dtype=bool)
        rows = np.frombuffer(self.rows, dtype=np.int64) if self.rows else np.zeros(0, dtype=np.int64)
        return Scan(rows, u64(self.keys), has, u64(self.own))


def scan(shard: Shard, fields: FieldConfig, limit: int, plain=None, threads: int | None = None) -> Scan:
    """The first pass over `shard` (within its row range, where it has one); `plain`: an open file holding a gzip
    shard's decompressed lines (decoded_copy.unpacked), scanned as plain JSONL (its offsets are into that file);
    `threads`: how many parts of a JSONL file are scanned at once (None: line_scan.scan_lines's default)."""
    kind = shard_kind(shard.path)
    if kind == "parquet":
        return _scan_parquet(shard, fields)
    try:
        if kind == "jsonl.gz" and plain is None:  # decompressing, `unpacked` names a truncated or corrupt file
            with unpacked(shard, None) as f:
                return _scan_jsonl(shard, fields, limit, f, threads=threads)
        return _scan_jsonl(shard, fields, limit, plain, threads=threads)
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e


def _scan_jsonl(shard: Shard, fields: FieldConfig, limit: int, plain=None, parse_all: bool = False,
                threads: int | None = None) -> Scan:
    """A JSONL file's first pass (plain, or a gzip shard's decompressed copy `plain`): its lines found and, where the
    compiled scanner reads them (spcli.io.line_scan: OK), their keys and own digests with no Python call per line;
    only the lines it leaves to the parser (PARSE: chat records, --group-field, ...) and lines over the limit are
    read here one by one."""
    from spcli.io import line_scan

    with contextlib.nullcontext(plain) if plain is not None else open(shard.path, "rb") as f:
        is_empty = not os.fstat(f.fileno()).st_size  # an empty file cannot be mapped: its lines are none
        with contextlib.nullcontext(b"") if is_empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            a = np.frombuffer(mm, dtype=np.uint8)
            try:
                start, row = (shard.offset, shard.first_row) if shard.offset and plain is None else (0, 0)
                stop = shard.rows[1] if shard.rows is not None else -1
                lines = line_scan.scan_lines(a, start, row, stop, limit, fields.prompt, fields.messages,
                                             parse_all=parse_all or fields.group is not None, threads=threads)
                return _from_lines(lines, mm, shard, fields)
            finally:
                del a  # the map closes only once no array views it


def _from_lines(lines, mm: mmap.mmap, shard: Shard, fields: FieldConfig) -> Scan:
    """The Scan of a JSONL file's lines: records only (no blank line), in the shard's rows; the lines the scanner
    left to the parser parsed here."""
    from spcli.io.line_scan import BLANK, LONG, OK

    is_record = (lines.states != BLANK) & (lines.rows >= shard.first_row)
    pick = (lambda x: x) if is_record.all() else (lambda x: x[is_record])
    rows, starts, lengths, states = pick(lines.rows), pick(lines.starts), pick(lines.lengths), pick(lines.states)
    keys, own = pick(lines.keys), pick(lines.owns)
    has = states == OK
    over_long: dict[int, int] = {}
    left = np.flatnonzero(~has)  # the parser's lines and lines over the limit, one by one, PARSE_CHUNK at a time
    for c in range(0, len(left), PARSE_CHUNK):
        part = left[c:c + PARSE_CHUNK]
        found, found_keys, owns = [], [], []
        for i, s, n, row, state in zip(part.tolist(), starts[part].tolist(), lengths[part].tolist(),
                                       rows[part].tolist(), states[part].tolist()):
            if state == LONG:  # its head only: the line may be any size
                over_long[row] = n - (mm[s + n - 1] == 10)
                owns.append(int.from_bytes(digest(mm[s:s + min(n, ID_SCAN_BYTES)]), "little"))
                lengths[i] = min(ID_SCAN_BYTES, n)
                continue
            text = mm[s:s + n].strip()
            if row == 0 and text.startswith(UTF8_BOM):
                text = text[len(UTF8_BOM):].strip()
            key = _parsed_key(text, fields)
            if key is not None:
                found.append(i)
                found_keys.append(int.from_bytes(key, "little"))
            owns.append(zlib.crc32(text))  # orders a group's members (ties: rows, of equal lines)
        own[part] = np.array(owns, dtype=np.uint64)
        keys[found] = np.array(found_keys, dtype=np.uint64)
        has[found] = True
    return Scan(rows, keys, has, own, starts, lengths, over_long)


def _parsed_key(text: bytes, fields: FieldConfig) -> bytes | None:
    """A JSONL line's group key digest, parsed (key_digest); None for a line that is not a JSON object."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None  # an error row (or a lone surrogate: read.line_record says which), alone
    return key_digest(obj, fields.prompt, fields.messages, fields.group) if type(obj) is dict else None


def _scan_parquet(shard: Shard, fields: FieldConfig) -> Scan:
    from spcli.io.count import is_empty
    from spcli.io.parquet import open_parquet, parquet_parts

    out = _Arrays()
    if is_empty(shard.path):
        return out.scan()
    pf = open_parquet(shard)
    names = set(pf.schema_arrow.names)
    wanted = [fields.id, fields.prompt, fields.messages, fields.instruction, fields.group]
    columns = list(dict.fromkeys(c for c in wanted if c is not None and c in names))
    first, stop = shard.first_row, (shard.rows[1] if shard.rows is not None else None)
    row = 0
    for batch in parquet_parts(pf, columns, shard, 0, pf.metadata.num_rows, 4096):
        try:
            values = batch.to_pylist()
        except UnicodeDecodeError:
            values = [None] * batch.num_rows  # read.py makes those rows errors; here they are alone
            hashed = None
        else:
            hashed = prompt_hashes(batch, fields) if fields.group is None else None
        for j, obj in enumerate(values):
            if row >= first and (stop is None or row < stop):
                try:
                    own = digest(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS, default=str))
                except TypeError:
                    own = digest(repr(obj).encode("utf-8", "surrogatepass"))
                if hashed is not None and hashed[1][j]:  # text_key of its prompt, hashed with the batch's
                    key = int(hashed[0][j]).to_bytes(8, "little")
                else:
                    key = key_digest(obj, fields.prompt, fields.messages, fields.group)
                out.add(row, key, own)
            row += 1
    return out.scan()


def prompt_hashes(batch, fields: FieldConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """text_key of each row's prompt where the batch's prompt column holds strings: (hashes [n] uint64, valid [n]
    bool), with one compiled call per batch (spcli.io.digests.hash_strings); None where it does not."""
    import pyarrow as pa

    from spcli.io.digests import hash_strings

    if fields.prompt not in batch.schema.names:
        return None
    column = batch.column(fields.prompt)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    _, offsets, data = column.buffers()
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    offsets = np.frombuffer(offsets, dtype=width)[column.offset:column.offset + len(column) + 1]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return hash_strings(offsets.astype(np.int64), data), valid


def order(s: Scan, group_max: int) -> Order:
    """The processing order of a scanned shard (module docstring; compiled: spcli.io.group_sort)."""
    from spcli.io.group_sort import order_kernel

    members, starts, documents, questions, no_key, cut = order_kernel(s.keys, s.own, s.rows, s.has_key, group_max)
    return Order(members, starts, documents=documents, questions=questions, no_key=no_key, cut=cut)


def read_in_order(shard: Shard, fields: FieldConfig, start_row: int, limit: int, group_max: int,
                  wanted_rows: set[int] | None = None, on_order=lambda order: None, tmp_dir: str | None = None
                  ) -> Iterator[Record]:
    """The shard's records in its processing order, from position start_row - first_row on (a group begun before it
    comes whole, its earlier members marked is_context). wanted_rows (--retry-failed): only the groups holding one of
    these rows, the others of their members marked is_context. Each record carries group_id and order_pos.
    on_order(order) sees the order before the first record is read. `tmp_dir` holds the decoded copy of a gzip or
    Parquet shard (None: the system's temporary directory), unlinked from the start: nothing is left there after a kill."""
    kind = shard_kind(shard.path)
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(unpacked(shard, tmp_dir)) if kind == "jsonl.gz" else None
        s = scan(shard, fields, limit, plain)
        o = order(s, group_max)
        on_order(o)
        done = max(0, start_row - shard.first_row)
        if wanted_rows is not None:
            done = 0
            is_wanted = np.isin(s.rows[o.members], np.fromiter(wanted_rows, dtype=np.int64, count=len(wanted_rows)))
            wanted = set(np.unique(np.searchsorted(o.starts, np.flatnonzero(is_wanted), side="right") - 1).tolist())
        else:
            wanted = None
        if s.offsets is not None:
            yield from _read_at(shard, fields, limit, s, o, done, wanted, wanted_rows, plain, kind)
        else:
            lo, hi = (int(s.rows[0]), int(s.rows[-1]) + 1) if len(s.rows) else (0, 0)
            copy = stack.enter_context(decoded(shard, fields, tmp_dir, lo, hi))
            yield from _read_copy(shard, fields, limit, s, o, done, wanted, wanted_rows, copy)


def _place(rec: Record, g: int, pos: int, first_row: int, done: int, wanted_rows: set[int] | None) -> Record:
    rec.group_id, rec.order_pos = g, first_row + pos
    rec.is_context = pos < done if wanted_rows is None else rec.row not in wanted_rows
    return rec


def _read_at(shard: Shard, fields: FieldConfig, limit: int, s: Scan, o: Order, done: int, wanted: set[int] | None,
             wanted_rows: set[int] | None, plain=None, kind: str = "jsonl") -> Iterator[Record]:
    """Plain JSONL (or a gzip shard's decompressed copy, `plain`): each record read where the first pass found it."""
    g0 = int(np.searchsorted(o.starts, done, side="right") - 1)
    if not len(o.members):
        return
    try:
        with contextlib.nullcontext(plain) if plain is not None else open(shard.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # slices of the page cache: no call per record
    except (OSError, ValueError) as e:
        raise InputError(f"{shard.path}: cannot read ({getattr(e, 'strerror', None) or e})") from e
    with mm:
        first = int(o.starts[max(g0, 0)])
        for a in range(first, len(o.members), READ_CHUNK):  # plain lists a chunk at a time: numpy scalars are slow
            idx = o.members[a:a + READ_CHUNK]
            rows, offsets, lengths = s.rows[idx].tolist(), s.offsets[idx].tolist(), s.lengths[idx].tolist()
            groups = (np.searchsorted(o.starts, np.arange(a, a + len(idx)), side="right") - 1).tolist()
            for k, (row, offset, length, g) in enumerate(zip(rows, offsets, lengths, groups)):
                if wanted is not None and g not in wanted:
                    continue
                data = mm[offset:offset + length]
                if row in s.over_long:
                    rec = line_record(shard, row, None, s.over_long[row], data, kind, fields, limit)
                else:
                    rec = line_record(shard, row, data, len(data), b"", kind, fields, limit)
                if rec is None:
                    raise InputError(f"{shard.path}: line {row + 1} changed while the shard was read (now blank)")
                yield _place(rec, g, a + k, shard.first_row, done, wanted_rows)


def _read_copy(shard: Shard, fields: FieldConfig, limit: int, s: Scan, o: Order, done: int,
               wanted: set[int] | None, wanted_rows: set[int] | None, copy: DecodedRows | None) -> Iterator[Record]:
    """Parquet: each record made from its row of the decoded copy (parquet.row_record, as read_parquet makes it)."""
    from spcli.io.parquet import row_record

    if copy is None or not len(o.members):
        return
    g0 = max(int(np.searchsorted(o.starts, done, side="right") - 1), 0)
    for a in range(int(o.starts[g0]), len(o.members), READ_CHUNK):
        idx = o.members[a:a + READ_CHUNK]
        groups = (np.searchsorted(o.starts, np.arange(a, a + len(idx)), side="right") - 1).tolist()
        places = [(k, row, g) for k, (row, g) in enumerate(zip(s.rows[idx].tolist(), groups))
                  if wanted is None or g in wanted]
        for (k, row, g), values in zip(places, copy.rows([row for _, row, _ in places])):
            rec = row_record(values, shard, row, fields, limit)
            yield _place(rec, g, a + k, shard.first_row, done, wanted_rows)
