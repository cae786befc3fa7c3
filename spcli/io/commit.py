"""Atomic part files and the manifest that commits them.

Commit protocol, for the rows of one shard finished since the last commit:
  1. each output file is written to a temp file `.part-....tmp` in the output directory and fsync'ed;
  2. the temp files are renamed to their part names and the directory is fsync'ed;
  3. the manifest is replaced (temp + fsync + rename + directory fsync) listing the new parts.
Step 3 is the commit. A crash before it leaves temp files or parts that no manifest lists: they do
not exist for readers or for a resume, and are removed when the next run starts. A failed write
(disk full) raises before step 3, so nothing half-written is ever committed.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import EngineDied, Interrupted, OutputError
from spcli.io.openai import response_lines
from spcli.io.schema import RowResult, to_dict, to_table

PART_RE = re.compile(r"^part-(\d{5,})-(\d{5,})\.(parquet|jsonl|openai\.jsonl)$")
TEMP_RE = re.compile(r"^\.(part-\d{5,}-\d{5,}\.(?:parquet|jsonl|openai\.jsonl))\..*\.tmp$")
PAUSE_AFTER_RENAME_ENV = "SPCLI_TEST_PAUSE_AFTER_RENAME"  # tests only: seconds to sleep between rename and commit
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes) -> str:
    """`data` in a fsync'ed temp file beside `path`; returns the temp path (removed again on any failure)."""
    tmp = str(path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any output file
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(path.parent)


def part_name(shard_index: int, seq: int, fmt: str) -> str:
    suffix = {"parquet": "parquet", "jsonl": "jsonl", "openai": "openai.jsonl"}[fmt]
    return f"part-{shard_index:05d}-{seq:05d}.{suffix}"


def part_shard(name: str) -> int | None:
    """The shard index a part (or its temp file) belongs to."""
    m = TEMP_RE.match(name)
    m = PART_RE.match(m.group(1) if m else name)
    return int(m.group(1)) if m else None


def remove_uncommitted(out: Path, committed: set[str], shard_indices: set[int] | None, manifest: str) -> list[str]:
    """Delete this writer's part and temp files that no manifest lists. Returns the names removed.

    Only parts of `shard_indices` are touched (None: all; other Slurm tasks own the other shards),
    and only the temp files of this writer's own manifest.
    """
    removed = []
    for p in out.iterdir():
        is_temp = bool(TEMP_RE.match(p.name))
        is_part = is_temp or bool(PART_RE.match(p.name))
        owned = shard_indices is None or part_shard(p.name) in shard_indices
        mine = is_part and owned and (is_temp or p.name not in committed)
        if mine or (p.name.startswith(f".{manifest}.") and p.name.endswith(".tmp")):
            _unlink(p)
            removed.append(p.name)
    return removed


class Committer:
    """Collects finished rows of one shard at a time and commits them as parts of the manifest.

    Rows are committed when `due()` (every `interval_s`, or when the buffer is large), when the
    shard ends, and before an interrupted run exits. A batch is converted to Arrow (or JSON lines)
    as it arrives, so the buffer is compact. Part names are never reused: a name any manifest lists
    is skipped.
    """

    MAX_BUFFER_BYTES = 64 << 20

    def __init__(self, out: Path, manifest, output_format: str, save_scores: bool, model: str,
                 interval_s: float, taken: set[str], pass_through=None):
        self.out, self.manifest = out, manifest
        self.pass_through = pass_through  # io.passthrough.PassThrough: input columns added to every row
        self.output_format, self.save_scores, self.model = output_format, save_scores, model
        self.interval_s = interval_s
        self.taken = set(taken)
        self.shard: int | None = None
        self.tables: list[pa.Table] = []  # parquet and openai formats
        self.lines: list[bytes] = []  # jsonl rows, or openai response lines
        self.nbytes = 0
        self.counts = _Counts()
        self.next_row = 0
        self._last = time.monotonic()
        self._wall_base = manifest.wall_s
        self._t0 = time.perf_counter()

    def add(self, shard: int, next_row: int, rows: list[RowResult]) -> None:
        assert self.shard in (None, shard), "commit a shard's rows before the next shard's"
        self.shard, self.next_row = shard, next_row
        if self.output_format in ("parquet", "openai"):
            table = to_table(rows, self.save_scores)
            for name, column in self.pass_through.arrays(rows) if self.pass_through else ():
                table = table.append_column(name, column)
            self.tables.append(table)
            self.nbytes += self.tables[-1].nbytes
        if self.output_format != "parquet":
            extra = self.pass_through.values(rows) if self.pass_through else [{}] * len(rows)
            data = (response_lines(rows, self.model) if self.output_format == "openai"
                    else b"".join(orjson.dumps(to_dict(r, self.save_scores) | e) + b"\n" for r, e in zip(rows, extra)))
            self.lines.append(data)
            self.nbytes += len(data)
        self.counts.add(rows)

    def due(self) -> bool:
        return self.nbytes >= self.MAX_BUFFER_BYTES or time.monotonic() - self._last >= self.interval_s

    def commit(self, shard: int | None = None, done: bool = False, total_rows: int | None = None) -> None:
        """Commit the buffered rows; `done` also marks `shard` finished, in the same manifest replace."""
        shard = self.shard if shard is None else shard
        names = self._write_parts() if self.counts.rows else []
        prog = self.manifest.shards[shard] if shard is not None else None
        if prog is not None and names:
            prog.parts.append(names[0])
            if self.output_format == "openai":
                prog.openai_parts.append(names[1])
            prog.next_row = self.next_row
            self.manifest.record_parts(names, self.counts.rows)
            self.counts.into(prog)
        if prog is not None and done:
            prog.done = True
            prog.total_rows = prog.rows if total_rows is None else total_rows
        self.save()
        self.taken.update(names)
        self.tables, self.lines, self.nbytes, self.counts, self.shard = [], [], 0, _Counts(), None
        self._last = time.monotonic()

    @property
    def has_rows(self) -> bool:
        """Rows are buffered, waiting for a commit."""
        return self.counts.rows > 0

    @contextmanager
    def keeping_finished_rows(self, stop_requested):
        """Around a job loop: what is finished is committed before an error leaves it. An engine that dies while a
        stop was asked for (`stop_requested()`: the signal reached its processes too) becomes Interrupted (exit 75,
        run again to resume); Interrupted and OutputError pass as they are (they commit, or cannot)."""
        try:
            yield
        except (Interrupted, OutputError):
            raise
        except EngineDied as e:
            if not stop_requested():
                self._commit_what_is_finished()
                raise
            self._commit_what_is_finished()
            raise Interrupted(f"{e.stopped_message}; committed rows are safe: run the same command again to resume") from e
        except Exception:
            self._commit_what_is_finished()  # a file-level problem mid-shard: keep what is finished, then stop
            raise

    def _commit_what_is_finished(self) -> None:
        if self.has_rows:
            self.commit()

    @property
    def elapsed_s(self) -> float:
        """Wall time of this run so far (the manifest's wall_s adds every earlier run's)."""
        return time.perf_counter() - self._t0

    def save(self, finished: bool | None = None) -> None:
        self.manifest.wall_s = self._wall_base + time.perf_counter() - self._t0
        if finished is not None:
            self.manifest.finished = finished
        try:
            self.manifest.save()
        except OSError as e:
            raise _write_error(self.out, self.manifest.path.name, e) from e

    def _next_seq(self, prog) -> int:
        seq = len(prog.parts)
        while any(part_name(self.shard, seq, f) in self.taken for f in ("parquet", "jsonl", "openai")):
            seq += 1
        return seq

    def _files(self, seq: int) -> list[tuple[str, bytes]]:
        files = []
        if self.tables:
            sink = pa.BufferOutputStream()
            pq.write_table(pa.concat_tables(self.tables, promote_options="permissive"), sink, compression="zstd")
            files.append((part_name(self.shard, seq, "parquet"), sink.getvalue().to_pybytes()))
        if self.lines:
            fmt = "openai" if self.output_format == "openai" else "jsonl"
            files.append((part_name(self.shard, seq, fmt), b"".join(self.lines)))
        return files

    def _write_parts(self) -> list[str]:
        return write_parts(self.out, self._files(self._next_seq(self.manifest.shards[self.shard])))


def write_parts(out: Path, files: list[tuple[str, bytes]]) -> list[str]:
    """Steps 1 and 2 of the protocol for `files` (name, bytes): temp files, renames, directory fsync.
    Nothing is committed until the caller replaces the manifest. Returns the names."""
    temps: list[str] = []
    try:
        for name, data in files:
            temps.append(_write_temp(out / name, data))
        for tmp, (name, _) in zip(temps, files):
            os.replace(tmp, out / name)
        fsync_dir(out)
    except OSError as e:
        for tmp in temps:
            _unlink(tmp)
        raise _write_error(out, files[0][0], e) from e
    except BaseException:
        for tmp in temps:
            _unlink(tmp)
        raise
    pause = os.environ.get(PAUSE_AFTER_RENAME_ENV)
    if pause:
        print(f"spcli-test: renamed {' '.join(n for n, _ in files)}", file=sys.stderr, flush=True)
        time.sleep(float(pause))
    return [n for n, _ in files]


class _Counts:
    def __init__(self):
        self.rows = self.failed = self.prompt_tokens = self.kept_tokens = 0
        self.prefill_s = 0.0

    def add(self, rows: list[RowResult]) -> None:
        """One batch's rows (each carries its batch's base prefill time: counted once)."""
        self.prefill_s += batch_prefill_s(rows)
        self.rows += len(rows)
        self.failed += sum(r.error is not None for r in rows)
        self.prompt_tokens += sum(r.num_prompt_tokens for r in rows)
        self.kept_tokens += sum(r.num_kept_tokens for r in rows)

    def into(self, prog) -> None:
        prog.rows += self.rows
        prog.failed += self.failed
        prog.prompt_tokens += self.prompt_tokens
        prog.kept_tokens += self.kept_tokens
        prog.prefill_s += self.prefill_s


def batch_prefill_s(rows: list[RowResult]) -> float:
    """A batch's base prefill seconds: every row of it without error stores the same value."""
    return max((r.prefill_s for r in rows if r.error is None), default=0.0)


def _write_error(out: Path, name: str, e: OSError) -> OutputError:
    what = "disk full" if e.errno in DISK_FULL else f"cannot write ({e.strerror or e})"
    if e.errno in DISK_FULL:
        what += f" ({e.strerror})"
    return OutputError(
        f"{out}: {what} while committing {name}; nothing partial was committed: "
        "fix it and run the same command again to resume"
    )
