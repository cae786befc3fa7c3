"""Read a run's output directory: its merged manifests and the rows of its committed part files (spcli's columns,
and the input columns `--pass-through` carried into them)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import OutputError
from spcli.io.manifest import read_manifests
from spcli.io.schema import output_schema


@dataclass
class RunOutputs:
    out: Path
    manifests: list[dict]  # every manifest*.json document (one per Slurm task, or one)
    config: dict  # the resolved RunConfig as saved (select, score, generate, model, ...)
    fingerprint_fields: dict
    shards: list[dict]  # ShardProgress documents of every manifest, by shard index
    parts: list[Path]  # committed part files, in input order (shard by shard, row by row)
    pass_through: list[str] = field(default_factory=list)  # input columns copied into the rows (every configuration's)

    @property
    def is_finished(self) -> bool:
        return all(m.get("finished", False) for m in self.manifests)

    @property
    def has_importance(self) -> bool:
        return bool(self.config.get("save_scores"))

    @property
    def columns(self) -> list[str]:
        """Every column a row has: spcli's (output_schema), then the pass-through ones."""
        return output_schema(save_scores=True).names + self.pass_through

    def table(self, columns: list[str]) -> pa.Table:
        """The named columns of every committed row, in input order (spcli's and the pass-through ones; other
        names are left out)."""
        columns = [c for c in columns if c in self.columns]
        tables = [_read_part(p, columns, self.pass_through) for p in self.parts]
        if not tables:
            return pa.schema([_field(c) for c in columns]).empty_table()
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a pass-through column typed one way in a part, another in the next
            return pa.concat_tables([_as_text(t, self.pass_through) for t in tables], promote_options="permissive")

    @functools.cached_property
    def group_rows(self) -> dict[str, list[dict]]:
        """The rows ({id, shard, row}) of each document group, by its name: read once per run (inspect's notes on
        rows prefilled whole with their group, one per row shown)."""
        groups: dict[str, list[dict]] = {}
        for r in self.table(["id", "shard", "row", "group"]).to_pylist():
            if r.get("group") is not None:
                groups.setdefault(r["group"], []).append(r)
        return groups

    def rows(self) -> Iterator[dict]:
        """Every committed row as a dict (all columns, pass-through ones included), in input order: an iterator,
        one part read at a time (docs/guide/python.md: `list(run.rows())` for a list)."""
        for p in self.parts:
            yield from _read_part(p, self.columns, self.pass_through).to_pylist()

    def find(self, row_id: str | None = None, index: int | None = None) -> dict:
        """One row by its id, or by its 0-based position in the outputs."""
        seen = 0
        for p in self.parts:
            ids = _read_part(p, ["id"], pa.schema([pa.field("id", pa.string())])).column("id").to_pylist()
            if row_id is not None and row_id in ids:
                return self._row_at(p, ids.index(row_id))
            if index is not None and seen + len(ids) > index:
                return self._row_at(p, index - seen)
            seen += len(ids)
        if row_id is not None:
            raise OutputError(f"{self.out}: no row with id {row_id!r} among its {seen} committed rows")
        raise OutputError(f"{self.out}: --row {index} is out of range: the run has {seen} committed rows (0..{seen - 1})")

    def _row_at(self, part: Path, i: int) -> dict:
        return _read_part(part, self.columns, self.pass_through).slice(i, 1).to_pylist()[0]


def _field(name: str) -> pa.Field:
    """spcli's column of that name, or a pass-through column (its type is its part's: null until read)."""
    schema = output_schema(save_scores=True)
    return schema.field(name) if name in schema.names else pa.field(name, pa.null())


def _read_part(path: Path, columns: list[str], pass_through: list[str]) -> pa.Table:
    """These columns of one part: spcli's cast to the output schema (absent ones null: a run without --save-scores
    has no importance column), the pass-through ones as the part holds them (JSONL: inferred, JSON text where mixed)."""
    try:
        if path.suffix == ".parquet":
            present = set(pq.read_schema(path).names)
            table = pq.read_table(path, columns=[c for c in columns if c in present])
        else:
            with open(path, "rb") as f:
                docs = [orjson.loads(line) for line in f if line.strip()]
            table = pa.table({c: _values(c, [d.get(c) for d in docs]) for c in columns})
        arrays = []
        for c in columns:
            want = _field(c)
            column = table.column(c) if c in table.column_names else pa.nulls(table.num_rows, want.type)
            arrays.append(column if c in pass_through else column.cast(want.type))
        return pa.table(arrays, names=columns)
    except (OSError, pa.ArrowInvalid, orjson.JSONDecodeError) as e:
        raise OutputError(f"{path}: committed part file is unreadable ({e})") from e


def _values(name: str, values: list) -> pa.Array:
    """A JSONL part's column: spcli's typed by the schema, a pass-through one inferred (JSON text where mixed)."""
    want = _field(name)
    if want.type != pa.null():
        return pa.array(values, type=want.type)
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else orjson.dumps(v).decode() for v in values])


def _as_text(table: pa.Table, pass_through: list[str]) -> pa.Table:
    """The pass-through columns of a part as JSON text (where parts disagree on a column's type)."""
    for c in pass_through:
        if c in table.column_names:
            values = [None if v is None else orjson.dumps(v).decode() for v in table.column(c).to_pylist()]
            table = table.set_column(table.column_names.index(c), c, pa.array(values, pa.string()))
    return table


def pass_through_columns(docs: list[dict]) -> list[str]:
    """The input columns every configuration of the directory's manifests carried into its rows, in order."""
    configs = [e.get("config") or {} for d in docs for e in (d.get("configs") or [])] + [d.get("config") or {} for d in docs]
    return list(dict.fromkeys(c for cfg in configs for c in (cfg.get("pass_through") or ())))


def load_run(out: str | Path) -> RunOutputs:
    out = Path(out)
    if not out.is_dir():
        raise OutputError(f"{out}: no such directory")
    docs = read_manifests(out)
    if not docs:
        raise OutputError(f"{out}: not an spcli output directory (no readable manifest*.json)")
    shards: dict[int, dict] = {}
    for doc in docs:
        for i, s in doc.get("shards", {}).items():
            shards[int(i)] = s
    parts = [out / name for _, s in sorted(shards.items()) for name in s["parts"]]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise OutputError(f"{out}: committed part file(s) missing: {', '.join(missing[:3])}")
    return RunOutputs(out, docs, docs[0]["config"], docs[0].get("fingerprint_fields", {}),
                      [s for _, s in sorted(shards.items())], parts, pass_through_columns(docs))
