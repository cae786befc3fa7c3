"""A row's stop strings, ended and cut alike on both engines (spcli.config.sampling: `stop`).

The hf engine looks for them in each row's decoded output after every step (spcli/engines/hf/sampling.py); vLLM
finds them in its own detokenized text. Either way the row's tokens end with the one that completes the first stop
string, and its text is cut before that string (`stop_at`), so both engines give the same row.
"""

from __future__ import annotations

from collections.abc import Callable


def first_stop(text: str, stop: tuple[str, ...]) -> int | None:
    """Where the first stop string in `text` begins (the earliest of them), or None."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found) if found else None


def stop_at(token_ids: list[int], decode: Callable[[list[int]], str],
            stop: tuple[str, ...]) -> tuple[list[int], str, bool]:
    """The output of a row with stop strings: the tokens up to the one that completes the first stop string, the
    text before that string, and whether one was found (else every token and its whole text). Both engines end a
    row's tokens there already; the shortest prefix holding a stop string is looked for from the end."""
    text = decode(token_ids)
    cut = first_stop(text, stop) if stop else None
    if cut is None:
        return list(token_ids), text, False
    n = len(token_ids)
    while n > 1 and first_stop(decode(token_ids[: n - 1]), stop) is not None:
        n -= 1
    return list(token_ids[:n]), text[:cut], True
