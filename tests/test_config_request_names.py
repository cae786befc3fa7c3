"""spcli/config/request_names.py: every name an OpenAI completion or chat body (or vLLM's server) accepts is read,
applied, ignored or refused by name, never dropped in silence (issue 59: `best_of: 2` was). vLLM's own lists of
names are walked in tests/test_engines_vllm_sampling.py (the vLLM suite)."""

from __future__ import annotations

import json

import pytest

from spcli.config import request_names, sampling
from spcli.config.request_names import IGNORED, READ, REFUSED
from test_io_read import records as read

# OpenAI's API reference, POST /v1/completions and POST /v1/chat/completions request bodies (deprecated ones too)
OPENAI_COMPLETIONS = ("model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
                      "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                      "top_p", "user")
OPENAI_CHAT = ("messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
               "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls",
               "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format",
               "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
               "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options")
# vLLM's structured-output fields before 0.32 put them under structured_outputs
OLD_VLLM = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern",
            "guided_decoding_backend")
# a value of each refused name that is not its no-op
SET = {"best_of": 2, "use_beam_search": True, "length_penalty": 0.5, "echo": True, "suffix": "tail", "top_logprobs": 3,
       "response_format": {"type": "json_object"}, "guided_json": {"type": "object"}, "guided_regex": "a+",
       "guided_choice": ["a", "b"], "guided_grammar": "root ::= 'a'", "guided_whitespace_pattern": " ",
       "guided_decoding_backend": "xgrammar", "tools": [{"type": "function", "function": {"name": "f"}}],
       "tool_choice": "auto", "parallel_tool_calls": "yes", "functions": [{"name": "f"}], "function_call": "auto",
       "reasoning_effort": "low", "include_reasoning": False, "truncate_prompt_tokens": 8, "truncation_side": "left",
       "add_generation_prompt": False, "continue_final_message": True, "add_special_tokens": True,
       "chat_template": "{{ x }}", "chat_template_kwargs": {"enable_thinking": False}, "documents": [{"t": "x"}],
       "media_io_kwargs": {"image": {}}, "mm_processor_kwargs": {"a": 1}, "mm_payload": "none", "prompt_embeds": "AAAA",
       "modalities": ["text", "audio"], "audio": {"voice": "x"}, "prediction": {"type": "content", "content": "x"},
       "web_search_options": {}, "verbosity": "low", "return_tokens_as_token_ids": True, "return_token_ids": True,
       "return_token_offsets": True, "return_prompt_text": True, "return_mm_kwargs": True, "vllm_xargs": {"a": 1}}


def test_the_classes_are_disjoint_and_every_openai_name_is_in_one():
    applied, unapplied = set(sampling.APPLIED), set(sampling.SAMPLING_PARAMS) - set(sampling.APPLIED)
    classes = [applied, unapplied, set(READ) - {"n"}, set(IGNORED), set(REFUSED)]
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "no name in two classes"
    known = set().union(*classes)
    assert [n for n in (*OPENAI_COMPLETIONS, *OPENAI_CHAT, *OLD_VLLM) if n not in known] == []
    assert set(SET) == set(REFUSED), "each refused name is tried below"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_name_holding_a_value_is_kept_to_be_refused_from_records_and_bodies(tmp_path, name):
    assert not request_names.is_no_op(name, SET[name]) and request_names.is_no_op(name, None)
    plain = {"id": "p", "prompt": "x", name: SET[name]}
    body = {"custom_id": "o", "url": "/v1/completions", "body": {"prompt": "x", name: SET[name]}}
    (tmp_path / "in.jsonl").write_text(json.dumps(plain) + "\n" + json.dumps(body) + "\n")
    p, o = read(tmp_path / "in.jsonl")
    assert o.error is not None and f"'body.{name}'" in o.error or o.unapplied == ((f"body.{name}", SET[name]),)
    if name in request_names.BODY_ONLY:  # an everyday name: a plain record's data
        assert p.error is None and p.unapplied == ()
        return
    assert p.error is None and p.unapplied == ((name, SET[name]),)
    assert repr(SET[name]) in sampling.unapplied_message(p.unapplied, "hf")


def test_no_op_values_and_ignored_names_change_nothing(tmp_path):
    no_ops = {"best_of": 1, "use_beam_search": False, "length_penalty": 1.0, "echo": False, "top_logprobs": 0,
              "response_format": {"type": "text"}, "tool_choice": "none", "parallel_tool_calls": True,
              "include_reasoning": True, "add_generation_prompt": True, "guided_json": None}
    ignored = {"model": "gpt-4o-mini", "user": "u1", "metadata": {"k": "v"}, "store": False, "priority": 3}
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "p", "prompt": "x", **no_ops, **ignored}) + "\n")
    (p,) = read(tmp_path / "in.jsonl")
    assert p.error is None and p.unapplied == ()


def test_max_completion_tokens_is_a_plain_record_s_max_tokens_as_a_body_s(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "x", "max_completion_tokens": 7}) + "\n"
                                       + json.dumps({"prompt": "x", "max_completion_tokens": 0}) + "\n")
    a, b = read(tmp_path / "in.jsonl")
    assert a.error is None and a.max_tokens == 7
    assert b.error.endswith("field 'max_completion_tokens' must be in [1, 1048576], got 0")
