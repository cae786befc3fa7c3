"""Examples from the user's shards: the same readers as `spcli run`, plus the optional `answer` field."""

from __future__ import annotations

import logging

import orjson
import pyarrow.parquet as pq

from spcli.config.run import FieldConfig
from spcli.errors import InputError
from spcli.evaluate.tasks import Example
from spcli.io.read import read_records
from spcli.io.shards import Shard, discover, shard_kind

log = logging.getLogger(__name__)


def _answers(shard: Shard) -> dict[int, tuple[str, ...]]:
    """Row -> reference answers: `answer` as a string, or a list of acceptable alternatives."""
    raw: dict[int, object] = {}
    if shard_kind(shard.path) == "parquet":
        pf = pq.ParquetFile(shard.path)
        if "answer" in pf.schema_arrow.names:
            raw = dict(enumerate(pf.read(columns=["answer"]).column("answer").to_pylist()))
    elif shard_kind(shard.path) == "jsonl":
        with open(shard.path, "rb") as f:
            for row, line in enumerate(f):
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # the record reader reports it
                if isinstance(obj, dict) and obj.get("answer") is not None:
                    raw[row] = obj["answer"]
    out = {}
    for row, value in raw.items():
        if isinstance(value, str):
            out[row] = (value,)
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            out[row] = tuple(value)
        elif value is not None:
            raise InputError(f"{shard.path}: row {row}: field 'answer' must be a string or a list of strings")
    return out


def read_examples(inputs: tuple[str, ...], limit: int, fields: FieldConfig = FieldConfig()) -> list[Example]:
    """The first `limit` good records of the inputs as examples; bad records are logged and skipped."""
    examples: list[Example] = []
    for shard in discover(inputs):
        answers = _answers(shard)
        for rec in read_records(shard, fields):
            if rec.error is not None:
                log.warning("skipped: %s", rec.error)
                continue
            examples.append(Example(
                rec.id, "input", messages=rec.messages, prompt=rec.prompt, answers=answers.get(rec.row, ()),
                max_tokens=rec.max_tokens or 24, protected=rec.protected,
            ))
            if len(examples) >= limit:
                return examples
    return examples
