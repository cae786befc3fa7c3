"""`--groups shard` (the default): a document's records form a group wherever they stand in their shard.

A first pass over the shard (`scan`) keeps, per record, three 8-byte numbers in numpy arrays: its group key's digest
(Python's hash of its prompt-field text's bytes, `text_key`; blake2b of its messages but the last or of its
--group-field value), a digest of the record itself (crc32 of its JSONL line; blake2b of a Parquet row's values) and
its row; for plain JSONL also where its line starts and its length. A whole plain JSONL file is scanned 8 MiB at a
time with numpy (`_scan_blocks`: only the two digests are Python calls per record, ~0.1 and ~0.2 us of C each on
short records, and as much again in the loops that call them: with finding the lines, most of the pass); a line
whose prompt value has escapes (\\n, \\"), and Parquet, row ranges and --group-field, are parsed line by line
(`_FastKey`, orjson), which costs about twice as much. A gzip shard is first decompressed into a temporary file
(`_unpacked`) and scanned as plain JSONL. `order` makes of them the shard's processing order:

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
Parquet reads it from a decoded copy of the columns records are made of, an uncompressed Arrow IPC file
(`_decoded`, one more pass over the shard) read through mmap one row at a time. The copies live in the run's output
directory (`tmp_dir`), unlinked when made (a kill leaves nothing) and gone when the shard is read; they cost disk,
not memory: the decompressed shard (gzip) or those columns' values (Parquet); their pages are the page cache's.

Memory of the first pass, per million records: rows, keys, digests 25 MB (and 16 MB of line places for JSONL, gzip
included), then the order 8 MB + 8 MB per million groups (`Scan.nbytes`, `Order.nbytes`); ~122 MB at its peak while
the order is sorted (benches/group_order.py, 1M records of 4-question documents).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import mmap
import tempfile
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from spcli.config.run import FieldConfig
from spcli.errors import InputError, OutputError
from spcli.io.read import DRAIN_BYTES, ID_SCAN_BYTES, UTF8_BOM, line_record
from spcli.io.records import Record
from spcli.io.shards import Shard, shard_kind

ORDER = "groups"  # ShardProgress.order: its next_row counts records of this processing order
READ_CHUNK = 4096  # records whose places are turned into Python numbers at once
COPY_BATCH_ROWS = 1024  # Parquet: rows per record batch of the decoded copy


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


def text_key(data) -> bytes:
    """A prompt text's key digest: Python's own hash of its UTF-8 bytes (SipHash, 64 bits, one C call and no object
    made: the first pass's cost), little-endian. Its salt changes from process to process, which changes nothing:
    a key's digest is only compared with the others of the same pass (records of equal keys share), never stored,
    and no order depends on its value (`order`)."""
    return (hash(data) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")


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
        return digest(json.dumps(messages[:-1], sort_keys=True).encode(), b"messages")
    return None


class _Arrays:
    def __init__(self, jsonl: bool):
        self.rows, self.keys, self.has, self.own = array("q"), bytearray(), bytearray(), bytearray()
        self.offsets, self.lengths = (array("q"), array("q")) if jsonl else (None, None)
        self.over_long: dict[int, int] = {}

    def add(self, row: int, key: bytes | None, own: bytes) -> None:
        self.rows.append(row)
        self.keys += key or bytes(8)
        self.has.append(key is not None)
        self.own += own

    def scan(self) -> Scan:
        """The arrays, over the buffers they were gathered in (no copy)."""
        u64 = lambda b: np.frombuffer(b, dtype="<u8") if b else np.zeros(0, dtype=np.uint64)
        i64 = lambda a: np.frombuffer(a, dtype=np.int64) if a else np.zeros(0, dtype=np.int64)
        jsonl = self.offsets is not None
        has = np.frombuffer(self.has, dtype=np.uint8).view(bool) if self.has else np.zeros(0, dtype=bool)
        return Scan(i64(self.rows), u64(self.keys), has, u64(self.own), i64(self.offsets) if jsonl else None,
                    i64(self.lengths) if jsonl else None, self.over_long)


def scan(shard: Shard, fields: FieldConfig, limit: int, plain=None) -> Scan:
    """The first pass over `shard` (within its row range, where it has one); `plain`: an open file holding a gzip
    shard's decompressed lines (_unpacked), scanned as plain JSONL (its offsets are into that file)."""
    kind = shard_kind(shard.path)
    if kind == "parquet":
        return _scan_parquet(shard, fields)
    try:
        return _scan_jsonl(shard, fields, limit, "jsonl" if plain is not None else kind, plain)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    except OSError as e:
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e


class _Fallback(Exception):
    """A plain JSONL file the block scan leaves to the line scan (a line over the limit)."""


BLOCK_BYTES = 8 << 20  # the block scan's reads


def _scan_blocks(f, fields: FieldConfig, limit: int) -> Scan:
    """The first pass over a whole plain JSONL file, 8 MiB at a time: lines, offsets and the prompt field's value found
    with numpy; per record only its two digests are Python calls. A line is read the fast way where it is `{...}`
    (a trailing \\r allowed), names the prompt field once (as a key: after an unescaped quote) and neither the messages
    field nor custom_id, and its value is a string without backslashes: the same lines, and the same digests, as
    _FastKey's fast way; every other line goes through _FastKey."""
    out = _Arrays(jsonl=True)
    fast = _FastKey(fields)
    tokens = [np.frombuffer(b'"' + n.encode() + b'"', dtype=np.uint8) for n in (fields.prompt, fields.messages, "custom_id")]
    row, base, rest = 0, 0, b""
    while True:
        chunk = f.read(BLOCK_BYTES)
        buf = rest + chunk if rest else chunk
        cut = len(buf) if not chunk else buf.rfind(b"\n") + 1
        if len(buf) - cut > limit:
            raise _Fallback
        if cut:
            row = _scan_block(buf[:cut], base, row, out, fast, tokens, limit)
            base += cut
        rest = buf[cut:]
        if not chunk:
            return out.scan()


def _scan_block(block: bytes, base: int, row: int, out: _Arrays, fast, tokens: list[np.ndarray], limit: int) -> int:
    a = np.frombuffer(block, dtype=np.uint8)
    n = len(a)
    nl = np.flatnonzero(a == 10)
    ends = nl if len(nl) and nl[-1] == n - 1 else np.append(nl, n)  # exclusive of the newline
    starts = np.concatenate([[0], ends[:-1] + 1])
    sizes = np.minimum(ends + 1, n) - starts  # the line with its newline
    if len(sizes) and (sizes.max() > limit + 1 or (ends[-1] == n and sizes[-1] > limit)):
        raise _Fallback
    m = len(starts)
    clip = lambda i: a[np.clip(i, 0, n - 1)]
    last = ends - 1 - (clip(ends - 1) == 13)  # the closing brace's place, before a \r
    simple = (ends > starts) & (clip(starts) == 123) & (clip(last) == 125) & (last > starts)
    if row == 0 and block.startswith(UTF8_BOM):
        simple[0] = False
    quotes = np.flatnonzero(a == 34)
    escaped = quotes[(quotes > 0) & (clip(quotes - 1) == 92)] if b'\\"' in block else quotes[:0]
    if len(escaped):  # a quote after an odd run of backslashes is inside a string
        odd = [q for q in escaped.tolist() if _backslashes_before(block, q) % 2 == 1]
        quotes = np.setdiff1d(quotes, np.array(odd, dtype=np.int64), assume_unique=True)
    found = []
    for j, t in enumerate(tokens):
        if j and t.tobytes() not in block:  # the messages field, custom_id: in few files
            found.append(np.zeros(0, dtype=np.int64))
            continue
        cand = quotes[quotes + len(t) <= n]
        cand = cand[a[cand + 1] == t[1]]  # most quotes open another name or a value
        ok = np.ones(len(cand), dtype=bool)
        for k in range(1, len(t)):
            ok &= a[cand + k] == t[k]
        found.append(cand[ok])
    keys_at, others = found[0], np.concatenate(found[1:])
    line_of = np.searchsorted(starts, keys_at, side="right") - 1
    count = np.bincount(line_of, minlength=m)
    count_others = np.bincount(np.searchsorted(starts, others, side="right") - 1, minlength=m)
    after = keys_at + len(tokens[0])
    colon, c2, c3 = clip(after) == 58, clip(after + 1), clip(after + 2)
    vs = np.where(colon & (c2 == 34), after + 2, np.where(colon & (c2 == 32) & (c3 == 34), after + 3, -1))
    qi = np.searchsorted(quotes, vs)
    ve = quotes[np.minimum(qi, len(quotes) - 1)] if len(quotes) else vs
    slashes = np.flatnonzero(a == 92) if b"\\" in block else np.zeros(0, dtype=np.int64)
    no_slash = np.searchsorted(slashes, ve) == np.searchsorted(slashes, vs)
    good = (vs >= 0) & (qi < len(quotes)) & (ve < ends[line_of]) & no_slash
    is_fast = simple & (count == 1) & (count_others == 0)
    is_fast[line_of[~good]] = False
    pick = is_fast[line_of]
    keys = np.zeros(m, dtype=np.uint64)
    has = is_fast.copy()
    own = np.zeros(m, dtype=np.uint64)
    mv = memoryview(block)
    crc = zlib.crc32
    fast_lines = line_of[pick]
    keys[fast_lines] = np.array([hash(block[s:e]) for s, e in zip(vs[pick].tolist(), ve[pick].tolist())],
                                dtype=np.int64).view(np.uint64)  # text_key's
    own[fast_lines] = [crc(mv[s:e + 1]) for s, e in zip(starts[fast_lines].tolist(), last[fast_lines].tolist())]
    is_record = is_fast.copy()
    for i in np.flatnonzero(~is_fast).tolist():  # the line scan's way, line by line
        text = block[int(starts[i]):int(ends[i])].strip()
        if row + i == 0 and text.startswith(UTF8_BOM):
            text = text[len(UTF8_BOM):].strip()
        if not text:
            continue  # blank lines are not records
        is_record[i] = True
        key = fast(text)
        if key is not None:
            keys[i], has[i] = int.from_bytes(key, "little"), True
        own[i] = crc(text)
    take = np.flatnonzero(is_record)
    out.rows.frombytes((row + take).astype(np.int64).tobytes())  # no Python number per record
    out.keys += keys[take].astype("<u8").tobytes()
    out.has += has[take].astype(np.uint8).tobytes()
    out.own += own[take].astype("<u8").tobytes()
    out.offsets.frombytes((base + starts[take]).astype(np.int64).tobytes())
    out.lengths.frombytes(sizes[take].astype(np.int64).tobytes())
    return row + m


def _backslashes_before(block: bytes, at: int) -> int:
    k = at - 1
    while k >= 0 and block[k] == 92:
        k -= 1
    return at - 1 - k


def _scan_jsonl(shard: Shard, fields: FieldConfig, limit: int, kind: str, plain=None) -> Scan:
    opened = (lambda: contextlib.nullcontext(plain)) if plain is not None else (
        lambda: (gzip.open if kind == "jsonl.gz" else open)(shard.path, "rb"))
    if kind == "jsonl" and shard.rows is None and fields.group is None:
        try:
            with opened() as f:
                f.seek(0)
                return _scan_blocks(f, fields, limit)
        except _Fallback:
            pass
    out = _Arrays(jsonl=kind == "jsonl")
    stop = shard.rows[1] if shard.rows is not None else None
    fast = _FastKey(fields)
    rows, keys, has, own = out.rows, out.keys, out.has, out.own
    offsets, lengths = out.offsets, out.lengths
    crc = zlib.crc32
    with opened() as f:
        f.seek(0)
        row, pos = 0, 0
        if shard.offset and kind == "jsonl":
            f.seek(shard.offset)
            row, pos = shard.first_row, shard.offset
        first = shard.first_row
        while (stop is None or row < stop) and (line := f.readline(limit + 1)):
            start, pos = pos, pos + len(line)
            if len(line) > limit and not line.endswith(b"\n"):  # over --max-record-bytes: an error row, alone
                size = len(line)
                while (chunk := f.readline(DRAIN_BYTES)) and not chunk.endswith(b"\n"):
                    size, pos = size + len(chunk), pos + len(chunk)
                pos += len(chunk)
                size += len(chunk) - (1 if chunk.endswith(b"\n") else 0)
                if row >= first:
                    out.over_long[row] = size
                    out.add(row, None, digest(line[:ID_SCAN_BYTES]))
                    if offsets is not None:
                        offsets.append(start)
                        lengths.append(min(ID_SCAN_BYTES, pos - start))
                row += 1
                continue
            text = line.strip()
            if row >= first and text:
                if row == 0 and text.startswith(UTF8_BOM):
                    text = text[len(UTF8_BOM):].strip()
                key = fast(text)
                rows.append(row)
                keys += key or bytes(8)
                has.append(key is not None)
                own += crc(text).to_bytes(8, "little")  # orders a group's members (ties: rows, of equal lines)
                if offsets is not None:
                    offsets.append(start)
                    lengths.append(len(line))
            row += 1
    return out.scan()


class _FastKey:
    """A JSONL line's group key digest. Where the line names the prompt field once, names no messages, custom_id or
    --group-field, and its value is a string without escapes, the digest of the value's bytes as they stand (which are
    then its UTF-8 text: what the full parse digests); otherwise the line is parsed (key_digest). A line the fast way
    reads wrongly (its one match is inside a nested object) has no such field at its top level, so is an error row
    or a messages record: its group (where find_groups leaves error rows out, and whose common prefix it checks)
    is all it can change."""

    def __init__(self, fields: FieldConfig):
        self.fields = fields
        self.name = b'"' + fields.prompt.encode() + b'"'
        self.others = [b'"' + n.encode() + b'"' for n in (fields.messages, "custom_id")]
        self.is_fast = fields.group is None

    def __call__(self, text: bytes) -> bytes | None:
        name = self.name
        if self.is_fast and text.count(name) == 1 and self.others[0] not in text and self.others[1] not in text:
            at = text.find(name) + len(name)
            i = text.find(b'"', at)  # the value's opening quote, after the colon
            if i > 0 and text[at:i].strip() == b":":
                end = text.find(b'"', i + 1)
                value = text[i + 1:end]
                if end > 0 and 92 not in value:  # no backslash: its bytes are its UTF-8 text
                    return text_key(value)
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None  # an error row (or a lone surrogate: read.line_record says which), alone
        f = self.fields
        return key_digest(obj, f.prompt, f.messages, f.group) if type(obj) is dict else None


def _scan_parquet(shard: Shard, fields: FieldConfig) -> Scan:
    from spcli.io.count import is_empty
    from spcli.io.parquet import open_parquet

    out = _Arrays(jsonl=False)
    if is_empty(shard.path):
        return out.scan()
    pf = open_parquet(shard)
    names = set(pf.schema_arrow.names)
    wanted = [fields.id, fields.prompt, fields.messages, fields.instruction, fields.group]
    columns = list(dict.fromkeys(c for c in wanted if c is not None and c in names))
    first, stop = shard.first_row, (shard.rows[1] if shard.rows is not None else None)
    row = 0
    for batch in _parquet_parts(pf, columns, shard, 0, pf.metadata.num_rows, 4096):
        try:
            values = batch.to_pylist()
        except UnicodeDecodeError:
            values = [None] * batch.num_rows  # read.py makes those rows errors; here they are alone
        for obj in values:
            if row >= first and (stop is None or row < stop):
                try:
                    own = digest(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS, default=str))
                except TypeError:
                    own = digest(repr(obj).encode("utf-8", "surrogatepass"))
                out.add(row, key_digest(obj, fields.prompt, fields.messages, fields.group), own)
            row += 1
    return out.scan()


