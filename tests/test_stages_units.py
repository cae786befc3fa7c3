"""Selection units (spcli.stages.units) and selection over them: no kept span ends inside a word or a number,
under both tokenizers of the cross-tokenizer path, and a short fact sentence is kept or dropped whole."""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest
import torch
from tiny_models import ALWAYS_PRUNE

from spcli.config.run import RunConfig

from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.stages.select import select_tokens
from spcli.stages.tokenize import encode, tokenize_units, units_from_ids
from spcli.stages.units import restrict, unit_ids, word_starts
from spcli.io.records import Record

WORDS = ("the", "vault", "code", "is", "482913.", "QX-4471-B", "3.14159", "Zürich", "東京タワー", "naïve", "🙂", "e.g.",
         "Dr.", "1,234,567", "https://example.com/a?b=c", "don't", "(see", "below)", "--", "x")
UNIT_CFG = lambda unit: SelectConfig(keep=0.1, chunk=4, keep_first=0, keep_last=0, min_tokens=0, min_free=0, unit=unit,
                                     max_unit=12)


def random_text(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(20, 120)):
        out.append(rng.choice(WORDS))
        out.append(rng.choice((" ", " ", " ", "  ", "\n", ". ", "\n\n")))
    return "".join(out)


def tokenizers(smollm2_dir, other_tokenizer_dir):
    from transformers import AutoTokenizer

    return [AutoTokenizer.from_pretrained(smollm2_dir), AutoTokenizer.from_pretrained(other_tokenizer_dir)]


def cut_inside_word(text: str, offsets, units: torch.Tensor) -> list[str]:
    """Unit edges that fall strictly inside a run of non-space characters (found by a regex, not by the code
    under test): the text around each."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    bad = []
    for i in (torch.nonzero(units[1:] != units[:-1]).flatten() + 1).tolist():
        c = offsets[i][0]
        if offsets[i][0] == offsets[i][1] or offsets[i - 1][0] == offsets[i - 1][1]:
            continue  # a token without characters (BOS, a template's special token) is no word
        if any(s < c < e for s, e in words):
            bad.append(repr(text[max(0, c - 8) : c] + "|" + text[c : c + 8]))
    return bad


@pytest.mark.parametrize("unit", ["clause", "sentence", "word"])
def test_no_unit_edge_falls_inside_a_word_under_either_tokenizer(unit, smollm2_dir, other_tokenizer_dir):
    rng = random.Random(0)
    for tok in tokenizers(smollm2_dir, other_tokenizer_dir):
        for _ in range(60):
            text = random_text(rng)
            enc = encode(Record(0, 0, "r", prompt=text), tok)
            units = unit_ids(enc.text, enc.offsets, unit, chunk=4, max_unit=12)
            assert units.shape == (len(enc.ids),) and units[0] == 0
            assert bool((units[1:] - units[:-1]).ge(0).all()) and bool((units[1:] - units[:-1]).le(1).all())
            assert cut_inside_word(enc.text, enc.offsets, units) == [], text


def test_fixed_chunks_do_cut_words(smollm2_dir, other_tokenizer_dir):
    """The check above can fail: the paper's fixed chunks cut through words and numbers."""
    rng = random.Random(1)
    tok = tokenizers(smollm2_dir, other_tokenizer_dir)[0]
    cuts = 0
    for _ in range(20):
        enc = encode(Record(0, 0, "r", prompt=random_text(rng)), tok)
        cuts += len(cut_inside_word(enc.text, enc.offsets, unit_ids(enc.text, enc.offsets, "chunk", 4, 12)))
    assert cuts > 0


