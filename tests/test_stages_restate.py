"""The instruction read again after the prompt (spcli.stages.restate): what the speculator prefills, what
selection reads of it, and how the run and eval configs record it."""

from __future__ import annotations

import math
import dataclasses

import pytest
import torch

from spcli.config.run import FieldConfig, RunConfig

from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.stages.restate import MAX_RESTATED, restated_ids
from spcli.io.records import Record, put_instruction

SCORE = ScoreConfig(window=8, lookahead=0, score_layers="1", pool=1, rows="mean")
INSTRUCTION = "Answer the question about the notes below. Question: what is the access code for the boathouse?"
NOTES = " ".join(f"Note {i}: the code for shed {i} is {1000 + 37 * i}." for i in range(40))


@pytest.fixture(scope="module")
def stack(tiny_dir):
    from spcli.models.load import load_stack

    return load_stack(str(tiny_dir), "self:2", "float32", "cpu")


def record(instruction: str = INSTRUCTION, at: str = "before") -> Record:
    rec = Record(0, 0, "r", prompt=NOTES)
    put_instruction(rec, instruction, "instruction", at)
    return rec


def config(tiny_dir, restate: bool, at: str = "before") -> RunConfig:
    return RunConfig(inputs=("x",), out="y", model=str(tiny_dir), speculator="self:2",
                     select=SelectConfig(keep=0.2, chunk=8, keep_last=8, min_tokens=64, min_free=0, max_prune_cost=math.inf),
                     score=dataclasses.replace(SCORE, restate=restate), fields=FieldConfig(instruction_at=at))


def test_the_speculator_reads_the_instruction_again_and_selection_reads_the_prompt_alone(stack, tiny_dir):
    from spcli.stages.prepare import prepare
    from spcli.stages.speculate import speculate

    (on,) = prepare([record()], config(tiny_dir, True), stack)
    (off,) = prepare([record()], config(tiny_dir, False), stack)
    again = stack.tokenizer(INSTRUCTION, add_special_tokens=False)["input_ids"]
    assert on.restated == again and off.restated is None
    assert on.token_ids == off.token_ids  # the base's prompt is the same: the instruction once, first
    n = len(on.token_ids)
    assert on.speculator_prompt == on.token_ids + again
    assert on.importance.shape == off.importance.shape == (n,)
    direct = speculate(stack.speculator, on.token_ids + again, SCORE, stack.speculator_eos_ids, stack.device)
    torch.testing.assert_close(on.importance, direct.importance[:n])  # scored with the question at the end
    assert not torch.allclose(on.importance, off.importance)  # other query rows: another score
    assert int(on.kept.max()) < n


def test_an_instruction_after_the_prompt_is_not_read_again(stack, tiny_dir):
    """--instruction-at after (the default): the question already ends the prompt, so --restate adds nothing."""
    from spcli.stages.prepare import prepare

    (after,) = prepare([record(at="after")], config(tiny_dir, True, "after"), stack)
    assert after.restated is None
    question = stack.tokenizer(INSTRUCTION, add_special_tokens=False)["input_ids"]
    ids, k = after.token_ids, len(question)
    (start,) = [i for i in range(len(ids) - k + 1) if ids[i:i + k] == question]  # once, after the notes
    assert start > len(ids) // 2 and len(ids) - (start + k) < 16  # the prompt ends with it (and the chat template's end)
    assert set(range(start, start + k)) <= set(after.kept.tolist())  # never dropped


def test_a_record_without_instruction_and_keep_one_restate_nothing(stack, tiny_dir):
    from spcli.stages.prepare import prepare

    (plain,) = prepare([Record(0, 0, "p", prompt=NOTES)], config(tiny_dir, True), stack)
    assert plain.restated is None
    cfg = dataclasses.replace(config(tiny_dir, True), select=SelectConfig(keep=1.0))
    (full,) = prepare([record()], cfg, stack)
    assert full.restated is None and full.importance is None


def test_restated_tokens_are_the_instructions_end_within_the_room_left(stack):
    long = " ".join(f"word{i}" for i in range(400))
    ids = stack.tokenizer(long, add_special_tokens=False)["input_ids"]
    assert len(ids) > MAX_RESTATED
    assert restated_ids((long,), stack.tokenizer, 10**6) == ids[-MAX_RESTATED:]
    assert restated_ids((long,), stack.tokenizer, 5) == ids[-5:]
    assert restated_ids((long,), stack.tokenizer, 0) is None
    assert restated_ids((), stack.tokenizer, 100) is None


def test_the_fingerprint_records_restate_only_where_it_is_on():
    on = RunConfig(inputs=("x",), out="y").fingerprint_fields()
    off = RunConfig(inputs=("x",), out="y", score=ScoreConfig(restate=False)).fingerprint_fields()
    assert on["score"]["restate"] is True
    assert "restate" not in off["score"]  # what ran before --restate: those directories resume with --no-restate


def test_eval_variant_restate_is_a_scoring_variant():
    from spcli.errors import ConfigError
    from spcli.evaluate.config import SELECT_VARIANT_FIELDS, parse_variant

    assert parse_variant("restate=0") == (("restate", False),)
    assert parse_variant("restate=on,protect=") == (("restate", True), ("protect", ""))
    assert "restate" not in SELECT_VARIANT_FIELDS  # its own speculator pass, not a reselection of the first's
    with pytest.raises(ConfigError, match="restate takes 0 or 1"):
        parse_variant("restate=maybe")


def test_across_tokenizers_the_speculator_restates_in_its_own_tokens(tiny_other_dir):
    """A speculator of another tokenizer reads the instruction again in its own tokens; selection reads the base's."""
    from spcli.models.load import load_stack
    from spcli.stages.prepare import prepare

    stack = load_stack(str(tiny_other_dir), "smollm2-135m", "float32", "cpu", with_base=False)
    cfg = RunConfig(inputs=("x",), out="y", model=str(tiny_other_dir), speculator="smollm2-135m",
                    select=SelectConfig(keep=0.2, chunk=8, keep_last=8, min_tokens=64, min_free=0, max_prune_cost=math.inf),
                    score=ScoreConfig(window=8, lookahead=0, score_layers="14", pool=1, rows="mean"),
                    fields=FieldConfig(instruction_at="before"))
    (req,) = prepare([record()], cfg, stack)
    spec_tok = stack.speculator_tokens.tokenizer
    assert req.restated == spec_tok(INSTRUCTION, add_special_tokens=False)["input_ids"]
    assert req.speculator_prompt == req.speculator_ids + req.restated
    assert req.importance.shape == (len(req.token_ids),) and int(req.kept.max()) < len(req.token_ids)