def order(s: Scan, group_max: int) -> Order:
    """The processing order of a scanned shard (module docstring)."""
    n = len(s.rows)
    keyed = np.flatnonzero(s.has_key)
    by_key = keyed[np.lexsort((s.rows[keyed], s.own[keyed], s.keys[keyed]))]
    k = s.keys[by_key]
    new_key = np.ones(len(by_key), dtype=bool)
    new_key[1:] = k[1:] != k[:-1]
    key_starts = np.flatnonzero(new_key)
    run = np.cumsum(new_key) - 1
    rank = np.arange(len(by_key)) - key_starts[run]
    sizes = np.diff(np.append(key_starts, len(by_key)))
    alone = np.flatnonzero(~s.has_key)
    members = np.concatenate([by_key, alone]).astype(np.int64)
    starts = np.concatenate([np.flatnonzero(new_key | (rank % group_max == 0)),
                             len(by_key) + np.arange(len(alone))]).astype(np.int64)
    if len(members):
        last = np.maximum.reduceat(s.rows[members], starts)
        by_last = np.argsort(last, kind="stable")
        lengths = np.diff(np.append(starts, n))[by_last]
        new_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # members of group by_last[j], which now begins at new_starts[j]
        take = np.repeat(starts[by_last] - new_starts[:-1], lengths) + np.arange(n)
        members, starts = members[take], new_starts
    else:
        starts = np.zeros(1, dtype=np.int64)
    return Order(members, starts, documents=len(key_starts), questions=int(sizes[sizes > 1].sum()),
                 no_key=len(alone), cut=int((sizes > group_max).sum()))


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
        plain = stack.enter_context(_unpacked(shard, tmp_dir)) if kind == "jsonl.gz" else None
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
            copy = stack.enter_context(_decoded(shard, fields, tmp_dir, s))
            yield from _read_copy(shard, fields, limit, s, o, done, wanted, wanted_rows, copy)


