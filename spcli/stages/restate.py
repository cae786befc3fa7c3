"""The instruction read again after the prompt, so that a question asked before the document scores it.

The speculator's query rows are its prompt's last `window` tokens (speculate.py): with the question after
the document they are the question, and attention from them finds the fact. A record whose instruction
comes first (its instruction field with --instruction-at before: io.records.put_instruction) ends with the
document's last sentences instead, and causal attention from the instruction's own rows cannot see the
document after it. So the speculator prefills the prompt followed by the instruction's tokens once more
(`--restate`, on by default; only for instructions put before): the last rows are the question again, now with the whole document before
it. The base model never sees the restated tokens; their importance is cut off before selection, and
the prompt's own tokens score as they would in a prompt that ended with the question.

At most MAX_RESTATED tokens (the instruction's last ones) are read again, and never more than the
speculator's prompt limit leaves.
"""

from __future__ import annotations

import dataclasses

from spcli.stages.speculate import Speculation

MAX_RESTATED = 256  # tokens of the instruction read again: its end, where the question usually is


def restated_ids(texts: tuple[str, ...], tokenizer, room: int) -> list[int] | None:
    """The instruction texts in `tokenizer`'s tokens (no special tokens), their last min(MAX_RESTATED, room)
    tokens; None when there is no instruction or no room."""
    ids = [int(i) for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    take = min(MAX_RESTATED, room, len(ids))
    return ids[len(ids) - take :] if take > 0 else None


def restated_for(stack, texts: tuple[str, ...], speculator_len: int) -> list[int] | None:
    """`restated_ids` for a prompt of `speculator_len` speculator tokens read by `stack` (a ModelStack): in the
    speculator's own tokenizer where it has one, within its positions and the engine's prompt bound."""
    spec = stack.speculator_tokens
    tokenizer, positions = (stack.tokenizer, stack.max_positions) if spec is None else (spec.tokenizer, spec.max_positions)
    limit = min(positions, stack.max_prompt_len or 1 << 30)
    return restated_ids(texts, tokenizer, limit - speculator_len)


def prompt_part(spec: Speculation, n: int) -> Speculation:
    """A Speculation over prompt + restated tokens cut to the prompt's first n tokens."""
    if spec.importance.numel() == n:
        return spec
    unpooled = None if spec.unpooled is None else spec.unpooled[:n]
    return dataclasses.replace(spec, importance=spec.importance[:n], unpooled=unpooled)
