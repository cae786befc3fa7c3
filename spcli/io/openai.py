"""OpenAI batch output lines (`--output-format openai`).

One line per request, as the OpenAI Batch API writes them:

    {"id": "batch_req_...", "custom_id": "...",
     "response": {"status_code": 200, "request_id": "req_...", "body": <chat.completion | text_completion>},
     "error": null}

A bad request gets status 400 (a model failure 500), `body.error` as the API shapes it, and the same
message in the top-level `error` ({code, message}) so a reader can filter on one field. The spcli
fields (kept indices, keep rate, timings) go to the Parquet side output, keyed by `custom_id`.
Ids are derived from the request's place in the input, so a resumed run writes the same lines.
"""

from __future__ import annotations

import hashlib
import time

import orjson

from spcli.io.schema import RowResult

CHAT = "/v1/chat/completions"


def _digest(r: RowResult) -> str:
    return hashlib.sha256(f"{r.shard}\0{r.row}\0{r.id}".encode("utf-8", "surrogatepass")).hexdigest()[:24]


def chat_logprobs(r: RowResult) -> dict | None:
    """choices[0].logprobs of a chat.completion: {content: [{token, logprob, bytes, top_logprobs}]}."""
    if r.logprobs is None:
        return None
    entry = lambda t: {"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode("utf-8", "surrogatepass"))}
    return {"content": [entry(t) | {"top_logprobs": [entry(a) for a in t["top"]]} for t in r.logprobs], "refusal": None}


def completion_logprobs(r: RowResult) -> dict | None:
    """choices[0].logprobs of a text_completion: {tokens, token_logprobs, top_logprobs, text_offset}."""
    if r.logprobs is None:
        return None
    offsets, at = [], 0
    for t in r.logprobs:
        offsets.append(at)
        at += len(t["token"])
    return {"tokens": [t["token"] for t in r.logprobs], "token_logprobs": [t["logprob"] for t in r.logprobs],
            "top_logprobs": [{a["token"]: a["logprob"] for a in t["top"]} for t in r.logprobs], "text_offset": offsets}


def response_body(r: RowResult, model: str, created: int) -> dict:
    """A chat.completion (chat requests) or text_completion (completion requests) with usage."""
    usage = {"prompt_tokens": r.num_prompt_tokens, "completion_tokens": r.num_output_tokens,
             "total_tokens": r.num_prompt_tokens + r.num_output_tokens}
    if r.endpoint == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": r.output}, "logprobs": chat_logprobs(r),
                  "finish_reason": r.finish_reason}
        return {"id": f"chatcmpl-{_digest(r)}", "object": "chat.completion", "created": created, "model": model,
                "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": r.output, "logprobs": completion_logprobs(r), "finish_reason": r.finish_reason}
    return {"id": f"cmpl-{_digest(r)}", "object": "text_completion", "created": created, "model": model,
            "choices": [choice], "usage": usage}


def response_line(r: RowResult, model: str, created: int) -> dict:
    digest = _digest(r)
    line = {"id": f"batch_req_{digest}", "custom_id": r.custom_id if r.custom_id is not None else r.id}
    if r.error is None:
        line["response"] = {"status_code": 200, "request_id": f"req_{digest}", "body": response_body(r, model, created)}
        line["error"] = None
        return line
    server = ": model failed: " in r.error
    code, kind = (500, "server_error") if server else (400, "invalid_request_error")
    line["response"] = {"status_code": code, "request_id": f"req_{digest}",
                        "body": {"error": {"message": r.error, "type": kind, "param": None, "code": None}}}
    line["error"] = {"code": kind, "message": r.error}
    return line


def response_lines(rows: list[RowResult], model: str) -> bytes:
    created = int(time.time())
    return b"".join(orjson.dumps(response_line(r, model, created)) + b"\n" for r in rows)
