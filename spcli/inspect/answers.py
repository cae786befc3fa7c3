"""A run's answers as a table (`spcli export`, `spcli inspect --answers`): one row per committed record, in input
order, with the chosen output columns, the pass-through columns, and, joined, the input record's own fields.

The input fields are read again from the input files (the rows name them and their row numbers): every field but
the prompt and messages (the document itself; `input_columns` may name them), the pass-through ones (there already)
and an `id` that is the output's id; a field whose name an output column has gets an `input.` prefix; nested values (a chat message list, an OpenAI body) as JSON text. A file
changed since the run is joined as it is now, with a warning.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import ConfigError, InputError
from spcli.inspect.outputs import RunOutputs
from spcli.io.read import _lines
from spcli.io.shards import shard_kind

DEFAULT_COLUMNS = ("id", "output", "finish_reason", "error")
UTF8_BOM = b"\xef\xbb\xbf"


def answer_table(run: RunOutputs, columns: tuple[str, ...] = (), join_input: bool = False,
                 input_columns: tuple[str, ...] = (), warn=lambda text: None) -> pa.Table:
    """The committed rows' `columns` (default DEFAULT_COLUMNS), then the pass-through columns, then with
    `join_input` (or `input_columns`: those fields only) the input record's fields."""
    chosen = list(dict.fromkeys(columns or DEFAULT_COLUMNS))
    unknown = [c for c in chosen if c not in run.columns]
    if unknown:
        raise ConfigError(f"--columns {','.join(unknown)}: no such column in {run.out}; its columns: "
                          f"{', '.join(run.columns)}")
    chosen += [c for c in run.pass_through if c not in chosen]
    table = run.table(list(dict.fromkeys([*chosen, "shard", "row"])))
    if join_input or input_columns:
        fields = run.config.get("fields") or {}
        skip = set() if input_columns else {fields.get("prompt", "prompt"), fields.get("messages", "messages"),
                                            *run.pass_through}  # the pass-through ones are there already
        if not input_columns and fields.get("id", "id") == "id":
            skip.add("id")  # the output's own id
        table = _join(table, run, input_columns, skip, set(chosen), warn)
    return table.select([c for c in table.column_names if c in chosen or c not in ("shard", "row")])


def _join(table: pa.Table, run: RunOutputs, wanted: tuple[str, ...], skip: set[str], taken: set[str], warn) -> pa.Table:
    """`table` with the input fields of each row's (shard, row) appended."""
    paths, rows = table.column("shard").to_pylist(), table.column("row").to_pylist()
    _warn_changed(run, set(paths), warn)
    found: dict[tuple[str, int], dict] = {}
    for path in dict.fromkeys(paths):
        need = {r for p, r in zip(paths, rows) if p == path}
        found.update(((path, r), d) for r, d in _input_rows(path, need, wanted, run.config.get("max_record_bytes")))
    names = list(wanted) or list(dict.fromkeys(k for d in found.values() for k in d if k not in skip))
    missing = [n for n in wanted if not any(n in d for d in found.values())]
    if missing and found:
        raise ConfigError(f"--input-columns {','.join(missing)}: no input record of {run.out} has such a field")
    for name in names:
        values = [found.get((p, r), {}).get(name) for p, r in zip(paths, rows)]
        table = table.append_column(f"input.{name}" if name in taken else name, _array(values))
    return table


def _array(values: list) -> pa.Array:
    """Plain values as they are; a list or an object (messages, an OpenAI body) as JSON text."""
    if any(isinstance(v, (list, dict)) for v in values):
        values = [None if v is None else orjson.dumps(v).decode() for v in values]
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a field of mixed types across rows
        return pa.array([None if v is None else orjson.dumps(v).decode() for v in values])


def _input_rows(path: str, need: set[int], wanted: tuple[str, ...], limit: int | None) -> Iterator[tuple[int, dict]]:
    """(row, record) for the rows `need` of one input file, read front to back (rows numbered as spcli run does)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: the run's input file is not here; --join-input reads it again")
    last = max(need, default=-1)
    if shard_kind(path) == "parquet":
        pf = pq.ParquetFile(path)
        columns = [c for c in wanted if c in pf.schema_arrow.names] if wanted else None
        row = 0
        for batch in pf.iter_batches(columns=columns, use_threads=False):
            if row > last:
                return
            for d in batch.to_pylist():
                if row in need:
                    yield row, d
                row += 1
        return
    with (gzip.open if shard_kind(path) == "jsonl.gz" else open)(path, "rb") as f:
        for row, line, _, _ in _lines(f, limit or 8 << 20):
            if row > last:
                return
            if row in need and line is not None and line.strip():
                try:
                    obj = orjson.loads(line.lstrip(UTF8_BOM) if row == 0 else line)
                except orjson.JSONDecodeError:
                    continue  # an error row of the run: no fields to join
                if isinstance(obj, dict):
                    yield row, {k: v for k, v in obj.items() if not wanted or k in wanted}


def _warn_changed(run: RunOutputs, paths: set[str], warn) -> None:
    for entry in run.fingerprint_fields.get("inputs") or []:
        path = entry.get("path")
        if path in paths and os.path.isfile(path):
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) != (entry.get("size"), entry.get("mtime_ns")):
                warn(f"{path} changed since the run: its fields are joined as they are now")
