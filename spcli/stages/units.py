"""Selection units: spans of prompt tokens that selection keeps or drops whole (DESIGN.md step 7).

A unit's edges fall where the text allows a cut, read from the tokenizer's character offsets:

    word start      token i begins a word: whitespace on either side of the cut before it (or the
                    first token); so a kept span never ends inside a word, a number or a code
    sentence start  a word start at a sentence boundary (Bling Fire's sentence breaker) or after a newline

    unit = "sentence"  a sentence (or line) of at most `max_unit` tokens is one unit; a longer one is split
                       into pieces of about `chunk` tokens that end on word starts
    unit = "word"      pieces of about `chunk` tokens that end on word starts
    unit = "chunk"     fixed windows of `chunk` tokens (the paper's), cut anywhere

A single word longer than WORD_LIMIT x max_unit tokens (a base64 blob, a URL) is cut there: the only case
where a unit edge falls inside a word. Pure functions over text and offsets: no model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

WORD_LIMIT = 4  # a word longer than this many max_unit is cut (the one exception)

Span = tuple[int, int]  # [start, end) characters of a token; start == end: no character


def word_starts(text: str, offsets: Sequence[Span]) -> np.ndarray:
    """[n] bool: a unit may begin at token i. True where whitespace touches the cut before token i (a
    byte-level tokenizer's ' word' starts on the space, a trimmed one just after it), where either token
    covers no character (BOS, template), and at token 0; False inside a character split over tokens."""
    n = len(offsets)
    starts = np.fromiter((a for a, _ in offsets), dtype=np.int64, count=n)  # [n]
    ends = np.fromiter((b for _, b in offsets), dtype=np.int64, count=n)  # [n]
    is_space = np.array([c.isspace() for c in text] + [True], dtype=np.bool_)  # [len + 1]: past either end counts as space
    out = np.zeros(n, dtype=np.bool_)
    if n == 0:
        return out
    out[0] = True
    s, e_prev = starts[1:], ends[:-1]
    is_empty = (starts == ends)
    space_at = is_space[np.clip(s, 0, len(text))] | is_space[np.clip(s - 1, -1, len(text))]  # index -1: the pad
    out[1:] = is_empty[1:] | is_empty[:-1] | ((s >= e_prev) & space_at)
    return out


def sentence_starts(text: str) -> np.ndarray:
    """Ascending character positions where a sentence or a line begins (0 included)."""
    import blingfire

    points = {0}
    if text.strip():
        _, offsets = blingfire.text_to_sentences_and_offsets(text)
        points.update(int(a) for a, _ in offsets)
    points.update(i + 1 for i, c in enumerate(text) if c == "\n")
    return np.array(sorted(p for p in points if p <= len(text)), dtype=np.int64)


def unit_ids(text: str, offsets: Sequence[Span], unit: str, chunk: int, max_unit: int) -> torch.Tensor:
    """[n] int64 unit of each token: 0, 0, 1, 1, 1, 2, ... (non-decreasing, consecutive)."""
    n = len(offsets)
    if unit == "chunk":
        return torch.arange(n, dtype=torch.int64) // chunk
    is_word = word_starts(text, offsets)
    if unit == "sentence":
        ends = np.fromiter((max(a, b - 1) for a, b in offsets), dtype=np.int64, count=n)  # a token's last character
        sentence = np.searchsorted(sentence_starts(text), ends, side="right")  # [n] sentence of each token
        is_new = is_word & np.concatenate([[True], sentence[1:] != sentence[:-1]])
    else:  # one span, split into pieces
        is_new = np.zeros(n, dtype=np.bool_)
        is_new[:1] = True
    longest = max_unit if unit == "sentence" else 0
    return torch.from_numpy(_split_long(is_new, is_word, chunk, longest, WORD_LIMIT * max(max_unit, chunk)))


def _split_long(is_new: np.ndarray, is_word: np.ndarray, chunk: int, max_unit: int, hard: int) -> np.ndarray:
    """Unit ids from span starts `is_new`: a span longer than max_unit is cut into pieces of at least `chunk`
    tokens at word starts, and any piece at `hard` tokens."""
    n = is_new.shape[0]
    out = np.empty(n, dtype=np.int64)
    span_starts = np.flatnonzero(is_new).tolist() + [n]
    unit = -1
    for a, b in zip(span_starts[:-1], span_starts[1:]):
        unit += 1
        if b - a <= max_unit:
            out[a:b] = unit
            continue
        size = 0
        for i in range(a, b):
            if size and ((size >= chunk and is_word[i]) or size >= hard):
                unit += 1
                size = 0
            out[i] = unit
            size += 1
    return out


def restrict(units: torch.Tensor, kept: Sequence[int]) -> torch.Tensor:
    """The units of the tokens a truncation kept (`kept`: ascending positions), renumbered 0, 1, ...; the cut
    itself starts a new unit."""
    idx = torch.as_tensor(list(kept), dtype=torch.int64)
    sub = units[idx]
    is_new = torch.ones(sub.shape[0], dtype=torch.bool)
    is_new[1:] = (sub[1:] != sub[:-1]) | (idx[1:] != idx[:-1] + 1)
    return torch.cumsum(is_new.long(), 0) - 1
