"""Tokenize a record: raw `prompt` text as is, `messages` through the model's chat template (and a raw prompt given
with an instruction too, where the model has one: `chat_form`)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from spcli.errors import RecordError
from spcli.io.records import Record


@dataclass
class Encoded:
    """A record's prompt as one tokenizer reads it, with where each token's characters are."""

    text: str  # the prompt, or the messages rendered with the tokenizer's chat template
    ids: list[int]  # [n]
    offsets: list[tuple[int, int]]  # [n] each token's [start, end) characters in text; (a, a): none
    regions: list[tuple[int, int]]  # characters any tokenizer reads the same: the prompt, or each message's content


def chat_form(record: Record, tokenizer) -> Record:
    """The record as the model reads it: a raw prompt given with an instruction (--instruction-field) becomes one
    user message where the tokenizer has a chat template, so an instruct model answers the instruction instead
    of continuing the document (issue 40); a raw prompt without one stays raw text, as an endpoint of
    /v1/completions sends it."""
    if record.prompt is None or not record.protected or getattr(tokenizer, "chat_template", None) is None:
        return record
    return dataclasses.replace(record, prompt=None, messages=[{"role": "user", "content": record.prompt}])


def tokenize(record: Record, tokenizer, max_prompt_tokens: int, truncate: str, limit: str = "") -> list[int]:
    """Token ids of the record's prompt, at most `max_prompt_tokens` long; `limit` says where that
    number comes from and which flag raises it (for the error row).

    truncate: "error" (an over-long prompt is an error row), "left" (keep its end) or "middle"
    (keep its start and end, drop the middle).
    """
    record = chat_form(record, tokenizer)
    if record.messages is not None:
        check_chat_template(tokenizer)
        try:
            ids = tokenizer.apply_chat_template(record.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        except Exception as e:  # jinja errors from the model's template
            raise RecordError(f"the chat template rejected 'messages': {e}") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(record.prompt, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in ids]
    return [ids[i] for i in kept_positions(len(ids), max_prompt_tokens, truncate, limit)]


def kept_positions(n: int, max_prompt_tokens: int, truncate: str, limit="") -> range | list[int]:
    """The token positions a prompt of n tokens keeps under `truncate` (all n when it fits). `limit`: where
    max_prompt_tokens comes from, a string or a function of n (ModelStack.prompt_limit)."""
    if n == 0:
        raise RecordError("prompt tokenizes to nothing")
    if n <= max_prompt_tokens:
        return range(n)
    if truncate == "error":
        limit = limit(n) if callable(limit) else limit
        raise RecordError(
            f"prompt has {n} tokens, more than the {max_prompt_tokens} allowed"
            + (f" ({limit})" if limit else "") + "; use --truncate left|middle to cut it"
        )
    if truncate == "left":
        return range(n - max_prompt_tokens, n)
    head = max_prompt_tokens // 2
    return [*range(head), *range(n - (max_prompt_tokens - head), n)]


def check_chat_template(tokenizer) -> None:
    if tokenizer.chat_template is None:
        raise RecordError("record has 'messages' but the model has no chat template; give 'prompt' text instead")


def encode(record: Record, tokenizer) -> Encoded:
    """The whole prompt with character offsets (a fast tokenizer's offset mapping); the same ids as
    `tokenize` before truncation."""
    from spcli.stages.align import AlignmentError, content_regions

    record = chat_form(record, tokenizer)
    if record.messages is not None:
        check_chat_template(tokenizer)
        try:
            text = tokenizer.apply_chat_template(record.messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # jinja errors from the model's template
            raise RecordError(f"the chat template rejected 'messages': {e}") from e
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        try:
            regions = content_regions(text, [m["content"] for m in record.messages])
        except AlignmentError as e:
            raise RecordError(f"cannot match the two tokenizers' characters: {e}") from e
    else:
        text = record.prompt
        enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
        regions = [(0, len(text))]
    ids = [int(i) for i in enc["input_ids"]]
    if not ids:
        raise RecordError("prompt tokenizes to nothing")
    return Encoded(text, ids, [(int(a), int(b)) for a, b in enc["offset_mapping"]], regions)


@dataclass
class Layout:
    """What selection reads of a prompt's text besides its ids."""

    units: torch.Tensor  # [n] int64 selection unit of each token (spcli.stages.units)
    protected: torch.Tensor | None  # [n] bool tokens never dropped (select.protect), None when there are none


def layout_of(enc: Encoded, record: Record, kept: range | list[int], select) -> Layout:
    """Units and protected tokens of the kept positions of an encoded record."""
    return Layout(units_of(enc, kept, select), protected_of(enc, record, kept, select))


def protected_of(enc: Encoded, record: Record, kept: range | list[int], select) -> torch.Tensor | None:
    """[len(kept)] bool: tokens touching a protected text: the content of messages whose role select.protect names,
    and the record's instruction where it names `instruction`; None when nothing is protected."""
    from spcli.config.scoring import INSTRUCTION

    roles = set(select.protect_roles())
    spans = []
    if record.messages is not None and roles:
        spans += [r for r, m in zip(enc.regions, record.messages) if m.get("role") in roles]
    if INSTRUCTION in roles:
        cursor = 0
        for text in record.protected:
            if (start := enc.text.find(text, cursor)) >= 0:
                spans.append((start, start + len(text)))
                cursor = start + len(text)
    if not spans:
        return None
    mask = torch.tensor([any(a < e and b > s for s, e in spans) for a, b in enc.offsets], dtype=torch.bool)
    mask = mask[torch.as_tensor(list(kept), dtype=torch.int64)] if len(kept) < len(enc.ids) else mask
    return mask if bool(mask.any()) else None


def units_of(enc: Encoded, kept: range | list[int], select) -> torch.Tensor:
    """[len(kept)] int64 selection units (spcli.stages.units) of the kept positions of an encoded prompt."""
    from spcli.stages import units

    ids = units.unit_ids(enc.text, enc.offsets, select.unit, select.chunk, select.max_unit)
    return ids if len(kept) == len(enc.ids) else units.restrict(ids, kept)


def units_from_ids(tokenizer, ids: list[int], select) -> torch.Tensor:
    """[n] int64 selection units of token ids that come without their text (benchmarks): the text is each
    token decoded alone, one after the other."""
    pieces = [tokenizer.decode([i]) for i in ids]
    ends = list(itertools.accumulate(map(len, pieces)))
    offsets = [(e - len(p), e) for p, e in zip(pieces, ends)]
    return units_of(Encoded("".join(pieces), ids, offsets, [(0, ends[-1] if ends else 0)]), range(len(ids)), select)


def tokenize_units(record: Record, tokenizer, max_prompt_tokens: int, truncate: str, limit: str,
                   select) -> tuple[list[int], Layout]:
    """Token ids as `tokenize` makes them, with their Layout: each token's selection unit from the text's
    words and sentences (spcli.stages.units) and the protected ones (`select`: a resolved SelectConfig)."""
    enc = encode(record, tokenizer)
    kept = kept_positions(len(enc.ids), max_prompt_tokens, truncate, limit)
    return [enc.ids[i] for i in kept], layout_of(enc, record, kept, select)


def cross_tokenize(record: Record, tokenizer, speculator_tokenizer, max_prompt_tokens: int, truncate: str,
                   limit: str = "", speculator_max_positions: int = 1 << 30, select=None):
    """Base ids, speculator ids, their Alignment (spcli.stages.align) for a speculator of another tokenizer,
    and the base tokens' Layout (units, protected; None without `select`): each reads the same text (a raw
    prompt as is, the messages in its own chat template). Truncation cuts the base's tokens as `tokenize`
    does; the speculator drops what only they covered."""
    from spcli.stages.align import align, restrict

    base, spec = encode(record, tokenizer), encode(record, speculator_tokenizer)
    alignment = align(base.offsets, base.regions, spec.offsets, spec.regions)
    kept = kept_positions(len(base.ids), max_prompt_tokens, truncate, limit)
    spec_ids = spec.ids
    if len(kept) < len(base.ids):
        spec_kept, alignment = restrict(alignment, list(kept))
        spec_ids = [spec.ids[j] for j in spec_kept]
    if len(spec_ids) > speculator_max_positions:
        raise RecordError(f"the prompt is {len(spec_ids)} tokens in the speculator's tokenizer, more than its "
                          f"max_position_embeddings {speculator_max_positions}; use --truncate left|middle with a "
                          "lower limit, or another speculator")
    layout = None if select is None else layout_of(base, record, kept, select)
    return [base.ids[i] for i in kept], spec_ids, alignment, layout
