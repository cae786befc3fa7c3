"""OpenAI batch format: request lines in, response lines + a Parquet side output out (spcli/io/openai.py)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from spcli.errors import Interrupted
from spcli.io.manifest import read_manifests
from spcli.job.progress import Progress
from spcli.job.run import run
from test_bad_input import cli
from test_job_resume import StopAfter, argv, config


def requests() -> list[dict]:
    text = "Summarise the following notes about the quarterly review of the northern office. " * 3
    return [
        {"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "any", "messages": [{"role": "user", "content": text}], "max_tokens": 3}},
        {"custom_id": "cmpl-1", "method": "POST", "url": "/v1/completions",
         "body": {"model": "any", "prompt": text, "max_tokens": 2, "temperature": 0}},
        {"custom_id": "chat-keep", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "any", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                  "keep": 1.0}},
        {"custom_id": "bad-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "any", "messages": "hello"}},
        {"custom_id": "cmpl-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": text + " again", "max_completion_tokens": 1}},
    ]


def responses(out) -> list[dict]:
    lines = []
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            assert len(shard["openai_parts"]) == len(shard["parts"])
            for name in shard["openai_parts"]:
                lines += [json.loads(x) for x in (out / name).read_text().splitlines()]
    return lines


def side_rows(out) -> dict[str, dict]:
    rows = {}
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            for name in shard["parts"]:
                assert name.endswith(".parquet")
                rows.update({r["custom_id"]: r for r in pq.read_table(out / name).to_pylist()})
    return rows


@pytest.fixture()
def batch_file(write_jsonl):
    return write_jsonl(requests(), "batch.jsonl")


def test_openai_round_trip(tmp_path, tiny_dir, batch_file, capsys):
    out = tmp_path / "out"
    code, stdout, err = cli(argv(batch_file, out, tiny_dir, "--output-format", "openai", "--keep", "0.3"), capsys)
    assert code == 0, err
    assert "done: 5 rows (1 failed: " in stdout
    lines = responses(out)
    side = side_rows(out)
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in requests()], "one response per request, in order"
    assert sorted(side) == sorted(x["custom_id"] for x in lines)
    assert len({x["id"] for x in lines}) == 5 and all(x["id"].startswith("batch_req_") for x in lines)

    chat, cmpl, keep_all, bad, cmpl2 = lines
    assert chat["error"] is None and chat["response"]["status_code"] == 200
    assert chat["response"]["request_id"].startswith("req_")
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == str(tiny_dir)
    assert isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant" and choice["logprobs"] is None
    s = side["chat-1"]
    assert choice["message"]["content"] == s["output"] and choice["finish_reason"] == s["finish_reason"]
    assert body["usage"] == {"prompt_tokens": s["num_prompt_tokens"], "completion_tokens": s["num_output_tokens"],
                             "total_tokens": s["num_prompt_tokens"] + s["num_output_tokens"]}
    assert s["num_output_tokens"] <= 3 and s["keep_rate"] < 0.5 and s["kept_indices"]

    body = cmpl["response"]["body"]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == side["cmpl-1"]["output"] and "message" not in body["choices"][0]
    assert side["cmpl-2"]["num_output_tokens"] <= 1

    s = side["chat-keep"]
    assert s["num_kept_tokens"] == s["num_prompt_tokens"] and s["keep_rate"] == 1.0, "body.keep overrides --keep"
    assert s["speculate_s"] == 0.0

    message = f"{batch_file}:row 3 (line 4): field 'messages' must be a non-empty list of {{role, content}} objects"
    assert bad["response"] == {"status_code": 400, "request_id": bad["response"]["request_id"],
                               "body": {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}}
    assert bad["error"] == {"code": "invalid_request_error", "message": message}
    assert side["bad-1"]["error"] == message and side["bad-1"]["output"] is None
    assert cmpl2["error"] is None


def test_openai_output_resumes_without_repeating_a_line(tmp_path, tiny_dir, batch_file):
    ref = tmp_path / "ref"
    run(config(batch_file, ref, tiny_dir, output_format="openai"), Progress(quiet=True))
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        run(config(batch_file, out, tiny_dir, output_format="openai"), StopAfter(1))
    assert [x["custom_id"] for x in responses(out)] == ["chat-1", "cmpl-1"]
    run(config(batch_file, out, tiny_dir, output_format="openai"), Progress(quiet=True))

    def stable(lines):
        for x in lines:
            if x["response"]["status_code"] == 200:
                x["response"]["body"].pop("created")
        return lines

    assert stable(responses(out)) == stable(responses(ref))
    names = sorted(p.name for p in out.glob("part-*"))
    assert names == [f"part-00000-{i:05d}.{ext}" for i in range(3) for ext in ("openai.jsonl", "parquet")]


def test_logprobs_in_openai_shape_and_the_side_output(tmp_path, tiny_dir, batch_file, capsys):
    out = tmp_path / "out"
    code, _, err = cli(argv(batch_file, out, tiny_dir, "--output-format", "openai", "--keep", "0.3", "--logprobs", "2"), capsys)
    assert code == 0, err
    by_id = {line["custom_id"]: line for line in responses(out)}
    side = side_rows(out)
    chat = by_id["chat-1"]["response"]["body"]["choices"][0]
    content = chat["logprobs"]["content"]
    assert len(content) == side["chat-1"]["num_output_tokens"] > 0
    for entry, col in zip(content, side["chat-1"]["logprobs"]):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["token"] == col["token"] and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
        assert entry["logprob"] <= 0 and abs(entry["logprob"] - col["logprob"]) < 1e-6
    cmpl = by_id["cmpl-1"]["response"]["body"]["choices"][0]["logprobs"]
    assert len(cmpl["tokens"]) == len(cmpl["token_logprobs"]) == len(cmpl["top_logprobs"]) == side["cmpl-1"]["num_output_tokens"]
    assert "".join(cmpl["tokens"]) == by_id["cmpl-1"]["response"]["body"]["choices"][0]["text"]
    assert all(len(top) <= 2 for top in cmpl["top_logprobs"])
    assert side["bad-1"]["logprobs"] is None


def test_logprobs_off_writes_none(tmp_path, tiny_dir, batch_file, capsys):
    out = tmp_path / "out"
    code, _, err = cli(argv(batch_file, out, tiny_dir, "--output-format", "openai", "--keep", "1.0"), capsys)
    assert code == 0, err
    assert all(line["response"]["body"].get("choices", [{}])[0].get("logprobs") is None for line in responses(out))
    assert all(r["logprobs"] is None for r in side_rows(out).values())
