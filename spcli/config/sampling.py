"""Sampling settings as vLLM 0.32's SamplingParams names and defines them: what `spcli run`'s flags set for a
job, and a record (a plain record's field, a Parquet column, an OpenAI batch body's field) for itself.

    temperature, seed            on the request itself (PrunedRequest.temperature, .seed)
    top_p, top_k, min_p          filters of a sampled row (temperature > 0); a greedy row ignores them, as in vLLM
    presence_penalty, frequency_penalty, repetition_penalty   change the logits of greedy and sampled rows alike
    stop                         strings that end the output; the string is not output, finish_reason "stop"

The vllm engine hands them to SamplingParams (spcli/engines/vllm/driver/base_pass.py); the hf engine applies them
as vLLM's sampler does (spcli/engines/hf/sampling.py), so a record gives the same output on both engines at
temperature 0; both cut a row's text at its first stop string alike (spcli/engines/stop_strings.py). Any other
SamplingParams name in a record is a generation parameter spcli does not apply: an error row, never ignored
(`unapplied`). Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from spcli.config.request_names import REFUSED

APPLIED = ("temperature", "max_tokens", "seed", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "stop")
# vLLM 0.32's SamplingParams fields (tests/test_engines_vllm_sampling.py checks the list against vLLM's own)
SAMPLING_PARAMS = (
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "watermarking", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
    "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "flat_logprobs", "detokenize",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind",
    "stream_interval", "skip_clone", "output_text_buffer_length", "structured_outputs", "logit_bias",
    "allowed_token_ids", "extra_args", "bad_words", "skip_reading_prefix_cache", "thinking_token_budget",
    "repetition_detection", "routed_experts_prompt_start", "trace_decode_token_ids",
)
# values of a parameter spcli does not apply that change nothing (null always does): accepted, as vLLM's defaults
NO_OP = {"n": (1,), "ignore_eos": (False,), "min_tokens": (0,), "detokenize": (True,), "skip_special_tokens": (True,),
         "spaces_between_special_tokens": (True,), "include_stop_str_in_output": (False,), "stop_token_ids": ([],),
         "bad_words": ([],), "logit_bias": ({},), "allowed_token_ids": ([],), "logprobs": (0, False),
         "prompt_logprobs": (0, False)}
WHY = {"n": "one output per record", "logprobs": "logprobs are set for the whole run: spcli run --logprobs N",
       **{name: why for name, (_, why) in REFUSED.items()}}  # the OpenAI and vLLM request names refused
MAX_SEED = 1 << 63
VLLM_MAX_TEMPERATURE = 2.0  # vLLM 0.32 refuses a higher one (SamplingParams._verify_args): an error row there


@dataclass(frozen=True)
class Sampling:
    """A request's filters, penalties and stop strings (vLLM's defaults: none of them applied)."""

    top_p: float = 1.0  # (0, 1]: the smallest set of most likely tokens whose probability reaches top_p
    top_k: int = 0  # the k most likely tokens; 0 (or -1): all
    min_p: float = 0.0  # [0, 1]: tokens less likely than min_p x the most likely one's probability are dropped
    presence_penalty: float = 0.0  # [-2, 2]: subtracted from a token's logit once it is in the output
    frequency_penalty: float = 0.0  # [-2, 2]: subtracted per time it is in the output
    repetition_penalty: float = 1.0  # > 0: a token of the prompt (its kept tokens) or output: logit / p if > 0, else x p
    stop: tuple[str, ...] = ()  # non-empty strings; the output ends before the first one generated

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def has_filters(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


DEFAULT = Sampling()
NAMES = tuple(f.name for f in fields(Sampling))


def _in(lo: float, hi: float, open_low: bool = False) -> Callable[[float], bool]:
    return lambda v: (lo < v if open_low else lo <= v) and v <= hi


# name -> (integer?, the check, the range as a message says it)   (vLLM's SamplingParams._verify_args)
RANGES: dict[str, tuple[bool, Callable[[float], bool], str]] = {
    "top_p": (False, _in(0.0, 1.0, open_low=True), "in (0, 1]"),
    "top_k": (True, lambda v: v >= -1, "-1, 0 (all tokens) or >= 1"),
    "min_p": (False, _in(0.0, 1.0), "in [0, 1]"),
    "presence_penalty": (False, _in(-2.0, 2.0), "in [-2, 2]"),
    "frequency_penalty": (False, _in(-2.0, 2.0), "in [-2, 2]"),
    "repetition_penalty": (False, lambda v: 0.0 < v, "> 0"),
    "seed": (True, lambda v: 0 <= v < MAX_SEED, f"in [0, {MAX_SEED - 1}]"),
}


def check(name: str, value: Any) -> tuple[Any, str | None]:
    """(the value as spcli holds it, None) or (None, what is wrong with it: "must be ..., got ...")."""
    if name == "stop":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
            return None, f"must be a non-empty string or a list of them, got {value!r}"
        return tuple(dict.fromkeys(items)), None
    is_int, ok, allowed = RANGES[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or (is_int and int(value) != value):
        return None, f"must be a{'n integer' if is_int else ' number'}, got {value!r}"
    if not ok(value):
        return None, f"must be {allowed}, got {value!r}"
    if name == "top_k":
        return max(0, int(value)), None  # -1 and 0 both mean every token
    return (int(value) if is_int else float(value)), None


def is_no_op(name: str, value: Any) -> bool:
    """Whether a parameter spcli does not apply holds a value that changes nothing."""
    return value is None or any(value == v and type(value) is type(v) for v in NO_OP.get(name, ()))


def unapplied_message(unapplied: tuple[tuple[str, Any], ...], engine: str) -> str:
    """The error of a record that sets generation parameters spcli does not apply: each named, and the engine."""
    named = ", ".join(f"{label!r} ({value!r}{'; ' + WHY[label.split('.')[-1]] if label.split('.')[-1] in WHY else ''})"
                      for label, value in unapplied)
    what = "fields {} are generation parameters" if len(unapplied) > 1 else "field {} is a generation parameter"
    return (f"{what.format(named)} --engine {engine} does not apply (it applies {', '.join(APPLIED)}); remove "
            f"{'them' if len(unapplied) > 1 else 'it'} from the record")


def describe(temperature: float, seed: int, sampling: Sampling) -> dict | None:
    """A row's `sampling` column: every setting it was generated with, where one differs from greedy decoding
    without filters, penalties or stop strings (None: that default); the seed only where it sampled."""
    if temperature == 0.0 and sampling == DEFAULT:
        return None
    d = {"temperature": temperature, "seed": seed if temperature > 0 else None}
    return d | {name: getattr(sampling, name) for name in NAMES} | {"stop": list(sampling.stop)}
