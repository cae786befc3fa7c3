"""Sampling settings (spcli/config/sampling.py): their checks, the output column, the message of a parameter spcli
does not apply, and the fingerprint of a job without any."""

from __future__ import annotations

import pytest

from spcli.config.run import GenerateConfig, RunConfig
from spcli.config.sampling import DEFAULT, Sampling, check, describe, is_no_op, unapplied_message
from spcli.errors import ConfigError


def test_checks_normalise_as_vllm_reads_them():
    assert check("top_k", -1) == (0, None) and check("top_k", 3) == (3, None)
    assert check("stop", "END") == (("END",), None) and check("stop", ["a", "b", "a"]) == (("a", "b"), None)
    assert check("top_p", 1) == (1.0, None) and check("seed", 2**63 - 1) == (2**63 - 1, None)
    assert check("top_p", True)[1] == "must be a number, got True"
    assert check("min_p", float("nan"))[1] == "must be a number, got nan"
    assert check("seed", 1.5)[1] == "must be an integer, got 1.5"


def test_the_sampling_column_holds_a_row_s_settings_where_they_are_not_plain_greedy():
    assert describe(0.0, 123, DEFAULT) is None
    d = describe(0.0, 123, Sampling(stop=("x",)))
    assert d["seed"] is None and d["stop"] == ["x"] and d["top_p"] == 1.0, "a greedy row's seed is unused"
    assert describe(0.7, 5, Sampling(top_k=4)) == {
        "temperature": 0.7, "seed": 5, "top_p": 1.0, "top_k": 4, "min_p": 0.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "repetition_penalty": 1.0, "stop": []}


def test_a_parameter_spcli_does_not_apply_is_named_with_the_engine():
    assert is_no_op("n", 1) and is_no_op("min_tokens", None) and not is_no_op("n", 1.0) and not is_no_op("ignore_eos", 0)
    one = unapplied_message((("min_tokens", 3),), "hf")
    assert one.startswith("field 'min_tokens' (3) is a generation parameter --engine hf does not apply (it applies "
                          "temperature, max_tokens, seed, top_p, top_k, min_p, ")
    two = unapplied_message((("body.n", 2), ("body.logprobs", True)), "vllm")
    assert two.startswith("fields 'body.n' (2; one output per record), 'body.logprobs' (True; logprobs are set for the "
                          "whole run: spcli run --logprobs N) are generation parameters --engine vllm does not apply")


def test_the_fingerprint_of_a_job_without_sampling_settings_is_the_one_made_before_them():
    """A directory made before sampling flags existed resumes: the defaults leave `generate` as it was."""
    cfg = RunConfig(inputs=("a.jsonl",), out="o")
    assert cfg.fingerprint_fields()["generate"] == {"max_tokens": 64, "temperature": 0.0, "seed": 0, "logprobs": 0}
    top_k = RunConfig(inputs=("a.jsonl",), out="o", generate=GenerateConfig(top_k=-1))
    assert top_k.fingerprint_fields() == cfg.fingerprint_fields(), "top_k -1 is 0: every token"
    stop = RunConfig(inputs=("a.jsonl",), out="o", generate=GenerateConfig(stop="\n", repetition_penalty=1.1))
    assert stop.fingerprint_fields()["generate"] == {**cfg.fingerprint_fields()["generate"], "stop": ("\n",),
                                                     "repetition_penalty": 1.1}


@pytest.mark.parametrize("kw, message", [
    (dict(top_p=0.0), "--top-p must be in (0, 1], got 0.0"),
    (dict(stop=("",)), "--stop must be a non-empty string or a list of them, got ('',)"),
    (dict(presence_penalty=2.5), "--presence-penalty must be in [-2, 2], got 2.5"),
])
def test_bad_flags_name_the_flag(kw, message):
    with pytest.raises(ConfigError) as e:
        GenerateConfig(**kw)
    assert str(e.value) == message


def test_vllm_takes_temperatures_up_to_2():
    with pytest.raises(ConfigError) as e:
        RunConfig(inputs=("a.jsonl",), out="o", engine="vllm", generate=GenerateConfig(temperature=2.5))
    assert str(e.value) == "--temperature 2.5: --engine vllm applies at most 2.0 (vLLM's SamplingParams)"
    RunConfig(inputs=("a.jsonl",), out="o", engine="hf", generate=GenerateConfig(temperature=2.5))
