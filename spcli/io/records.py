"""Input records: discovery of shards and validation of one raw record."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spcli.config import FieldConfig
from spcli.errors import InputError, RecordError

SHARD_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True)
class Shard:
    index: int  # position in the run's shard list: names part files, stable across Slurm tasks
    path: str


@dataclass
class Record:
    shard: int
    row: int  # 0-based line (JSONL) or row (Parquet) index in the shard
    id: str
    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int | None = None
    keep: float | None = None
    temperature: float | None = None
    custom_id: str | None = None  # OpenAI batch request lines
    endpoint: str | None = None  # "/v1/chat/completions" | "/v1/completions"
    error: str | None = None  # set when the record is bad: it becomes an error row


def shard_kind(path: str) -> str | None:
    name = path.lower()
    for suffix in SHARD_SUFFIXES:
        if name.endswith(suffix):
            return "parquet" if suffix == ".parquet" else ("jsonl.gz" if suffix.endswith(".gz") else "jsonl")
    return None


def discover(inputs: tuple[str, ...] | list[str]) -> list[Shard]:
    """Files, globs and directories -> ordered shards (each directory and glob sorted by name)."""
    paths: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(
                str(p) for p in Path(item).rglob("*") if p.is_file() and shard_kind(str(p)) and not p.name.startswith(".")
            )
            if not found:
                raise InputError(f"{item}: directory has no shards (*.jsonl, *.jsonl.gz, *.parquet)")
            paths.extend(found)
        elif os.path.isfile(item):
            if shard_kind(item) is None:
                raise InputError(f"{item}: not a shard (expected .jsonl, .jsonl.gz or .parquet)")
            paths.append(item)
        elif glob.has_magic(item):
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p) and shard_kind(p))
            if not found:
                raise InputError(f"{item}: glob matches no shards")
            paths.extend(found)
        else:
            raise InputError(f"{item}: no such file or directory")
    seen: dict[str, None] = {}
    for p in paths:
        seen.setdefault(os.path.abspath(p), None)
    return [Shard(i, p) for i, p in enumerate(seen)]


def _where(shard_path: str, row: int, kind: str) -> str:
    return f"{shard_path}:{'row' if kind == 'parquet' else 'line'} {row + 1 if kind != 'parquet' else row}"


def _check_messages(value: Any, field: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RecordError(f"field {field!r} must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RecordError(f"field {field!r}[{i}] must be an object with role and content")
        if m.get("role") not in ROLES:
            raise RecordError(f"field {field!r}[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise RecordError(f"field {field!r}[{i}].content must be a string")
    return value


def _number(obj: dict, key: str, kind: type, lo: float, hi: float, field: str) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise RecordError(f"field {field!r} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if not lo <= value <= hi:
        raise RecordError(f"field {field!r} must be in [{lo}, {hi}], got {value!r}")
    return kind(value)


def to_record(obj: Any, shard: Shard, row: int, kind: str, fields: FieldConfig) -> Record:
    """Validate one decoded record; a problem becomes `Record.error` naming file, row and field."""
    stem = Path(shard.path).name.split(".")[0]
    default_id = f"{stem}:{row}"
    rec = Record(shard.index, row, default_id)
    where = _where(shard.path, row, kind)
    try:
        if not isinstance(obj, dict):
            raise RecordError(f"record must be a JSON object, got {type(obj).__name__}")
        if "custom_id" in obj and isinstance(obj.get("body"), dict):  # OpenAI batch request line
            rec.custom_id = str(obj["custom_id"])
            rec.id = rec.custom_id
            rec.endpoint = obj.get("url") or "/v1/chat/completions"
            if rec.endpoint not in ("/v1/chat/completions", "/v1/completions"):
                raise RecordError(f"field 'url' must be /v1/chat/completions or /v1/completions, got {rec.endpoint!r}")
            body = obj["body"]
            src, prompt_key, messages_key = body, "prompt", "messages"
            max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        else:
            src, prompt_key, messages_key, max_key = obj, fields.prompt, fields.messages, "max_tokens"
            raw_id = obj.get(fields.id)
            if raw_id is not None:
                if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or str(raw_id) == "":
                    raise RecordError(f"field {fields.id!r} must be a non-empty string or integer, got {raw_id!r}")
                rec.id = str(raw_id)
        has_prompt = src.get(prompt_key) is not None
        has_messages = src.get(messages_key) is not None
        if has_prompt and has_messages:
            raise RecordError(f"record has both {prompt_key!r} and {messages_key!r}; give one")
        if has_messages:
            rec.messages = _check_messages(src[messages_key], messages_key)
        elif has_prompt:
            prompt = src[prompt_key]
            if not isinstance(prompt, str):
                raise RecordError(f"field {prompt_key!r} must be a string, got {type(prompt).__name__}")
            if not prompt.strip():
                raise RecordError(f"field {prompt_key!r} is empty")
            rec.prompt = prompt
        else:
            raise RecordError(f"field {prompt_key!r} (or {messages_key!r}) is missing or null")
        rec.max_tokens = _number(src, max_key, int, 1, 1 << 20, max_key)
        rec.keep = _number(src, "keep", float, 1e-9, 1.0, "keep")
        if rec.keep is not None and rec.keep <= 0:
            raise RecordError(f"field 'keep' must be in (0, 1], got {rec.keep}")
        rec.temperature = _number(src, "temperature", float, 0.0, 100.0, "temperature")
    except RecordError as e:
        rec.error = f"{where}: {e}"
    return rec
