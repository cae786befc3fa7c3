"""Committed parts rewritten with some rows redone (`spcli run --retry-failed`).

A part is never changed in place. Its rows, with the redone ones swapped in at their positions, are
written as a new part under a name no manifest has listed (steps 1-2 of commit.py's protocol); the
manifest replace that swaps the names is the commit; the old file is deleted after it. A kill before
the replace leaves the old part committed and the new one unlisted (removed at the next start); a
kill after it leaves the old one unlisted. Either way every row is committed exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spcli.errors import OutputError
from spcli.io.commit import PART_RE, part_name, write_parts
from spcli.io.manifest import Manifest, ShardProgress
from spcli.io.openai import response_lines
from spcli.io.schema import RowResult, output_schema, to_dict


def failed_rows(out: Path, prog: ShardProgress) -> dict[int, str]:
    """The shard's committed error rows: row -> the part that holds it."""
    found = {}
    for name in prog.parts if prog.failed else []:
        for doc in _read(out / name):
            if doc.get("error") is not None:
                found[doc["row"]] = name
    return found


def _read(path: Path) -> list[dict]:
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path).to_pylist()
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    except (OSError, pa.ArrowException, orjson.JSONDecodeError) as e:
        raise OutputError(f"{path}: committed part file is unreadable ({e}); rerun with --fresh to start over") from e


def free_seq(taken: set[str], shard: int) -> int:
    """A part number of `shard` after every name ever taken."""
    seqs = [int(m.group(2)) for m in map(PART_RE.match, taken) if m and int(m.group(1)) == shard]
    return max(seqs, default=-1) + 1


def changed(old: dict, new: RowResult) -> bool:
    return (old.get("error"), old.get("output")) != (new.error, new.output)


def rewrite_part(out: Path, manifest: Manifest, shard: int, part: str, redone: dict[int, RowResult],
                 taken: set[str], model: str) -> tuple[str, list[str]]:
    """Write `part` again with the rows in `redone` (by row) swapped in, and swap the names in `manifest`
    (not saved: saving it commits). Returns the part's name now, and the names no longer listed, to delete
    after the save: none when every redone row came out as it was (a record still bad in the same way)."""
    prog = manifest.shards[shard]
    docs = _read(out / part)
    at = {d["row"]: i for i, d in enumerate(docs)}
    assert set(redone) <= set(at), "a redone row belongs to the part it replaces"
    if not any(changed(docs[at[row]], r) for row, r in redone.items()):
        return part, []
    deltas = {"failed": 0, "prompt_tokens": 0, "kept_tokens": 0}
    for row, r in redone.items():
        old = docs[at[row]]
        deltas["failed"] += (r.error is not None) - (old.get("error") is not None)
        deltas["prompt_tokens"] += r.num_prompt_tokens - (old.get("num_prompt_tokens") or 0)
        deltas["kept_tokens"] += r.num_kept_tokens - (old.get("num_kept_tokens") or 0)
    seq = free_seq(taken, shard)
    files = []
    if part.endswith(".parquet"):
        schema = pq.read_schema(out / part)
        save_scores = "importance" in schema.names
        extra = _pass_through(redone, [n for n in schema.names if n not in output_schema(True).names])
        for row, r in redone.items():
            docs[at[row]] = to_dict(r, save_scores) | extra[row]
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(docs, schema=schema), sink, compression="zstd")
        files.append((part_name(shard, seq, "parquet"), sink.getvalue().to_pybytes()))
    else:
        save_scores = any("importance" in d for d in docs)
        columns = dict.fromkeys(k for d in docs for k in d if k not in output_schema(True).names)
        extra = _pass_through(redone, list(columns))
        for row, r in redone.items():
            docs[at[row]] = to_dict(r, save_scores) | extra[row]
        files.append((part_name(shard, seq, "jsonl"), b"".join(orjson.dumps(d) + b"\n" for d in docs)))
    if prog.openai_parts:
        old_lines = (out / prog.openai_parts[prog.parts.index(part)]).read_bytes().splitlines(keepends=True)
        for row, r in redone.items():
            old_lines[at[row]] = response_lines([r], model)
        files.append((part_name(shard, seq, "openai"), b"".join(old_lines)))
    names = write_parts(out, files)
    taken.update(names)
    return names[0], manifest.replace_part(shard, part, names, deltas)


def _pass_through(redone: dict[int, RowResult], columns: list[str]) -> dict[int, dict]:
    """The --pass-through columns a part holds, read again for its redone rows (the input may have been mended)."""
    if not columns:
        return {row: {} for row in redone}
    from spcli.io.passthrough import PassThrough

    rows = sorted(redone)
    return dict(zip(rows, PassThrough(tuple(columns)).values([redone[row] for row in rows])))


def delete(out: Path, names: list[str]) -> None:
    """Parts the manifest no longer lists (a failure here only leaves files the next start removes)."""
    for name in names:
        try:
            os.unlink(out / name)
        except OSError:
            pass
