"""The one output schema, shared by every engine and output format."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass
class RowResult:
    id: str
    shard: str  # input shard path
    row: int  # row/line index in the shard
    output: str | None = None
    finish_reason: str | None = None  # "stop" | "length"; None on error
    num_prompt_tokens: int = 0
    num_kept_tokens: int = 0
    num_output_tokens: int = 0
    kept_indices: list[int] = field(default_factory=list)  # ascending indices into the prompt's token ids
    ttft_s: float | None = None  # batch start -> this row's first token (speculation included; vllm: not vLLM's start-up)
    speculate_s: float = 0.0  # this row's speculator prefill + look-ahead + scoring
    prefill_s: float = 0.0  # its batch's base prefill
    decode_s: float = 0.0  # its batch's decode
    error: str | None = None
    importance: list[float] | None = None  # with --save-scores: one per prompt token
    custom_id: str | None = None  # OpenAI batch requests
    endpoint: str | None = None
    logprobs: list[dict] | None = None  # with --logprobs N: per generated token, see LOGPROB below
    group: str | None = None  # the document group whose kept prefix this row shares (its first record's id), if any
    group_size: int | None = None  # that group's records (spcli.stages.share)
    sampling: dict | None = None  # the settings it was generated with, where not greedy and plain: SAMPLING below
    # not written (the progress line's numbers): its group's shared prefix and the kept positions in it, and whether it
    # is the group's first member (which counts the document once)
    shared_len: int = 0
    shared_kept: int = 0
    leads: bool = False

    @property
    def keep_rate(self) -> float | None:
        return self.num_kept_tokens / self.num_prompt_tokens if self.num_prompt_tokens else None


_TOKEN = [pa.field("token_id", pa.int32()), pa.field("token", pa.string()), pa.field("logprob", pa.float32())]
# one generated token: its id, text and logprob, and the top N alternatives at its step, best first
LOGPROB = pa.struct(_TOKEN + [pa.field("top", pa.list_(pa.struct(_TOKEN)))])
# a row's sampling settings (its record's own, else the job's: spcli.config.sampling.describe); null for a row decoded
# greedily without penalties or stop strings, and for an error row. seed: the row's, where it sampled
SAMPLING = pa.struct([
    pa.field("temperature", pa.float64()), pa.field("seed", pa.int64()), pa.field("top_p", pa.float64()),
    pa.field("top_k", pa.int32()), pa.field("min_p", pa.float64()), pa.field("presence_penalty", pa.float64()),
    pa.field("frequency_penalty", pa.float64()), pa.field("repetition_penalty", pa.float64()),
    pa.field("stop", pa.list_(pa.string())),
])


def output_schema(save_scores: bool) -> pa.Schema:
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("shard", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("output", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("num_prompt_tokens", pa.int32()),
        pa.field("num_kept_tokens", pa.int32()),
        pa.field("keep_rate", pa.float32()),
        pa.field("num_output_tokens", pa.int32()),
        pa.field("kept_indices", pa.list_(pa.int32())),
        pa.field("ttft_s", pa.float64()),
        pa.field("speculate_s", pa.float64()),
        pa.field("prefill_s", pa.float64()),
        pa.field("decode_s", pa.float64()),
        pa.field("error", pa.string()),
        pa.field("custom_id", pa.string()),  # OpenAI batch requests: the key of the response lines
        pa.field("logprobs", pa.list_(LOGPROB)),  # null unless --logprobs N
        pa.field("group", pa.string()),  # null unless the row shared its document with a group (--groups)
        pa.field("group_size", pa.int32()),
        pa.field("sampling", SAMPLING),
    ]
    if save_scores:
        fields.append(pa.field("importance", pa.list_(pa.float32())))
    return pa.schema(fields)


def to_dict(r: RowResult, save_scores: bool) -> dict:
    d = {
        "id": r.id, "shard": r.shard, "row": r.row, "output": r.output, "finish_reason": r.finish_reason,
        "num_prompt_tokens": r.num_prompt_tokens, "num_kept_tokens": r.num_kept_tokens,
        "keep_rate": r.keep_rate, "num_output_tokens": r.num_output_tokens,
        "kept_indices": r.kept_indices, "ttft_s": r.ttft_s, "speculate_s": r.speculate_s,
        "prefill_s": r.prefill_s, "decode_s": r.decode_s, "error": r.error, "custom_id": r.custom_id,
    }
    if r.logprobs is not None:  # JSONL carries the key only when asked
        d["logprobs"] = r.logprobs
    if r.group is not None:  # and the group only where there is one
        d["group"], d["group_size"] = r.group, r.group_size
    if r.sampling is not None:  # likewise: only rows sampled, filtered, penalised or with stop strings
        d["sampling"] = r.sampling
    if save_scores:
        d["importance"] = r.importance
    return d


def to_table(rows: list[RowResult], save_scores: bool) -> pa.Table:
    schema = output_schema(save_scores)
    return pa.Table.from_pylist([to_dict(r, save_scores) for r in rows], schema=schema)
