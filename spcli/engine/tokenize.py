"""Tokenize a record: raw `prompt` text as is, `messages` through the model's chat template."""

from __future__ import annotations

from spcli.errors import RecordError
from spcli.io.records import Record


def tokenize(record: Record, tokenizer, max_prompt_tokens: int, truncate: str, limit: str = "") -> list[int]:
    """Token ids of the record's prompt, at most `max_prompt_tokens` long; `limit` says where that
    number comes from and which flag raises it (for the error row).

    truncate: "error" (an over-long prompt is an error row), "left" (keep its end) or "middle"
    (keep its start and end, drop the middle).
    """
    if record.messages is not None:
        if tokenizer.chat_template is None:
            raise RecordError("record has 'messages' but the model has no chat template; give 'prompt' text instead")
        try:
            ids = tokenizer.apply_chat_template(record.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        except Exception as e:  # jinja errors from the model's template
            raise RecordError(f"the chat template rejected 'messages': {e}") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(record.prompt, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise RecordError("prompt tokenizes to nothing")
    if len(ids) > max_prompt_tokens:
        if truncate == "error":
            raise RecordError(
                f"prompt has {len(ids)} tokens, more than the {max_prompt_tokens} allowed"
                + (f" ({limit})" if limit else "") + "; use --truncate left|middle to cut it"
            )
        if truncate == "left":
            ids = ids[len(ids) - max_prompt_tokens :]
        else:
            head = max_prompt_tokens // 2
            ids = ids[:head] + ids[len(ids) - (max_prompt_tokens - head) :]
    return ids