def test_a_short_sentence_is_one_unit_and_a_long_one_splits_on_words(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    fact = "The access code for the east vault is 4829137."
    long = "This sentence runs on " + "and on " * 30 + "until it ends."
    text = f"Some prose comes first. {fact} {long}\nA line without a stop\nThe end."
    enc = encode(Record(0, 0, "r", prompt=text), tok)
    units = unit_ids(enc.text, enc.offsets, "sentence", chunk=8, max_unit=32)
    covers = lambda s: [i for i, (a, b) in enumerate(enc.offsets) if a < text.index(s) + len(s) and b > text.index(s)]
    fact_units = set(units[covers(fact)].tolist())
    assert len(fact_units) == 1
    (u,) = fact_units
    assert set(torch.nonzero(units == u).flatten().tolist()) == set(covers(fact))  # nothing else shares its unit
    long_units = units[covers(long)]
    assert len(set(long_units.tolist())) > 1  # split into pieces ...
    assert cut_inside_word(enc.text, enc.offsets, units) == []  # ... on word starts
    line = covers("A line without a stop")
    assert units[line[0]] != units[line[0] - 1]  # a newline starts a unit


def test_selection_keeps_whole_units_and_the_budget_to_half_a_unit():
    rng = torch.Generator().manual_seed(0)
    for trial in range(50):
        n = 400 + trial
        sizes = torch.randint(1, 13, (n,), generator=rng)
        units = torch.repeat_interleave(torch.arange(n), sizes)[:n]
        importance = torch.rand(n, generator=rng)
        cfg = SelectConfig(keep=0.2, chunk=8, keep_first=4, keep_last=16, min_tokens=0, min_free=0, unit="sentence")
        kept = torch.zeros(n, dtype=torch.bool)
        kept[select_tokens(importance, cfg, units=units)] = True
        forced = torch.zeros(n, dtype=torch.bool)
        forced[:4] = forced[-16:] = True
        for u in units.unique().tolist():
            free = (units == u) & ~forced
            if free.any():
                assert kept[free].all() or not kept[free].any(), f"unit {u} cut"
        target = -(-n // 5)
        assert abs(int(kept.sum()) - target) <= 6  # within half of the largest unit (12)


@pytest.mark.parametrize("reduction", ["mean", "max", "top2"])
def test_the_best_unit_wins_under_each_reduction(reduction):
    units = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    importance = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.9, 0.8, 0.2, 0.2, 0.2, 0.2])
    cfg = SelectConfig(keep=0.2, chunk=4, keep_first=0, keep_last=0, min_tokens=0, min_free=0, unit_score=reduction)
    assert select_tokens(importance, cfg, units=units).tolist() == [4, 5]


def test_max_and_mean_differ_where_one_token_stands_out():
    units = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    importance = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.4, 0.4, 0.4, 0.4])
    base = dict(keep=0.5, chunk=4, keep_first=0, keep_last=0, min_tokens=0, min_free=0)
    assert select_tokens(importance, SelectConfig(unit_score="max", **base), units=units).tolist() == [0, 1, 2, 3]
    assert select_tokens(importance, SelectConfig(unit_score="mean", **base), units=units).tolist() == [4, 5, 6, 7]


def test_the_floor_keeps_min_free_chosen_tokens_beyond_the_forced_ones():
    n = 1000
    importance = torch.rand(n, generator=torch.Generator().manual_seed(0))
    cfg = SelectConfig(keep=0.1, chunk=8, min_free=128, min_tokens=512, unit="chunk")
    assert select_tokens(importance, cfg).numel() == 4 + 64 + 128  # not ceil(0.1 x 1000) = 100
    assert select_tokens(torch.rand(4000), cfg).numel() == 400  # the keep rate where it gives more
    assert select_tokens(importance, SelectConfig(keep=0.1, chunk=8, min_free=0, unit="chunk")).numel() == 100
    assert select_tokens(torch.rand(500), cfg).numel() == 500  # below min_tokens: whole


def test_protected_tokens_are_kept_outside_the_budget():
    n = 1000
    importance = torch.rand(n, generator=torch.Generator().manual_seed(1))
    protected = torch.zeros(n, dtype=torch.bool)
    protected[100:300] = True
    cfg = SelectConfig(keep=0.2, chunk=8, min_free=0, unit="chunk")
    kept = select_tokens(importance, cfg, protected=protected)
    assert set(range(100, 300)) <= set(kept.tolist())
    assert kept.numel() == 200 + 200  # the budget of 200 is chosen among the rest


