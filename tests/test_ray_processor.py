"""spcli.ray.build_processor on a real local Ray cluster (tests/conftest.py `ray_cluster`) and Ray Data: the same
rows as `spcli run` on the same records (ids, kept indices, text in float32); bad records become error rows."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from test_ray_run import ARGS, comparable
from test_job_run import read_outputs

pytestmark = pytest.mark.xdist_group("ray")  # one worker: the Ray tests share the session's cluster

FLAGS = dict(keep="0.3", min_tokens=16, max_prune_cost=float("inf"), min_free=0, unit="chunk", keep_last=8, chunk=8, max_tokens=4, dtype="float32",
             lookahead=2, speculator="self:2")


def records() -> list[dict]:
    good = [{"id": f"d{i}", "prompt": " ".join(f"word{(i * 5 + j) % 40}" for j in range(50 + 11 * i))} for i in range(5)]
    good.append({"id": "chat", "messages": [{"role": "user", "content": "Summarise: " + "alpha beta gamma " * 20}],
                 "keep": 0.5})
    good.append({"id": "sampled", "prompt": "Sampled: " + "delta epsilon " * 30, "temperature": 1.0, "seed": 3,
                 "top_k": 40, "repetition_penalty": 1.3})  # the settings travel from stage 1 to stage 2
    bad = [{"id": "no-prompt", "text": "the prompt field is missing"},
           {"id": "bad-max", "prompt": "a prompt whose max_tokens is out of range", "max_tokens": -3}]
    return good[:3] + bad[:1] + good[3:] + bad[1:]


def test_processor_rows_match_spcli_run(tmp_path, tiny_dir, write_jsonl, ray_cluster):
    import ray

    from spcli.ray import build_processor

    recs = records()
    out = tmp_path / "plain"
    res = CliRunner().invoke(app, ["run", str(write_jsonl(recs)), "--out", str(out), "--model", str(tiny_dir), *ARGS])
    assert res.exit_code == 0, res.output
    expected = comparable(read_outputs(out))
    processor = build_processor(model=str(tiny_dir), batch_size=3, num_cpus=0.5, **FLAGS)
    rows = processor(ray.data.from_items(recs)).take_all()
    assert len(rows) == len(recs)
    got = comparable(rows)
    assert set(got) == {r["id"] for r in recs}
    for key in ("no-prompt", "bad-max"):  # error rows: the same problem, named by the record's id, not a file line
        assert got[key][3].startswith(f"record {key}: field ") and expected[key][3].split(": ", 1)[1] == got[key][3].split(": ", 1)[1]
    assert {k: v for k, v in got.items() if v[3] is None} == {k: v for k, v in expected.items() if v[3] is None}
    assert got["chat"][2] > 0 and len(got["chat"][1]) < got["chat"][2]


def test_a_prepare_stage_without_base_weights_keeps_what_the_whole_engine_keeps(tiny_dir):
    """engine='vllm' processors prepare on an hf engine without the base's weights (a `self` speculator reads the
    first layers from the checkpoint); the vLLM side is in tests/test_vllm_ray.py."""
    from spcli.api import run_config
    from spcli.job.batch import prepared
    from spcli.engines.hf.engine import HFEngine
    from spcli.io.records import Record

    cfg = run_config(["-"], "-", model=str(tiny_dir), **FLAGS)
    recs = [Record(0, i, r["id"], prompt=r["prompt"]) for i, r in enumerate(records()) if "prompt" in r][:3]
    whole, alone = HFEngine(cfg), HFEngine(cfg, with_base=False)
    assert alone.stack.base is None and alone.stack.speculator_layers == 2
    reqs = [prepared(e, recs, e.cfg, {0: "x"}) for e in (whole, alone)]
    assert [r.kept.tolist() for r in reqs[0]] == [r.kept.tolist() for r in reqs[1]]
    assert all(0 < len(r.kept) < r.num_prompt_tokens for r in reqs[1])
    with pytest.raises(RuntimeError, match="without its base model"):
        alone.generate([])
