"""The output directory's manifest (committed progress per shard) and its writer lock.

`manifest.json` (or `manifest-task-NNNNN.json` for a Slurm array task) holds the resolved config,
the fingerprint of everything that changes outputs, and per shard: the next row to read and the
committed part files. Readers merge every `manifest*.json` in the directory.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from spcli import __version__
from spcli.errors import OutputError
from spcli.io.commit import atomic_write_bytes
from spcli.io.records import Shard

MANIFEST_VERSION = 1


@dataclass
class ShardProgress:
    path: str
    next_row: int = 0  # rows before this one are committed
    parts: list[str] = field(default_factory=list)
    rows: int = 0  # committed rows (records)
    failed: int = 0  # committed rows with an error
    prompt_tokens: int = 0
    kept_tokens: int = 0
    done: bool = False


def input_identity(shards: list[Shard]) -> list[dict]:
    out = []
    for s in shards:
        st = os.stat(s.path)
        out.append({"index": s.index, "path": s.path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def fingerprint(fields: dict) -> str:
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def describe_difference(old: dict, new: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += describe_difference(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


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

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_fields)

    def committed_parts(self) -> set[str]:
        return {p for s in self.shards.values() for p in s.parts}

    def totals(self) -> dict:
        s = self.shards.values()
        return {
            "rows": sum(x.rows for x in s), "failed": sum(x.failed for x in s),
            "prompt_tokens": sum(x.prompt_tokens for x in s), "kept_tokens": sum(x.kept_tokens for x in s),
            "shards": len(self.shards), "shards_done": sum(x.done for x in s),
        }

    def to_json(self) -> bytes:
        doc = {
            "version": MANIFEST_VERSION, "spcli_version": __version__, "fingerprint": self.fingerprint,
            "fingerprint_fields": self.fingerprint_fields, "config": self.config, "task": self.task,
            "started": self.started, "updated": time.time(), "wall_s": self.wall_s, "finished": self.finished,
            "summary": self.totals(),
            "shards": {str(i): vars(p) for i, p in sorted(self.shards.items())},
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    def save(self) -> None:
        atomic_write_bytes(self.path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            doc = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise OutputError(f"{path}: manifest is unreadable ({e}); use --fresh to start over") from e
        shards = {int(i): ShardProgress(**p) for i, p in doc["shards"].items()}
        return cls(path, doc["config"], doc["fingerprint_fields"], shards, doc.get("task"),
                   doc.get("started", time.time()), doc.get("wall_s", 0.0), doc.get("finished", False))


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


class WriterLock:
    """One writer per directory (per Slurm task): `.lock[-task-N]` holding host, pid and job id."""

    def __init__(self, out: Path, task_index: int | None, warn=print):
        self.path = out / (".lock" if task_index is None else f".lock-task-{task_index:05d}")
        self.warn = warn
        self.held = False

    def acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("SLURM_JOB_ID"), "time": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and not self._is_stale(owner, me):
                    raise OutputError(
                        f"{self.path.parent}: another spcli run writes here (host {owner.get('host')}, pid {owner.get('pid')}); "
                        f"wait for it, or remove {self.path} if that run is gone"
                    ) from None
                self.warn(f"taking over a stale lock {self.path} (host {owner.get('host') if owner else '?'}, pid {owner.get('pid') if owner else '?'})")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(me))
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            return
        raise OutputError(f"{self.path}: could not take the lock")

    def _owner(self) -> dict | None:
        try:
            return orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None  # half-written lock: its writer died while creating it

    @staticmethod
    def _is_stale(owner: dict, me: dict) -> bool:
        if owner.get("job") and owner.get("job") == me["job"]:
            return True  # the same Slurm job, requeued: its earlier attempt is gone
        if owner.get("host") != me["host"]:
            return False
        pid = owner.get("pid")
        if not isinstance(pid, int) or pid == me["pid"]:
            return pid == me["pid"]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
