"""A row's stop strings (spcli/engines/stop_strings.py): the cut both engines make."""

from __future__ import annotations

from spcli.engines.stop_strings import stop_at


def test_stop_at_cuts_the_text_before_the_first_stop_string_and_the_tokens_after_the_one_that_completes_it():
    words = {1: "The", 2: " cat", 3: " sat", 4: " on", 5: " END", 6: "ING", 7: " here"}
    decode = lambda ids: "".join(words[i] for i in ids)
    assert stop_at([1, 2, 3, 4, 5, 6, 7], decode, ("ENDING", " on")) == ([1, 2, 3, 4], "The cat sat", True)
    assert stop_at([1, 2, 3, 4, 5, 6, 7], decode, ("NDI",)) == ([1, 2, 3, 4, 5, 6], "The cat sat on E", True)
    assert stop_at([1, 2, 3], decode, ("dog",)) == ([1, 2, 3], "The cat sat", False)
    assert stop_at([1, 2, 3], decode, ()) == ([1, 2, 3], "The cat sat", False)
