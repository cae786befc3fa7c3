"""spcli inspect's check of what was dropped (issue 56 item 4): a number or name dropped right after a kept word."""

import numpy as np

from spcli.inspect.tokens import cut_note


def test_cut_note_names_a_value_dropped_right_after_its_kept_subject():
    pieces = ["the", " ferry", " to", " Hal", "den", " leaves", " from", " pier", " ", "436", "580", ".", " and", " so"]
    kept = np.array([True] * 8 + [False] * 4 + [True] * 2)  # "pier" kept, " 436580." dropped
    assert cut_note(pieces, kept) == ("1 number, code or name dropped right after a kept word (a fact cut from its "
                                      "subject?): 436580.")
    kept[8:12] = True  # kept with its subject: nothing cut
    assert cut_note(pieces, kept) is None
    kept[:] = True
    assert cut_note(pieces, kept) is None
    kept[3:5] = False  # the name dropped right after "to"
    assert "Halden" in cut_note(pieces, kept)
