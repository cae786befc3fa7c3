"""A record's generation parameters: the fields named as vLLM's SamplingParams (spcli.config.sampling), read from a
plain record, a Parquet row or an OpenAI batch request's body.

Applied: max_tokens (an OpenAI body's max_completion_tokens too), temperature, seed, top_p, top_k, min_p,
presence_penalty, frequency_penalty, repetition_penalty, stop; each overrides the job's flag for its record, and a
bad value is an error naming the field. Any other SamplingParams name that holds a value (not null, not its no-op)
is kept in `Record.unapplied`: the record becomes an error row naming it and the engine (spcli.stages.prepare), never
a row generated without it; so is any OpenAI or vLLM request name spcli does not apply (best_of, response_format,
guided_*, truncate_prompt_tokens, ...: spcli.config.request_names.REFUSED; a few everyday names such as tools only
in an OpenAI body, data in a plain record). A plain record's max_completion_tokens
is its max_tokens, as a body's. Fields of other names are data (`spcli run --pass-through`).
"""

from __future__ import annotations

import math
from typing import Any

from spcli.config import request_names, sampling
from spcli.errors import RecordError

UNAPPLIED_NAMES = tuple(n for n in sampling.SAMPLING_PARAMS if n not in sampling.APPLIED)  # max_tokens: applied


def number(obj: dict, key: str, kind: type, lo: float, hi: float, field: str, open_low: bool = False) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if bad_type or (kind is int and int(value) != value):
        raise RecordError(f"field {field!r} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if not ((lo < value) if open_low else (lo <= value)) or not value <= hi:
        raise RecordError(f"field {field!r} must be in {'(' if open_low else '['}{lo}, {hi}], got {value!r}")
    return kind(value)


def read_params(src: dict, rec, prefix: str = "") -> None:
    """Set rec.temperature, .seed, .sampling (the record's own values, by name) and .unapplied from `src` (a
    record, or an OpenAI body: `prefix` "body." names its fields); a bad value raises RecordError. max_tokens is
    the caller's (an OpenAI body's may be max_completion_tokens)."""
    rec.temperature = number(src, "temperature", float, 0, 100, "temperature")
    own = {}
    for name in (*sampling.NAMES, "seed"):
        if src.get(name) is None:
            continue
        value, problem = sampling.check(name, src[name])
        if problem is not None:
            raise RecordError(f"field {prefix + name!r} {problem}")
        own[name] = value
    rec.seed = own.pop("seed", None)
    rec.sampling = own
    if not prefix and src.get("max_completion_tokens") is not None:  # OpenAI's newer name, as in a body
        rec.max_tokens = number(src, "max_completion_tokens", int, 1, 1 << 20, "max_completion_tokens")
    rec.unapplied = (
        tuple((prefix + n, src[n]) for n in UNAPPLIED_NAMES if n in src and not sampling.is_no_op(n, src[n]))
        + tuple((prefix + n, src[n]) for n in request_names.refused_names(bool(prefix))
                if n in src and not request_names.is_no_op(n, src[n])))