def test_restrict_renumbers_and_starts_a_unit_at_the_cut():
    units = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3])
    assert restrict(units, [0, 1, 2, 3, 4, 5, 6, 7]).tolist() == units.tolist()
    assert restrict(units, [0, 1, 3, 4, 7]).tolist() == [0, 0, 1, 1, 2]
    assert restrict(units, [3, 4, 6, 7]).tolist() == [0, 0, 1, 2]


def test_truncated_prompt_units_match_its_ids(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    rec = Record(0, 0, "r", prompt="One sentence here. " * 100)
    ids, layout = tokenize_units(rec, tok, 120, "middle", "", UNIT_CFG("sentence"))
    units = layout.units
    assert len(ids) == 120 and units.shape == (120,) and layout.protected is None
    assert units[60] != units[59]  # the middle cut starts a unit


def test_units_from_ids_follow_words(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = "The access code for the east vault is 4829137. " * 5
    ids = tok(text, add_special_tokens=False)["input_ids"]
    units = units_from_ids(tok, ids, UNIT_CFG("word"))
    pieces = [tok.decode([i]) for i in ids]
    for i in (torch.nonzero(units[1:] != units[:-1]).flatten() + 1).tolist():
        assert pieces[i][:1].isspace() or pieces[i - 1][-1:].isspace(), (pieces[i - 1], pieces[i])


def test_word_starts_marks_empty_tokens_and_the_first():
    text = "ab cd"
    assert word_starts(text, [(0, 0), (0, 2), (2, 3), (3, 5)]).tolist() == [True, True, True, True]
    assert word_starts(text, [(0, 1), (1, 2), (2, 5)]).tolist() == [True, False, True]


def test_fingerprint_of_chunk_selection_is_as_before_units():
    """A directory made before units (fixed chunks, no floor) resumes with --unit chunk --min-free 0."""
    old = RunConfig(inputs=("x",), out="y", select=SelectConfig(unit="chunk", min_free=0)).fingerprint_fields()["select"]
    assert not {"unit", "max_unit", "unit_score", "min_free"} & set(old)
    new = RunConfig(inputs=("x",), out="y").fingerprint_fields()["select"]
    assert new["unit"] == "clause" and new["min_free"] == 128


def test_cross_tokenizer_run_keeps_base_units_whole(tiny_other_dir):
    """The speculator reads its own tokens; selection keeps whole units of the base's tokens."""
    from spcli.models.load import load_stack
    from spcli.stages.prepare import prepare

    stack = load_stack(str(tiny_other_dir), "smollm2-135m", "float32", "cpu", with_base=False)
    text = " ".join(f"Fact {i}: the code for locker {i} is {1000 + 37 * i}." for i in range(60)) + " Which locker?"
    cfg = RunConfig(inputs=("x",), out="y", model=str(tiny_other_dir), speculator="smollm2-135m",
                    select=SelectConfig(keep=0.1, chunk=8, keep_last=16, min_tokens=64, min_free=32, max_prune_cost=math.inf),
                    score=ScoreConfig(window=32, lookahead=0, score_layers="14", pool=31, rows="mean"))
    (req,) = prepare([Record(0, 0, "r", prompt=text)], cfg, stack)
    assert req.alignment is not None and req.units is not None and req.units.shape == (len(req.token_ids),)
    kept = torch.zeros(len(req.token_ids), dtype=torch.bool)
    kept[req.kept] = True
    forced = req.forced.clone()
    forced[:4] = forced[-16:] = True
    for u in req.units.unique().tolist():
        free = (req.units == u) & ~forced
        if free.any():
            assert kept[free].all() or not kept[free].any(), f"unit {u} cut"
    enc = encode(Record(0, 0, "r", prompt=text), stack.tokenizer)
    assert cut_inside_word(enc.text, enc.offsets, req.units) == []


def test_instruction_field_goes_after_the_prompt_and_is_never_dropped(tmp_path, tiny_dir, write_jsonl):
    """Issue 31: a record's instruction is put beside its prompt (after it, or its last user message, by default:
    issue 40) and kept whole at keep 0.1, outside the budget; --protect '' selects it like any other text."""
    import json

    from typer.testing import CliRunner

    from spcli.cli import app
    from test_job_run import read_outputs

    instruction = "Summarise this support ticket in one sentence, then give its category."
    ticket = "The printer on floor three jams whenever someone prints duplex pages. " * 40
    src = write_jsonl([{"id": "p", "prompt": ticket, "instruction": instruction},
                       {"id": "m", "messages": [{"role": "system", "content": "You are terse. " * 20},
                                                {"role": "user", "content": ticket}], "instruction": instruction}])
    kept_share = {}
    for protect in ("system,instruction", ""):
        out = tmp_path / f"out{protect or 'none'}"
        res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--speculator",
                                       "self:2", "--dtype", "float32", "--keep", "0.1", "--max-tokens", "2",
                                       "--protect", protect, *ALWAYS_PRUNE, "--save-scores", "--output-format", "jsonl"])
        assert res.exit_code == 0, res.output
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_dir)
        rows = {r["id"]: r for r in read_outputs(out)}
        for rid, rec in (("p", Record(0, 0, "p", prompt=f"{ticket}\n\n{instruction}", protected=(instruction,))),
                         ("m", Record(0, 0, "m", messages=[{"role": "system", "content": "You are terse. " * 20},
                                                          {"role": "user", "content": f"{ticket}\n\n{instruction}"}]))):
            enc = encode(rec, tok)
            assert len(enc.ids) == rows[rid]["num_prompt_tokens"]
            start = enc.text.index(instruction)
            on = [i for i, (a, b) in enumerate(enc.offsets) if a < start + len(instruction) and b > start]
            kept = set(rows[rid]["kept_indices"])
            kept_share[protect, rid] = sum(i in kept for i in on) / len(on)
            if rid == "m":
                s = enc.text.index("You are terse.")
                system = [i for i, (a, b) in enumerate(enc.offsets) if a < s + 20 * 15 and b > s]
                kept_share[protect, "system"] = sum(i in kept for i in system) / len(system)
        doc = json.loads((out / "manifest.json").read_text())
        assert doc["fingerprint_fields"]["select"].get("protect") == (protect or None)
    assert kept_share["system,instruction", "p"] == kept_share["system,instruction", "m"] == 1.0
    assert kept_share["system,instruction", "system"] == 1.0
    assert kept_share["", "system"] < 1.0  # the same prompts without protection (the instruction of "p", one short
    # sentence in a chat message now, may or may not be chosen by the random tiny model)


