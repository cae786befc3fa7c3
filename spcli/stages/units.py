"""Selection units: spans of prompt tokens that selection keeps or drops whole (DESIGN.md step 7).

A unit's edges fall where the text allows a cut, read from the tokenizer's character offsets:

    word start      token i begins a word: whitespace on either side of the cut before it (or the
                    first token); so a kept span never ends inside a word, a number or a code
    sentence start  a word start at a sentence boundary (Bling Fire's sentence breaker) or after a newline
    clause start    a sentence start, or a word after `.`, `!`, `?` (closing quotes or brackets may follow) that
                    Bling Fire did not take for a sentence end (the next word is lower case: a fact set into
                    running prose, "... pier 436580. and a fool later"), or any word after `;`
    value word      a word holding a digit (a number, code, date, amount) or a capitalised word that does not
                    open its clause (a name): what a fact's answer is

    unit = "clause"    (the default) a clause of at most `max_unit` tokens is one unit; a longer one is split into
                       pieces of about `chunk` tokens that end on word starts, but never before a value word nor
                       before either of the BIND words that come right before one (so a number, code, date or
                       name stays in one unit with the words that say what it is), unless a piece reaches
                       max(max_unit, chunk) tokens with no other place to cut
    unit = "sentence"  a sentence (or line) of at most `max_unit` tokens is one unit; a longer one is split
                       into pieces of about `chunk` tokens that end on word starts (what ran before clauses)
    unit = "word"      pieces of about `chunk` tokens that end on word starts
    unit = "chunk"     fixed windows of `chunk` tokens (the paper's), cut anywhere

A single word longer than WORD_LIMIT x max_unit tokens (a base64 blob, a URL) is cut there: the only case
where a unit edge falls inside a word. Pure functions over text and offsets: no model.
"""

from __future__ import annotations

from collections.abc import Sequence

import re

import numpy as np
import torch

WORD_LIMIT = 4  # a word longer than this many max_unit is cut (the one exception)
BIND = 2  # words right before a value word that stay in its unit (unit clause) ...
GAP = 4  # ... and the words between two value words at most this many words apart
CLAUSE_END = re.compile(r"([.!?;])[\"')\]\u201d\u2019]*\s+(?=\S)")  # a clause ends; group 1: its mark

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


def clause_starts(text: str) -> np.ndarray:
    """Ascending character positions where a clause begins: sentence_starts, and the word after a clause mark
    that Bling Fire passed over (`.`, `!`, `?` before a lower-case word; `;` before any word)."""
    points = set(sentence_starts(text).tolist())
    for m in CLAUSE_END.finditer(text):
        if m[1] == ";" or text[m.end()].islower():
            points.add(m.end())
    return np.array(sorted(points), dtype=np.int64)


def value_words(text: str, offsets: Sequence[Span], is_word: np.ndarray, is_open: np.ndarray) -> np.ndarray:
    """[n] int8 per token: 1 where it starts a value word (module docstring: a word holding a digit, or capitalised
    where it does not open its clause: `is_open`, [n] bool), -1 where it starts a blank one (a space a tokenizer
    keeps apart from the digits after it), 0 elsewhere."""
    n = len(offsets)
    out = np.zeros(n, dtype=np.int8)
    starts = np.flatnonzero(is_word).tolist() + [n]
    for a, b in zip(starts[:-1], starts[1:]):
        lo = min((s for s, e in offsets[a:b] if e > s), default=None)
        word = "" if lo is None else text[lo : max(e for _, e in offsets[a:b])].strip().lstrip("\"'([{\u201c\u2018")
        if not word:
            out[a] = -1
            continue
        is_name = word[:1].isupper() and not is_open[a] and word.rstrip(".,;:!?") != "I" and not word.startswith("I'")
        out[a] = is_name or any(c.isdigit() for c in word)
    return out


