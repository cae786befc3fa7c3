"""The output directory's manifest: committed progress per shard (the writer lock is in lock.py).

`manifest.json` (or `manifest-task-NNNNN.json` for a Slurm array task) holds the resolved config,
the fingerprint of everything that changes outputs, and per shard: the next row to read and the
committed part files. Readers merge every `manifest*.json` in the directory. A part file that no
manifest lists does not exist.

History is never rewritten: `configs` lists every configuration that committed parts here (a
`--force` run with another configuration appends one), each with the parts and rows it made. The
top-level `config` and fingerprint are the latest one's: what a resume must match.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import orjson

from spcli import __version__
from spcli.errors import OutputError
from spcli.io.commit import atomic_write_bytes
from spcli.io.shards import Shard, piece_key

MANIFEST_VERSION = 1


@dataclass
class ShardProgress:
    path: str
    next_row: int = 0  # rows before this one are committed
    parts: list[str] = field(default_factory=list)  # committed part files, spcli schema (Parquet or JSONL)
    openai_parts: list[str] = field(default_factory=list)  # --output-format openai: response lines, one per part
    rows: int = 0  # committed rows (records)
    failed: int = 0  # committed rows with an error
    prompt_tokens: int = 0
    kept_tokens: int = 0
    prefill_s: float = 0.0  # base prefill seconds, summed over the committed batches (each once)
    total_rows: int | None = None  # records in the shard, when known (Parquet metadata, JSONL count, or done)
    done: bool = False
    row_range: list[int] | None = None  # [start, stop): a range of the file's rows (spcli run --ray); absent: all
    order: str | None = None  # "groups": next_row counts records of the shard's group order (spcli.io.group_order)

    @classmethod
    def start(cls, shard: Shard) -> ShardProgress:
        """A shard (or row range) no row of which is committed yet."""
        rows = None if shard.rows is None else list(shard.rows)
        return cls(shard.path, next_row=shard.first_row, row_range=rows)

    @classmethod
    def from_doc(cls, doc: dict) -> ShardProgress:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})

    @property
    def key(self) -> str:
        return piece_key(self.path, self.row_range)

    def to_doc(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in ("row_range", "order") or v is not None}


def progress_key(doc: dict) -> str:
    """A manifest entry's shard (or row range) as `Shard.key` names it."""
    return piece_key(doc["path"], doc.get("row_range"))


def progress_rows(doc: dict) -> tuple[int, int] | None:
    """A manifest entry's row range as `Shard.rows` holds it (None: the whole file)."""
    return None if doc.get("row_range") is None else tuple(doc["row_range"])


