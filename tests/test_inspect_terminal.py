"""`spcli inspect DIR --id/--row` in the terminal: plain markers asserted exactly, styles on rich spans,
`--compare` of two runs. Output directories are written by `write_run` (no model runs)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import SelectConfig
from test_inspect_summary import ok_row, write_run

PROMPT = "one two three four five six seven eight nine ten eleven twelve"  # 12 tokens with the SmolLM2 tokenizer
SELECT = SelectConfig(keep=0.75, chunk=4, keep_first=1, keep_last=2, min_tokens=4)
KEPT = [0, 4, 5, 6, 7, 8, 9, 10, 11]  # token 0 and 10-11 forced; chunks 1 (4-7) and 2 (8-11) chosen
IMPORTANCE = [0.9, 0.1, 0.2, 0.1, 0.5, 0.6, 0.7, 0.8, 0.4, 0.3, 0.2, 0.1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture()
def small_run(tmp_path, tiny_dir):
    records = [{"id": "t1", "prompt": PROMPT}, {"id": "t2", "prompt": PROMPT}, {"id": "bad", "prompt": 3}]
    results = [ok_row(12, KEPT, 1.0, output="the answer", importance=IMPORTANCE), ok_row(12, list(range(12)), 1.0, output="other"),
               dict(error="in.jsonl:line 3: field 'prompt' must be a string, got int")]
    return write_run(tmp_path / "a", tiny_dir, records, results, SELECT, save_scores=True)


def invoke(*args: str):
    res = CliRunner().invoke(app, ["inspect", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_plain_mode_exactly(small_run):
    out = invoke(str(small_run), "--id", "t1", "--plain")
    assert out == ('t1 | 12 prompt tokens | kept 9 (75.0%) | length | output: "the answer"\n'
                   "⟪one⟫⟮ two three four⟯⟦ five six seven eight⟧⟦ nine ten⟧⟪ eleven twelve⟫\n")


def test_plain_is_the_default_when_piped_and_row_selects_by_position(small_run):
    assert invoke(str(small_run), "--row", "0") == invoke(str(small_run), "--id", "t1", "--plain")
    whole = invoke(str(small_run), "--row", "1")  # nothing pruned: all kept, nothing forced
    assert whole.splitlines()[1] == "⟦one two three four⟧⟦ five six seven eight⟧⟦ nine ten eleven twelve⟧"


def test_error_row_shows_its_error(small_run):
    assert invoke(str(small_run), "--id", "bad") == "bad | error: in.jsonl:line 3: field 'prompt' must be a string, got int\n"


def _view(run_dir, row_id: str):
    from spcli.inspect.outputs import load_run
    from spcli.inspect.tokens import load_view

    run = load_run(run_dir)
    return load_view(run, run.find(row_id=row_id))


def _styles(text) -> dict[str, str]:
    return {text.plain[s.start : s.end]: str(s.style) for s in text.spans}


def test_color_mode_styles_runs(small_run):
    from spcli.inspect import terminal

    view = _view(small_run, "t2")  # no importance: kept chunks alternate shades
    styles = _styles(terminal.row_text(view))
    assert styles == {"one two three four": terminal.COLOR["kept"][0], " five six seven eight": terminal.COLOR["kept"][1],
                      " nine ten eleven twelve": terminal.COLOR["kept"][0]}
    view = _view(small_run, "t1")
    view.importance = None
    styles = _styles(terminal.row_text(view))
    assert styles["one"] == styles[" eleven twelve"] == terminal.COLOR["forced"]
    assert styles[" two three four"] == terminal.COLOR["dropped"]
    assert styles[" five six seven eight"] != styles[" nine ten"]  # the chunk boundary shows
    mono = _styles(terminal.row_text(view, mono=True))
    assert mono == {"one": "reverse", " two three four": "dim", " five six seven eight": "bold underline",
                    " nine ten": "bold", " eleven twelve": "reverse"}


def test_importance_tints_tokens(small_run):
    from spcli.inspect import terminal
    from spcli.inspect.tokens import importance_levels

    view = _view(small_run, "t1")
    assert view.importance is not None
    levels = importance_levels(view.importance, 8).tolist()
    assert levels[0] == 7 and levels[1] == 0  # the highest and the lowest score
    text = terminal.row_text(view)
    by_start = {s.start: str(s.style) for s in text.spans}
    assert by_start[len("one")] == terminal.HEAT_DROPPED[levels[1]]  # " two" is dropped, least important
    assert by_start[len("one two three four")] == f"black on {terminal.HEAT_KEPT[levels[4]]} underline"  # kept, odd chunk
    assert "".join(view.pieces) == PROMPT


def test_color_output_through_the_runner(small_run):
    out = invoke(str(small_run), "--id", "t1", "--color", "--width", "40")
    assert "\x1b[" in out
    plain = ANSI.sub("", out)
    assert plain.splitlines()[0].startswith("t1 | 12 prompt tokens | kept 9")
    assert max(len(line) for line in plain.splitlines()) <= 40
    assert "kept: importance low" in plain
    assert "five six seven eight" in plain.replace("\n", " ")


def test_compare_two_runs(small_run, tmp_path, tiny_dir):
    records = [{"id": "t1", "prompt": PROMPT}, {"id": "t2", "prompt": PROMPT}]
    b = write_run(tmp_path / "b", tiny_dir, records,
                  [ok_row(12, [0, 1, 2, 3, 10, 11], 1.0, output="the answer"), ok_row(12, list(range(12)), 1.0, output="changed")],
                  SELECT)
    out = invoke(str(small_run), "--compare", str(b), "--width", "160")
    assert "2 ids in both, outputs match for 1 (50.0%); 1 only in A, 0 only in B" in out
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[:2] == [f"A: {small_run} (keep 0.75): wall 12.5 s, TTFT p50 1.000 s, speculator 1.0 s",
                         f"B: {b} (keep 0.75): wall 12.5 s, TTFT p50 1.000 s, speculator 1.0 s"]
    diff = invoke(str(small_run), "--compare", str(b), "--id", "t1")
    assert diff.splitlines()[2] == "outputs match"
    assert diff.splitlines()[3] == "⟦one⟧⟬B: two three four⟭⟬A: five six seven eight nine ten⟭⟦ eleven twelve⟧"


def test_changed_input_is_flagged(small_run):
    shard = small_run.parent / f"{small_run.name}-input.jsonl"
    lines = shard.read_text().splitlines()
    lines[0] = '{"id": "t1", "prompt": "' + PROMPT + ' thirteen"}'
    shard.write_text("\n".join(lines) + "\n")
    out = invoke(str(small_run), "--id", "t1")
    assert out.splitlines()[0].startswith("t1 | 13 prompt tokens | kept 9")
    assert out.splitlines()[1] == (f"warning: {shard} changed since the run: the prompt below may not be what was scored; "
                                   "re-tokenised to 13 tokens but the run saw 12: input or tokenizer changed")


def test_plain_markers_cannot_be_confused_with_the_prompts_own_brackets_and_periods(tmp_path, tiny_dir):
    prompt = "labs.[1] The (Secret) {x} end."
    records = [{"id": "p", "prompt": prompt}]
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(tiny_dir)(prompt, add_special_tokens=False)["input_ids"])
    run = write_run(tmp_path / "p", tiny_dir, records, [ok_row(n, [0, n - 1], 1.0)], SelectConfig(chunk=1, keep_first=0, keep_last=0))
    body = invoke(str(run), "--id", "p", "--plain").splitlines()[1]
    for marker in "⟦⟧⟮⟯⟪⟫":
        body = body.replace(marker, "")
    assert body == prompt, "removing the markers gives the prompt back exactly"


def test_two_chunk_shades_differ_on_a_16_colour_terminal():
    import io

    from rich.console import Console
    from rich.text import Text

    from spcli.inspect import terminal

    codes = []
    for style in terminal.COLOR["kept"]:
        buf = io.StringIO()
        Console(file=buf, force_terminal=True, color_system="standard").print(Text("x", style), end="")
        codes.append(buf.getvalue())
    assert codes[0] != codes[1], codes
