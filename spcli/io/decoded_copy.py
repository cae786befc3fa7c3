"""The decoded copies a shard is read from in its group order (spcli.io.group_order), so that reading a record
anywhere in the shard costs one read, not a decompression or a decoding from the start.

- gzip JSONL: decompressed once into a temporary file (`unpacked`), scanned and read by offset as plain JSONL;
- Parquet: the columns records are made of, decoded once into an uncompressed Arrow IPC file (`decoded`), read a row
  at a time through mmap (`DecodedRows`).

Both live in the run's output directory (`tmp_dir`; None: the system's temporary directory), unlinked when made (a
kill leaves nothing) and gone when the shard is read; they cost disk, not memory: the decompressed shard, or those
columns' values; their pages are the page cache's. A full disk is an OutputError naming the directory.
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import tempfile
import zlib
from collections.abc import Iterator

import numpy as np

from spcli.config.run import FieldConfig
from spcli.errors import InputError, OutputError
from spcli.io.shards import Shard

COPY_BATCH_ROWS = 1024  # Parquet: rows per record batch of the decoded copy


def unpacked(shard: Shard, tmp_dir: str | None):
    """A gzip shard's decompressed bytes in a temporary file (as many bytes as the shard holds uncompressed, on disk;
    memory: a 1 MiB copy buffer): the first pass scans it as plain JSONL and records are read from it by offset."""
    f = temporary(tmp_dir, ".spcli-unpacked-")
    try:
        try:
            with gzip.open(shard.path, "rb") as z:
                while chunk := z.read(1 << 20):
                    write(f, chunk, shard, tmp_dir)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise InputError(f"{shard.path}: compressed file is truncated or corrupt ({e})") from e
        except OSError as e:
            raise InputError(f"{shard.path}: cannot read ({e.strerror or e})") from e
        f.flush()
    except BaseException:
        f.close()
        raise
    return f


def temporary(tmp_dir: str | None, prefix: str):
    try:
        return tempfile.TemporaryFile(dir=tmp_dir, prefix=prefix)
    except OSError as e:
        raise OutputError(f"{tmp_dir or tempfile.gettempdir()}: cannot make a temporary file ({e.strerror or e})") from e


def write(f, data, shard: Shard, tmp_dir: str | None) -> None:
    """Write to a shard's decoded copy; a full disk is an OutputError naming where."""
    try:
        f.write(data)
    except OSError as e:
        raise OutputError(f"{shard.path}: cannot write its decoded copy in {tmp_dir or tempfile.gettempdir()} "
                          f"({e.strerror or e}); it needs about the shard's uncompressed size there") from e


@contextlib.contextmanager
def decoded(shard: Shard, fields: FieldConfig, tmp_dir: str | None, lo: int, hi: int):
    """A Parquet shard's columns that records are made of, decoded once into an Arrow IPC file in a temporary file
    (uncompressed: about as many bytes as those columns' values, on disk), in batches of COPY_BATCH_ROWS rows of rows
    lo .. hi - 1, so that any row is read back without decoding its row group again. Yields its DecodedRows (None
    for no rows)."""
    import pyarrow as pa

    from spcli.io.parquet import open_parquet, parquet_columns, parquet_parts

    with temporary(tmp_dir, ".spcli-decoded-") as f:
        if hi <= lo:
            yield None
            return
        pf = open_parquet(shard)
        columns = parquet_columns(pf, shard, fields)
        writer, sizes = None, [0]
        try:
            for part in parquet_parts(pf, columns, shard, lo, hi, COPY_BATCH_ROWS):
                writer = writer or pa.ipc.new_file(f, part.schema)
                writer.write_batch(part)
                sizes.append(part.num_rows)
            writer.close()
            f.flush()
        except (OSError, pa.ArrowException) as e:
            raise OutputError(f"{shard.path}: cannot write its decoded copy in {tmp_dir or tempfile.gettempdir()} "
                              f"({e})") from e
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # batches are views of it: no copy
        yield DecodedRows(pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))), lo + np.cumsum(sizes), shard)


class DecodedRows:
    """Rows of a Parquet shard's decoded copy (`decoded`), read through a memory map: its record batches are views of
    the map (headers only: ~1 kB per batch of COPY_BATCH_ROWS rows), so what is held is the row being read."""

    def __init__(self, reader, starts: np.ndarray, shard: Shard):
        self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self.starts, self.shard = starts, shard  # starts: [batches + 1], the row each begins at

    def rows(self, rows: list[int]) -> Iterator[dict | str]:
        """These rows' values, in this order (parquet.rows_of's: a dict, or the text of its Unicode problem)."""
        from spcli.io.parquet import rows_of

        at = np.searchsorted(self.starts, rows, side="right") - 1
        for row, i, first in zip(rows, at.tolist(), self.starts[at].tolist()):
            if not 0 <= i < len(self.batches):
                raise InputError(f"{self.shard.path}: changed while it was read (row {row} was not in its first pass)")
            yield next(rows_of(self.batches[i].slice(row - first, 1)))