def input_identity(shards: list[Shard]) -> list[dict]:
    out = []
    for s in shards:
        st = os.stat(s.path)
        out.append({"index": s.index, "path": s.path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def fingerprint(fields: dict) -> str:
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def describe_difference(old: dict | list, new: dict | list, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs, dotted paths into nested config (a tuple is the list that the
    manifest's JSON holds of it: both name the same fingerprint)."""
    return _differences(orjson.loads(orjson.dumps(old)), orjson.loads(orjson.dumps(new)), prefix)


def _differences(old: dict | list, new: dict | list, prefix: str) -> list[str]:
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        old, new = dict(enumerate(old)), dict(enumerate(new))
    diffs = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if (isinstance(a, dict) and isinstance(b, dict)) or (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)):
            diffs += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


def config_entry(config: dict, fingerprint_fields: dict) -> dict:
    """One configuration of the directory's history: what it was, and the parts and rows it made."""
    return {"fingerprint": fingerprint(fingerprint_fields), "config": config, "fingerprint_fields": fingerprint_fields,
            "started": time.time(), "parts": [], "rows": 0}


@dataclass
class Manifest:
    path: Path
    config: dict
    fingerprint_fields: dict
    shards: dict[int, ShardProgress]
    task: dict | None = None
    started: float = field(default_factory=time.time)
    wall_s: float = 0.0
    finished: bool = False
    configs: list[dict] = field(default_factory=list)  # config_entry()s, oldest first; the last is `config`
    sharing: dict = field(default_factory=dict)  # what document groups did, summed over the runs' ends (job.batch.row_notes)

    def __post_init__(self) -> None:
        if not self.configs:
            entry = config_entry(self.config, self.fingerprint_fields)
            entry["parts"] = [p for _, s in sorted(self.shards.items()) for p in s.parts]
            entry["rows"] = sum(s.rows for s in self.shards.values())
            self.configs.append(entry)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_fields)

    def use_config(self, config: dict, fingerprint_fields: dict) -> None:
        """Parts committed from now on are made with this configuration (the earlier ones keep theirs)."""
        self.config, self.fingerprint_fields = config, fingerprint_fields
        if self.configs[-1]["fingerprint"] != fingerprint(fingerprint_fields):
            self.configs.append(config_entry(config, fingerprint_fields))

    def record_parts(self, names: list[str], rows: int) -> None:
        """Committed parts (spcli-schema first) and their rows, made by the latest configuration."""
        self.configs[-1]["parts"].append(names[0])
        self.configs[-1]["rows"] += rows

    def replace_part(self, shard: int, old: str, new: list[str], deltas: dict[str, int]) -> list[str]:
        """`new` (spcli-schema first, then the OpenAI lines) takes the place of committed part `old`: the same
        rows, some redone by --retry-failed; the shard's counts change by `deltas`. Returns the names unlisted."""
        prog = self.shards[shard]
        i = prog.parts.index(old)
        gone = [old]
        prog.parts[i] = new[0]
        if len(new) > 1:
            gone.append(prog.openai_parts[i])
            prog.openai_parts[i] = new[1]
        for key, delta in deltas.items():
            setattr(prog, key, getattr(prog, key) + delta)
        for entry in self.configs:  # the history keeps the rows where they were, under the new name
            entry["parts"] = [new[0] if p == old else p for p in entry["parts"]]
        return gone

    def committed_parts(self) -> set[str]:
        return {p for s in self.shards.values() for p in (*s.parts, *s.openai_parts)}

    def totals(self) -> dict:
        """The run's summary: rows in the inputs (None until known), written, failed, tokens, wall time."""
        s = self.shards.values()
        totals = [x.total_rows for x in s]
        rows, failed = sum(x.rows for x in s), sum(x.failed for x in s)
        return {
            "rows_total": sum(totals) if None not in totals else None,
            "rows": rows, "rows_ok": rows - failed, "failed": failed,
            "prompt_tokens": sum(x.prompt_tokens for x in s), "kept_tokens": sum(x.kept_tokens for x in s),
            "wall_s": round(self.wall_s, 3), "shards": len(self.shards), "shards_done": sum(x.done for x in s),
        }

    def to_json(self) -> bytes:
        doc = {
            "version": MANIFEST_VERSION, "spcli_version": __version__, "fingerprint": self.fingerprint,
            "fingerprint_fields": self.fingerprint_fields, "config": self.config, "task": self.task,
            "started": self.started, "updated": time.time(), "wall_s": self.wall_s, "finished": self.finished,
            "summary": self.totals(), "configs": self.configs,
            "shards": {str(i): p.to_doc() for i, p in sorted(self.shards.items())},
        }
        if self.sharing:
            doc["sharing"] = self.sharing
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    def save(self) -> None:
        atomic_write_bytes(self.path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            doc = orjson.loads(path.read_bytes())
            shards = {int(i): ShardProgress.from_doc(p) for i, p in doc["shards"].items()}
            return cls(path, doc["config"], doc["fingerprint_fields"], shards, doc.get("task"),
                       doc.get("started", time.time()), doc.get("wall_s", 0.0), doc.get("finished", False),
                       list(doc.get("configs") or []), dict(doc.get("sharing") or {}))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise OutputError(f"{path}: manifest is unreadable ({type(e).__name__}: {e}); rerun with --fresh to start over") from e


def manifest_name(task_index: int | None) -> str:
    return "manifest.json" if task_index is None else f"manifest-task-{task_index:05d}.json"


def read_manifests(out: Path) -> list[dict]:
    """Every committed manifest in a directory, as documents (the merged view for readers)."""
    docs = []
    for p in sorted(out.glob("manifest*.json")):
        try:
            docs.append(orjson.loads(p.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
    return docs


def config_history(docs: list[dict]) -> list[dict]:
    """Every configuration that committed parts, over all manifests (merged by fingerprint), oldest first:
    {rows, parts, differences} with differences as `key: first -> this` against the first one."""
    entries = [e for d in docs for e in (d.get("configs") or [])]
    if not entries:
        return []
    first = entries[0].get("fingerprint_fields", {})
    merged: dict[str, dict] = {}
    for e in entries:
        item = merged.setdefault(e.get("fingerprint", ""), {
            "rows": 0, "parts": [], "differences": describe_difference(first, e.get("fingerprint_fields", {}))})
        item["rows"] += e.get("rows", 0)
        item["parts"] += e.get("parts", [])
    return [c for c in merged.values() if c["parts"]]


def history_lines(history: list[dict]) -> list[str]:
    """One line per configuration, for `inspect` and `status` (only worth showing when there are several)."""
    lines = []
    for i, c in enumerate(history):
        n = len(c["parts"])
        what = "; ".join(c["differences"]) if c["differences"] else "the first configuration"
        lines.append(f"{i + 1}: {c['rows']} rows in {n} part{'' if n == 1 else 's'} (from {c['parts'][0]}): {what}")
    return lines
