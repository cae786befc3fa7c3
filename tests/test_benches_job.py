"""benches/job.py's own parts on real inputs: the needle shard, a real `spcli run` directory read back, the answers
compared, the ratios and the FLOP limit (the whole bench starts vLLM three times: minutes here, run by hand)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from test_benches import REPO

sys.path.insert(0, str(REPO / "benches"))
import job  # noqa: E402


@pytest.fixture(scope="module")
def shard_and_answers(tmp_path_factory, tiny_dir):
    shard = tmp_path_factory.mktemp("job") / "prompts.jsonl"
    return shard, job.make_shard(str(tiny_dir), 3, 300, 0, shard)


def test_the_shard_is_needle_records_whose_answers_are_in_their_prompts(shard_and_answers):
    shard, answers = shard_and_answers
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    assert [r["id"] for r in rows] == sorted(answers) and len(rows) == 3
    for r in rows:
        (number,) = answers[r["id"]]
        assert re.fullmatch(r"\d{7}", number) and number in r["messages"][0]["content"]


def test_a_real_spcli_run_is_read_back_and_compared(tmp_path, tiny_dir, shard_and_answers):
    shard, answers = shard_and_answers
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spcli", "run", str(shard), "--out", str(out), "--model", str(tiny_dir),
                           "--engine", "hf", "--keep", "0.3", "--max-tokens", "4", "--dtype", "float32",
                           "--speculator", "self:2", "--lookahead", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs, fingerprint = job.spcli_outputs(out)
    assert sorted(outputs) == sorted(answers) and all(isinstance(o, str) for o in outputs.values())
    assert fingerprint["dtype"] == "float32"

    assert job.compare(outputs, outputs, answers) == {"agree": 3, "right": 0, "errors": 0, "rows": 3}  # random weights
    said = {i: f"The special magic number is {a[0]}." for i, a in answers.items()}
    first, second, third = sorted(answers)
    said[third] = "The special magic number is 1234567."  # wrong
    assert job.compare(said, outputs, answers) == {"agree": 0, "right": 2, "errors": 0, "rows": 3}
    with_error = {**said, first: None}  # an error row: neither agrees nor is right, even against itself
    assert job.compare(with_error, with_error, answers) == {"agree": 2, "right": 1, "errors": 1, "rows": 3}


def test_ratios_and_the_share_of_the_limit(shard_and_answers):
    _, answers = shard_and_answers
    ref = {i: "x" for i in answers}
    runs = [{"name": job.PLAIN, "keep": 1.0, "dtype": "bfloat16", "wall_s": 30.0, "outputs": ref},
            {"name": "spcli hf", "keep": 0.1, "dtype": "bfloat16", "wall_s": 12.0, "outputs": ref},
            {"name": "spcli vllm @1", "keep": 1.0, "dtype": "bfloat16", "wall_s": 33.0, "outputs": {}}]
    plain, hf, keep1 = job.summarize(runs, answers, limit=1.6)
    assert plain["speedup"] == 1.0 and plain["limit"] == 1.0 and plain["agree"] == 3
    assert hf["speedup"] == 2.5 and hf["rows_per_s"] == 3 / 12.0 and hf["share_of_limit"] == 2.5 / 1.6
    assert abs(keep1["speedup"] - 30 / 33) < 1e-12 and keep1["limit"] == 1.0 and keep1["errors"] == 3
    text = job.table([plain, hf, keep1])
    assert "| spcli hf | 0.1 | bfloat16 | 12.0 | 0.250 | 2.50x | 1.60x | 156% | 3/3 | 0/3 |" in text


def test_the_limit_is_the_one_spcli_plan_prints():
    limit = job.flop_limit("smollm2-135m", None, 1536, 0.1, 8, 16)
    proc = subprocess.run([sys.executable, "-m", "spcli", "plan", "--model", "smollm2-135m", "--length", "1536",
                           "--keep", "0.1", "--batch", "8", "--tp", "1", "--max-tokens", "16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = re.search(r"placement workers\s+([\d.]+)x", proc.stdout)
    assert printed and float(printed.group(1)) == round(limit, 2), proc.stdout
    assert 1.0 < limit < job.flop_limit("smollm2-135m", None, 1536, 0.05, 8, 16)  # less kept, higher limit
    assert job.flop_limit("smollm2-135m", None, 1536, 1.0, 8, 16) is None  # no speculator at keep 1