def opens(offsets: Sequence[Span], is_word: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """[n] bool: token i is the word start that opens a span (`edges`: ascending character positions where spans
    begin, sentence_starts or clause_starts)."""
    n = len(offsets)
    ends = np.fromiter((max(a, b - 1) for a, b in offsets), dtype=np.int64, count=n)  # a token's last character
    span = np.searchsorted(edges, ends, side="right")  # [n] span of each token
    return is_word & np.concatenate([[True], span[1:] != span[:-1]])


def unit_ids(text: str, offsets: Sequence[Span], unit: str, chunk: int, max_unit: int) -> torch.Tensor:
    """[n] int64 unit of each token: 0, 0, 1, 1, 1, 2, ... (non-decreasing, consecutive)."""
    n = len(offsets)
    if unit == "chunk":
        return torch.arange(n, dtype=torch.int64) // chunk
    is_word = word_starts(text, offsets)
    is_cut = is_word
    if unit in ("sentence", "clause"):
        is_new = opens(offsets, is_word, sentence_starts(text) if unit == "sentence" else clause_starts(text))
        if unit == "clause":
            is_cut = is_word & ~bound(is_word, value_words(text, offsets, is_word, is_new))
    else:  # one span, split into pieces
        is_new = np.zeros(n, dtype=np.bool_)
        is_new[:1] = True
    longest = 0 if unit == "word" else max_unit
    return torch.from_numpy(_split_long(is_new, is_word, is_cut, chunk, longest, WORD_LIMIT * max(max_unit, chunk)))


def bound(is_word: np.ndarray, kinds: np.ndarray, depth: int = BIND, gap: int = GAP) -> np.ndarray:
    """[n] bool: word starts a piece may not begin at (`kinds`: value_words'): a value word, the `depth` words right
    before one, and every word between two value words at most `gap` words apart ("the ferry to Halden leaves from
    pier 436580"). A blank word goes with the word after it."""
    words = np.flatnonzero(is_word & (kinds >= 0))  # [num_words] token of each word start, blanks aside
    value_at = np.flatnonzero(kinds[words] == 1)  # word indices of value words
    is_bound = np.zeros(words.shape[0], dtype=np.bool_)
    for k in range(depth + 1):
        is_bound[np.clip(value_at - k, 0, None)] = True
    for a, b in zip(value_at[:-1], value_at[1:]):
        if b - a <= gap:
            is_bound[a + 1 : b] = True
    out = np.zeros_like(is_word)
    out[words[is_bound]] = True
    for i in np.flatnonzero(kinds < 0)[::-1]:  # right to left: a run of blanks takes the word after it
        out[i] = i + 1 < out.shape[0] and out[i + 1]
    return out


def _split_long(is_new: np.ndarray, is_word: np.ndarray, is_cut: np.ndarray, chunk: int, max_unit: int,
                hard: int) -> np.ndarray:
    """Unit ids from span starts `is_new`: a span longer than max_unit is cut into pieces of at least `chunk`
    tokens where `is_cut` allows (word starts, less those bound to a value word), at any word start once a piece
    reaches max(max_unit, chunk) tokens, and anywhere at `hard` tokens."""
    n = is_new.shape[0]
    out = np.empty(n, dtype=np.int64)
    span_starts = np.flatnonzero(is_new).tolist() + [n]
    longest = max(max_unit, chunk)
    unit = -1
    for a, b in zip(span_starts[:-1], span_starts[1:]):
        unit += 1
        if b - a <= max_unit:
            out[a:b] = unit
            continue
        size = 0
        for i in range(a, b):
            if size and ((size >= chunk and is_cut[i]) or (size >= longest and is_word[i]) or size >= hard):
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


def value_kinds(text: str, offsets: Sequence[Span]) -> tuple[np.ndarray, np.ndarray]:
    """(is_word, kinds): word_starts and value_words of a text, clauses as unit clause reads them."""
    is_word = word_starts(text, offsets)
    return is_word, value_words(text, offsets, is_word, opens(offsets, is_word, clause_starts(text)))


def cut_values(text: str, offsets: Sequence[Span], is_kept: np.ndarray,
               kinds: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
    """Token indices where a value word (value_words: a number, code, date or capitalised name) starts that was
    dropped while the word right before it was kept: a fact cut from its subject (issue 56). is_kept: [n] bool;
    `kinds`: value_kinds(text, offsets) where the caller has them (one prompt, several kept sets)."""
    if len(offsets) == 0:
        return []
    is_word, kinds = value_kinds(text, offsets) if kinds is None else kinds
    words = np.flatnonzero(is_word & (kinds >= 0)).tolist()  # word starts, blanks aside
    return [cur for prev, cur in zip(words[:-1], words[1:]) if kinds[cur] == 1 and not is_kept[cur] and is_kept[prev]]