def test_a_bad_instruction_is_an_error_row_naming_the_field(tmp_path):
    from spcli.config.run import FieldConfig
    from spcli.io.records import to_record
    from spcli.io.shards import Shard

    shard = Shard(0, str(tmp_path / "in.jsonl"), "in")
    rec = to_record({"prompt": "x", "instruction": 3}, shard, 0, "jsonl", FieldConfig())
    assert rec.error.endswith("field 'instruction' must be a non-empty string, got 3")
    rec = to_record({"messages": [{"role": "system", "content": "s"}], "instruction": "do"}, shard, 0, "jsonl", FieldConfig())
    assert "needs a user message" in rec.error
    rec = to_record({"prompt": "text", "todo": "do it"}, shard, 1, "jsonl", FieldConfig(instruction="todo"))
    assert rec.error is None and rec.prompt == "text\n\ndo it" and rec.protected == ("do it",)


RUN_ON = ("It was one of those things that happens when you are young and you think you know better than everyone "
          "around you, the ferry to Halden leaves from pier 436580. and a fool later, instead of just taking the "
          "advice, I went on. Most people thought that the serial number of the red bicycle is 388478. to dismiss "
          "an idea is easy; the hard part is to see it. Nobody minded")
RUN_ON_FACTS = ("the ferry to Halden leaves from pier 436580.", "the serial number of the red bicycle is 388478.")


def unit_texts(tok, text: str, unit: str) -> list[str]:
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    units = unit_ids(text, enc["offset_mapping"], unit, 8, 32).tolist()
    spans: dict[int, list[int]] = {}
    for (a, b), u in zip(enc["offset_mapping"], units):
        spans.setdefault(u, [a, b])[1] = b
    return [text[a:b] for a, b in spans.values()]


