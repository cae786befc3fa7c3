"""Read a run's output directory: its merged manifests and the rows of its committed part files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
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

    @property
    def is_finished(self) -> bool:
        return all(m.get("finished", False) for m in self.manifests)

    @property
    def has_importance(self) -> bool:
        return bool(self.config.get("save_scores"))

    def table(self, columns: list[str]) -> pa.Table:
        """The named columns of every committed row, in input order."""
        schema = output_schema(save_scores=True)
        columns = [c for c in columns if c in schema.names]
        sub = pa.schema([schema.field(c) for c in columns])
        tables = [_read_part(p, columns, sub) for p in self.parts]
        return pa.concat_tables(tables) if tables else sub.empty_table()

    def rows(self) -> Iterator[dict]:
        """Every committed row as a dict (all columns), in input order."""
        schema = output_schema(save_scores=True)
        for p in self.parts:
            yield from _read_part(p, schema.names, schema).to_pylist()

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
        schema = output_schema(save_scores=True)
        return _read_part(part, schema.names, schema).slice(i, 1).to_pylist()[0]


def _read_part(path: Path, columns: list[str], schema: pa.Schema) -> pa.Table:
    try:
        if path.suffix == ".parquet":
            present = set(pq.read_schema(path).names)
            table = pq.read_table(path, columns=[c for c in columns if c in present])
            for c in columns:  # a run without --save-scores has no importance column
                if c not in present:
                    table = table.append_column(schema.field(c), pa.nulls(table.num_rows, schema.field(c).type))
            return table.select(columns).cast(schema)
        with open(path, "rb") as f:
            docs = [orjson.loads(line) for line in f if line.strip()]
        return pa.Table.from_pylist([{c: d.get(c) for c in columns} for d in docs], schema=schema)
    except (OSError, pa.ArrowInvalid, orjson.JSONDecodeError) as e:
        raise OutputError(f"{path}: committed part file is unreadable ({e})") from e


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
                      [s for _, s in sorted(shards.items())], parts)
