"""`spcli run --engine vllm --ray` on a real local Ray cluster (tests/conftest.py `ray_cluster`, 2 CPUs): vLLM's
CPU build in one Ray actor, and in the Ray Data processor's base stage. Base: SmolLM2-135M-Instruct in float32;
speculator: conftest's tiny random Llama; the rows (kept indices, text) are the hf engine's in `spcli run`, as
tests/test_engines_vllm_run.py shows for vLLM outside Ray. One vLLM start inside an actor each (~60 s alone here, 7 min
beside the rest of `make test` on 2 cores), so both are `extended`: `make test-extended` runs them, `make test`
keeps their parts (spcli run --ray with the hf engine: tests/test_ray_run.py; the vLLM engine's run and the
processor's two stages on vLLM outside Ray: tests/test_engines_vllm_run.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from test_ray_run import assert_exactly_once, comparable
from test_job_run import read_outputs
from test_engines_vllm_run import COMMON, MAX_TOKENS, PRUNED, chat_rows, needs_vllm

pytestmark = [needs_vllm, pytest.mark.xdist_group("ray"), pytest.mark.extended]


def test_ray_vllm_actor_rows_are_the_hf_runs(tmp_path, tiny_dir, ray_cluster):
    rows = chat_rows()
    inputs = []
    for k, part in enumerate((rows[:3], rows[3:])):
        path = tmp_path / f"chat{k}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part) + ("{broken\n" if k else ""))
        inputs.append(str(path))
    common = [*inputs, "--speculator", str(tiny_dir), *COMMON, *PRUNED]
    hf = CliRunner().invoke(app, ["run", *common, "--out", str(tmp_path / "hf"), "--engine", "hf"])
    assert hf.exit_code == 0, hf.output
    res = CliRunner().invoke(app, ["run", *common, "--out", str(tmp_path / "ray"), "--engine", "vllm", "--ray",
                                   "--ray-workers", "1"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "done: 7 rows (1 failed" in res.output
    got = read_outputs(tmp_path / "ray")
    assert_exactly_once(got, 7)
    assert comparable(got) == comparable(read_outputs(tmp_path / "hf"))



def test_processor_on_vllm_gives_the_hf_runs_rows(tmp_path, tiny_dir, ray_cluster):
    """The Ray Data processor with engine='vllm' (two actors: the speculator alone, vLLM without a replica): the
    rows `spcli run --engine hf` gives, and a bad record an error row. Outside `make test` (`make test-extended`):
    a second vLLM start in a Ray actor costs minutes under the suite's load; the two stages are composed without Ray
    in tests/test_engines_vllm_run.py::test_the_processor_stages_on_vllm_give_the_rows_of_spcli_run."""
    import ray

    from spcli.ray import build_processor

    rows = chat_rows()
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hf = CliRunner().invoke(app, ["run", str(path), "--speculator", str(tiny_dir), *COMMON, *PRUNED, "--out",
                                  str(tmp_path / "hf"), "--engine", "hf"])
    assert hf.exit_code == 0, hf.output
    expected = comparable(read_outputs(tmp_path / "hf"))
    processor = build_processor(engine="vllm", model="smollm2-135m", speculator=str(tiny_dir), dtype="float32",
                                max_tokens=MAX_TOKENS, keep="0.3", min_tokens=16, max_prune_cost=float("inf"),
                                unit="chunk", min_free=0, batch_size=3, num_cpus=0.5)
    done = processor(ray.data.from_items([*rows, {"id": "bad", "text": "no prompt field"}])).take_all()
    by_id = comparable(done)
    assert by_id.pop("bad")[3].startswith("record bad: field ")
    assert by_id == expected