def test_clause_units_keep_a_fact_set_into_running_prose_with_its_subject(smollm2_dir, other_tokenizer_dir):
    """Issue 56: a fact inserted between two words of a sentence, ending in '. ' before a lower-case word (no
    sentence end for Bling Fire): unit sentence cut the number from its subject; unit clause keeps each fact
    inside one unit, under both tokenizers (SmolLM2's digits are single tokens after a lone space)."""
    for tok in tokenizers(smollm2_dir, other_tokenizer_dir):
        clause = unit_texts(tok, RUN_ON, "clause")
        for fact in RUN_ON_FACTS:
            assert any(fact in u for u in clause), (fact, clause)
        sentence = unit_texts(tok, RUN_ON, "sentence")
        assert not all(any(f in u for u in sentence) for f in RUN_ON_FACTS), sentence  # what the issue saw
        assert any(u.strip() == "to dismiss an idea is easy;" for u in clause), clause  # ';' ends a clause


def test_clause_pieces_never_begin_at_a_value_or_the_two_words_before_it():
    """A long clause without punctuation: pieces never start at a number, a capitalised name or the two words
    before one (the blank token some tokenizers put before digits goes with them)."""
    from spcli.stages.units import bound, value_words

    words = "we met on the quay where the ferry to Halden leaves from pier 436580 when Maya Okafor said so".split()
    text = " ".join(words)
    offsets, pos = [], 0
    for w in words:  # a tokenizer that puts the space apart before digits, as SmolLM2's does
        if w[0].isdigit():
            offsets += [(pos, pos + 1), (pos + 1, pos + 1 + len(w))]
        else:
            offsets.append((pos, pos + 1 + len(w)))
        pos += 1 + len(w)
    text = " " + text
    is_word = word_starts(text, offsets)
    kinds = value_words(text, offsets, is_word, np.eye(1, len(offsets), 0, dtype=bool)[0])
    starts = [text[a:b].strip() for (a, b), k in zip(offsets, kinds) if k == 1]
    assert starts == ["Halden", "436580", "Maya", "Okafor"]
    banned = {text[a:b].strip() for (a, b), x in zip(offsets, bound(is_word, kinds)) if x}
    assert banned == {"ferry", "to", "Halden", "leaves", "from", "pier", "", "436580", "when", "Maya", "Okafor"}
    units = unit_ids(text, offsets, "clause", 2, 12)  # 21 tokens: split into pieces of ~2, none longer than 12
    firsts = [text[offsets[i][0]:offsets[i][1]].strip() for i in range(len(offsets))
              if i == 0 or units[i] != units[i - 1]]
    assert len(firsts) > 3 and not set(firsts) & banned, firsts
    assert unit_ids(text, offsets, "sentence", 2, 12).unique().numel() > len(firsts)  # words alone: more pieces


def test_cut_values_counts_a_value_dropped_right_after_a_kept_word(smollm2_dir):
    """spcli eval's cut count (issue 56 item 4): a number or name dropped while the word before it was kept is a cut
    fact; kept with it, or dropped with it, is not."""
    from spcli.stages.units import cut_values

    tok = tokenizers(smollm2_dir, smollm2_dir)[0]
    text = "the ferry to Halden leaves from pier 436580 and the rest is filler"
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    offsets = enc["offset_mapping"]
    upto = lambda word: max(i for i, (a, _) in enumerate(offsets) if a < text.index(word) + len(word))
    is_kept = np.zeros(len(offsets), dtype=bool)
    is_kept[: upto("pier") + 1] = True  # the subject kept, the number dropped
    cut = cut_values(text, offsets, is_kept)
    assert [text[offsets[i][0]:offsets[i][1]].strip() for i in cut] in (["4"], [""], ["436580"])
    is_kept[: upto("436580") + 1] = True  # the number kept with it
    assert cut_values(text, offsets, is_kept) == []
    is_kept[:] = False
    is_kept[: upto("to") + 1] = True  # the name dropped right after a kept word
    assert len(cut_values(text, offsets, is_kept)) == 1
    is_kept[:] = False  # nothing kept: nothing cut
    assert cut_values(text, offsets, is_kept) == []
