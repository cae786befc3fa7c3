"""Input records: discovery of shards and validation of one raw record."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from spcli.config.run import FieldConfig
from spcli.config.scoring import AUTO
from spcli.errors import RecordError
from spcli.io.groups import group_key
from spcli.io.params import number, read_params
from spcli.io.shards import Shard, shard_kind

ROLES = ("system", "user", "assistant", "tool", "developer")
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
# OpenAI batch body fields that are no generation parameter and that spcli does not apply: each is refused by name
# unless it holds its no-op value (a body's SamplingParams names are read as a plain record's: spcli.io.params)
UNSUPPORTED_BODY = {
    "response_format": ((None, {"type": "text"}), "structured output is not applied"),
    "tools": ((None, []), "tool calls are not applied"),
    "tool_choice": ((None, "none"), "tool calls are not applied"),
    "top_logprobs": ((None, 0), "logprobs are set for the whole run with spcli run --logprobs N"),
}
log = logging.getLogger("spcli")


@dataclass
class Record:
    shard: int
    row: int  # 0-based line (JSONL) or row (Parquet) index in the shard
    id: str
    prompt: str | None = None
    messages: list[dict] | None = None
    max_tokens: int | None = None
    keep: float | str | None = None  # a fraction in (0, 1] or "auto"
    temperature: float | None = None
    seed: int | None = None  # its own sampling seed (else one derived from spcli run --seed and its id)
    sampling: dict[str, Any] = field(default_factory=dict)  # its own top_p, stop, ... (spcli.config.sampling.NAMES)
    unapplied: tuple[tuple[str, Any], ...] = ()  # (field, value): generation parameters spcli does not apply
    custom_id: str | None = None  # OpenAI batch request lines
    endpoint: str | None = None  # "/v1/chat/completions" (messages) | "/v1/completions" (prompt)
    protected: tuple[str, ...] = ()  # texts of the prompt never dropped (its instruction field), in order
    error: str | None = None  # set when the record is bad: it becomes an error row
    group_key: str | None = None  # records one after another with equal keys share a document (spcli.io.groups)
    is_context: bool = False  # read again only for its group's shared part: its row is committed already, or is
    # another reader's (a resume point, a Ray range's edge or --retry-failed inside a group); no row is made of it
    group_id: int | None = None  # --groups shard: its group's place in the shard's processing order (spcli.io.group_order)
    order_pos: int | None = None  # --groups shard: its place in that order (what a commit counts: the shard's next_row)
    sharing: str | None = None  # what its group did with it (spcli.stages.share.SHARING), for the run's end and inspect
    leads: bool = False  # the first member of its group: counts the group once


def where(shard_path: str, row: int, kind: str | None) -> str:
    """How errors name a record: `file:row N`, N counted from 0 as the default id `<stem>:N` and the output's `row`
    column count; a JSONL record adds its 1-based line as an editor shows it, `file:row 1 (line 2)`."""
    return f"{shard_path}:row {row}" if kind == "parquet" else f"{shard_path}:row {row} (line {row + 1})"


def bad_record(shard: Shard, row: int, message: str) -> Record:
    """An error row for a record that could not even be decoded."""
    return Record(shard.index, row, f"{shard.id_prefix}:{row}", error=f"{where(shard.path, row, shard_kind(shard.path))}: {message}")


def _check_messages(value: Any, field: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RecordError(f"field {field!r} must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RecordError(f"field {field!r}[{i}] must be an object with role and content")
        if m.get("role") not in ROLES:
            raise RecordError(f"field {field!r}[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI text parts: [{"type": "text", "text": ...}]
            m = value[i] = {**m, "content": _text_parts(content, f"{field}[{i}].content")}
        elif not isinstance(content, str):
            raise RecordError(f"field {field!r}[{i}].content must be a string or a list of text parts")
    return value


def _text_parts(parts: list, field: str) -> str:
    """OpenAI content parts -> one string; only text parts can be prefilled."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RecordError(f"field {field!r}[{j}] must be a text part {{\"type\": \"text\", \"text\": ...}}, "
                              f"got {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _keep(obj: dict) -> float | str | None:
    """A record's own keep: a number in (0, 1] or "auto" (OpenAI batch: `body.keep`)."""
    if obj.get("keep") == AUTO:
        return AUTO
    if isinstance(obj.get("keep"), str):
        raise RecordError(f"field 'keep' must be a number in (0, 1] or \"auto\", got {obj['keep']!r}")
    return number(obj, "keep", float, 0, 1, "keep", open_low=True)


def _openai_request(obj: dict, rec: Record) -> dict:
    """Check an OpenAI batch request line's envelope; returns its body."""
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, (str, int)) or isinstance(custom_id, bool) or str(custom_id) == "":
        raise RecordError(f"field 'custom_id' must be a non-empty string, got {custom_id!r}")
    rec.custom_id = rec.id = str(custom_id)
    method = obj.get("method", "POST")
    if method != "POST":
        raise RecordError(f"field 'method' must be POST, got {method!r}")
    rec.endpoint = obj.get("url") or "/v1/chat/completions"
    if rec.endpoint not in OPENAI_ENDPOINTS:
        raise RecordError(f"field 'url' must be /v1/chat/completions or /v1/completions, got {rec.endpoint!r}")
    body = obj["body"]
    if not isinstance(body, dict):
        raise RecordError(f"field 'body' must be an object, got {type(body).__name__}")
    if body.get("n", 1) != 1:
        raise RecordError(f"field 'body.n' must be 1 (one completion per request), got {body.get('n')!r}")
    if body.get("stream"):
        raise RecordError("field 'body.stream' must be false in a batch")
    for key, (no_ops, why) in UNSUPPORTED_BODY.items():
        if key in body and not any(body[key] == v and type(body[key]) is type(v) or body[key] is v for v in no_ops):
            raise RecordError(f"field 'body.{key}' is not supported ({body[key]!r}): {why}; remove it from the request")
    return body


def put_instruction(rec: Record, instruction, field: str, at: str = "after") -> None:
    """The record's instruction goes beside its text, a blank line between: `at` "after" its prompt, or after its
    last user message's content (the question right before the answer: what a small model answers best, and
    the speculator's last rows are the question); "before" its prompt or first user message's content (the
    speculator then reads it again after the prompt: --restate). It is protected (`spcli run --protect
    instruction`: never dropped, outside the keep budget)."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise RecordError(f"field {field!r} must be a non-empty string, got {instruction!r}")
    join = (lambda text: f"{text}\n\n{instruction}") if at == "after" else (lambda text: f"{instruction}\n\n{text}")
    if rec.prompt is not None:
        rec.prompt = join(rec.prompt)
    else:
        users = [i for i, m in enumerate(rec.messages) if m.get("role") == "user"]
        if not users:
            raise RecordError(f"field {field!r} needs a user message to go {at}, and 'messages' has none")
        which = users[-1] if at == "after" else users[0]
        rec.messages = [dict(m) for m in rec.messages]
        rec.messages[which]["content"] = join(rec.messages[which]["content"])
    rec.protected = (instruction,)


def to_record(obj: Any, shard: Shard, row: int, kind: str, fields: FieldConfig) -> Record:
    """Validate one decoded record; a problem becomes `Record.error` naming file, row and field."""
    rec = Record(shard.index, row, f"{shard.id_prefix}:{row}")
    try:
        if not isinstance(obj, dict):
            raise RecordError(f"record must be a JSON object, got {type(obj).__name__}")
        if "custom_id" in obj and "body" in obj:  # OpenAI batch request line
            src = _openai_request(obj, rec)
            prompt_key, messages_key = "prompt", "messages"
            max_key = "max_completion_tokens" if src.get("max_completion_tokens") is not None else "max_tokens"
            chat = rec.endpoint == "/v1/chat/completions"
            if chat and src.get("prompt") is not None and src.get("messages") is None:
                raise RecordError("a /v1/chat/completions request needs 'body.messages', not 'body.prompt'")
            if not chat and src.get("messages") is not None and src.get("prompt") is None:
                raise RecordError("a /v1/completions request needs 'body.prompt', not 'body.messages'")
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
            rec.endpoint = rec.endpoint or "/v1/chat/completions"
        elif has_prompt:
            prompt = src[prompt_key]
            if not isinstance(prompt, str):
                raise RecordError(f"field {prompt_key!r} must be a string, got {type(prompt).__name__}")
            if not prompt.strip():
                raise RecordError(f"field {prompt_key!r} is empty")
            rec.prompt = prompt
            rec.endpoint = rec.endpoint or "/v1/completions"
        else:
            raise RecordError(f"field {prompt_key!r} (or {messages_key!r}) is missing or null")
        rec.group_key = group_key(src, prompt_key, messages_key, fields.group)
        if src.get(fields.instruction) is not None:
            put_instruction(rec, src[fields.instruction], fields.instruction, fields.instruction_at)
        rec.max_tokens = number(src, max_key, int, 1, 1 << 20, max_key)
        rec.keep = _keep(src)
        read_params(src, rec, "body." if src is not obj else "")
    except RecordError as e:
        rec.error = f"{where(shard.path, row, kind)}: {e}"
    return rec


def too_long_record(shard: Shard, row: int, size: int, limit: int, found: tuple[str, bool] | None) -> Record:
    """The error row of a record over --max-record-bytes, named by its own id where it has one."""
    rec = bad_record(shard, row, f"record is {size} bytes, more than --max-record-bytes {limit}")
    if found is not None:
        rec.id, is_custom = found
        rec.custom_id = rec.id if is_custom else None
    return rec