def _unpacked(shard: Shard, tmp_dir: str | None):
    """A gzip shard's decompressed bytes in a temporary file (as many bytes as the shard holds uncompressed, on disk;
    memory: a 1 MiB copy buffer): the first pass scans it as plain JSONL and records are read from it by offset."""
    f = _temporary(tmp_dir, ".spcli-unpacked-")
    try:
        with gzip.open(shard.path, "rb") as z:
            while chunk := z.read(1 << 20):
                _write(f, chunk, shard, tmp_dir)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        f.close()
        raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
    except OSError as e:
        f.close()
        raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e
    except OutputError:
        f.close()
        raise
    f.flush()
    return f


def _temporary(tmp_dir: str | None, prefix: str):
    try:
        return tempfile.TemporaryFile(dir=tmp_dir, prefix=prefix)
    except OSError as e:
        raise OutputError(f"{tmp_dir or tempfile.gettempdir()}: cannot make a temporary file ({e.strerror or e})") from e


def _write(f, data, shard: Shard, tmp_dir: str | None) -> None:
    """Write to a shard's decoded copy; a full disk is an OutputError naming where."""
    try:
        f.write(data)
    except OSError as e:
        raise OutputError(f"{shard.path}: cannot write its decoded copy in {tmp_dir or tempfile.gettempdir()} "
                          f"({e.strerror or e}); it needs about the shard's uncompressed size there") from e


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


