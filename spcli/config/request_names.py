"""The names a request may carry beyond vLLM's SamplingParams (spcli.config.sampling): those of OpenAI's completion
and chat request bodies and of vLLM 0.32's OpenAI server (its ChatCompletionRequest and CompletionRequest), and
OpenAI's or an earlier vLLM's that 0.32 dropped (best_of, guided_*, functions). Each is one of

    READ       read by spcli (the prompt or messages, max_completion_tokens; stream and n are checked)
    IGNORED    no generation parameter: what it sets cannot change a row (the model is spcli run's --model,
               scheduling, caching, who asked); a plain record's field of that name is data
    REFUSED    changes the output or what a response holds, and spcli does not apply it: unless it holds its
               no-op value (vLLM's default; null always is one), the record is an error row naming it and the
               engine (spcli.io.params puts it in Record.unapplied), never a row generated without it; in a plain
               record a few everyday names (tools, documents, echo, ...: BODY_ONLY) are data instead

tests/test_engines_vllm_sampling.py walks vLLM's own lists of names so that a new one cannot slip through;
tests/test_config_request_names.py checks this list. Pure Python.
"""

from __future__ import annotations

from typing import Any

READ = ("messages", "prompt", "max_completion_tokens", "stream", "n")
IGNORED = ("model", "user", "metadata", "store", "service_tier", "request_id", "session_id", "priority",
           "cache_salt", "kv_transfer_params", "ec_transfer_params", "stream_options",
           "prompt_cache_key", "safety_identifier")
STRUCTURED = "structured output is not applied"
TOOLS = "tool calls are not applied"
TEMPLATE = "spcli applies the model's own chat template as vLLM's defaults do"
SHAPE = "spcli's rows hold what they hold (docs/guide/run.md); the response has no such part"
# name -> (its no-op values, why spcli refuses it)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((1,), "one output per record"),
    "use_beam_search": ((False,), "beam search is not applied"),
    "length_penalty": ((1.0, 1), "beam search is not applied"),
    "echo": ((False,), "the output is the generated text only"),
    "suffix": (("",), "no text after the completion is applied"),
    "top_logprobs": ((0,), "logprobs are set for the whole run: spcli run --logprobs N"),
    "response_format": (({"type": "text"},), STRUCTURED),
    "guided_json": ((), STRUCTURED), "guided_regex": ((), STRUCTURED), "guided_choice": ((), STRUCTURED),
    "guided_grammar": ((), STRUCTURED), "guided_whitespace_pattern": ((), STRUCTURED),
    "guided_decoding_backend": ((), STRUCTURED),
    "tools": (([],), TOOLS), "tool_choice": (("none",), TOOLS), "parallel_tool_calls": ((True, False), TOOLS),
    "functions": (([],), TOOLS), "function_call": (("none",), TOOLS),
    "reasoning_effort": ((), "reasoning settings are not applied"),
    "include_reasoning": ((True,), "reasoning settings are not applied"),
    "truncate_prompt_tokens": ((), "truncation is set for the whole run: spcli run --truncate left|middle"),
    "truncation_side": ((), "truncation is set for the whole run: spcli run --truncate left|middle"),
    "add_generation_prompt": ((True,), TEMPLATE), "continue_final_message": ((False,), TEMPLATE),
    "add_special_tokens": ((), TEMPLATE), "chat_template": ((), TEMPLATE), "chat_template_kwargs": (({},), TEMPLATE),
    "documents": (([],), TEMPLATE),
    "media_io_kwargs": (({},), "only text is prefilled"), "mm_processor_kwargs": (({},), "only text is prefilled"),
    "mm_payload": (("tensors",), "only text is prefilled"), "prompt_embeds": ((), "only text is prefilled"),
    "modalities": ((["text"],), "only text is generated"), "audio": ((), "only text is generated"),
    "prediction": ((), "predicted outputs are not applied"),
    "web_search_options": ((), "web search is not applied"), "verbosity": ((), "verbosity is not applied"),
    "return_tokens_as_token_ids": ((False,), SHAPE), "return_token_ids": ((False,), SHAPE),
    "return_token_offsets": ((False,), SHAPE), "return_prompt_text": ((False,), SHAPE),
    "return_mm_kwargs": ((False,), SHAPE),
    "vllm_xargs": (({},), "custom logits processors' arguments are not applied"),
}


# refused in an OpenAI batch body only: in a plain record (or a Parquet column) a field of such an everyday name is
# more likely data (`spcli run --pass-through`) than a request to the model
BODY_ONLY = frozenset({"documents", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "audio",
                       "prediction", "modalities", "verbosity", "web_search_options", "echo", "suffix"})


def refused_names(in_body: bool) -> tuple[str, ...]:
    return tuple(n for n in REFUSED if in_body or n not in BODY_ONLY)


def is_no_op(name: str, value: Any) -> bool:
    """Whether a REFUSED name holds a value that changes nothing (null, or vLLM's default for it)."""
    return value is None or any(value == v and type(value) is type(v) for v in REFUSED[name][0])