@contextlib.contextmanager
def _decoded(shard: Shard, fields: FieldConfig, tmp_dir: str | None, s: Scan):
    """A Parquet shard's columns that records are made of, decoded once into an Arrow IPC file in a temporary file
    (uncompressed: about as many bytes as those columns' values, on disk), in batches of COPY_BATCH_ROWS rows of the
    scanned range, so that any row is read back without decoding its row group again. Yields its reader."""
    import pyarrow as pa

    from spcli.io.parquet import open_parquet, parquet_columns

    with _temporary(tmp_dir, ".spcli-decoded-") as f:
        if not len(s.rows):
            yield None
            return
        lo, hi = int(s.rows[0]), int(s.rows[-1]) + 1
        pf = open_parquet(shard)
        columns = parquet_columns(pf, shard, fields)
        writer, sizes = None, [0]
        try:
            for part in _parquet_parts(pf, columns, shard, lo, hi, COPY_BATCH_ROWS):
                writer = writer or pa.ipc.new_file(f, part.schema)
                writer.write_batch(part)
                sizes.append(part.num_rows)
            writer.close()
            f.flush()
        except (OSError, pa.ArrowException) as e:
            raise OutputError(f"{shard.path}: cannot write its decoded copy in {tmp_dir or tempfile.gettempdir()} "
                              f"({e})") from e
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # batches are views of it: no copy
        yield _Copy(pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))), lo + np.cumsum(sizes), shard)


def _parquet_parts(pf, columns: list[str], shard: Shard, lo: int, hi: int, batch_size: int):
    """The record batches of rows lo .. hi - 1 of a Parquet shard (`pf` open), in `columns`, row group by row group;
    unreadable data is the InputError read.py raises for it."""
    from spcli.io.parquet import row_group_batches

    first = 0  # row group g's first row
    for g in range(pf.num_row_groups):
        num_rows = pf.metadata.row_group(g).num_rows
        if first < hi and first + num_rows > lo:
            row = first
            for batch in row_group_batches(pf, g, first, num_rows, columns, shard, batch_size):
                part = batch.slice(max(0, lo - row), max(0, min(hi, row + batch.num_rows) - max(lo, row)))
                row += batch.num_rows
                if part.num_rows:
                    yield part
        first += num_rows


class _Copy:
    """One row at a time of a Parquet shard's decoded copy (_decoded), read through a memory map: what is held is
    the current row's values and the few batch headers in `batches` (views of the map), not rows."""

    def __init__(self, reader, starts: np.ndarray, shard: Shard):
        self.reader, self.starts, self.shard = reader, starts, shard  # starts: [batches + 1], the row each begins at
        self.batches: OrderedDict = OrderedDict()  # batch index -> the batch (a view of the map), 8 at most

    def row(self, row: int) -> dict | str:
        """Row `row`'s values (parquet.rows_of: a dict, or the text of its Unicode problem)."""
        from spcli.io.parquet import rows_of

        i = int(np.searchsorted(self.starts, row, side="right") - 1)
        if not 0 <= i < self.reader.num_record_batches:
            raise InputError(f"{self.shard.path}: changed while it was read (row {row} was not in its first pass)")
        if i not in self.batches:
            self.batches[i] = self.reader.get_batch(i)
            if len(self.batches) > 8:
                self.batches.popitem(last=False)
        self.batches.move_to_end(i)
        return next(rows_of(self.batches[i].slice(row - int(self.starts[i]), 1)))


def _read_copy(shard: Shard, fields: FieldConfig, limit: int, s: Scan, o: Order, done: int,
               wanted: set[int] | None, wanted_rows: set[int] | None, copy: _Copy | None) -> Iterator[Record]:
    """Parquet: each record made from its row of the decoded copy (parquet.row_record, as read_parquet makes it)."""
    from spcli.io.parquet import row_record

    if copy is None or not len(o.members):
        return
    g0 = max(int(np.searchsorted(o.starts, done, side="right") - 1), 0)
    for a in range(int(o.starts[g0]), len(o.members), READ_CHUNK):
        idx = o.members[a:a + READ_CHUNK]
        groups = (np.searchsorted(o.starts, np.arange(a, a + len(idx)), side="right") - 1).tolist()
        for k, (row, g) in enumerate(zip(s.rows[idx].tolist(), groups)):
            if wanted is not None and g not in wanted:
                continue
            rec = row_record(copy.row(row), shard, row, fields, limit)
            yield _place(rec, g, a + k, shard.first_row, done, wanted_rows)
