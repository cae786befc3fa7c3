"""The shared speculator pass (spcli/stages/speculate_shared.py) against speculate.speculate on each prompt alone.

The tiny model has 3 layers (SmolLM2-135M: 30; tests/tiny_models.py)."""

import dataclasses

import pytest
import torch

from spcli.config.scoring import ScoreConfig
from spcli.models.load import load_causal_lm
from spcli.stages.batching import prefix_batches
from spcli.stages.speculate import speculate
from spcli.stages.speculate_shared import shared_prefix_len, speculate_shared

CPU = torch.device("cpu")
DOC = list(range(1000, 1057))  # p = 57 shared tokens
SUFFIXES = [list(range(3000, 3011)), list(range(4000, 4003)), list(range(5000, 5025)), [6000]]
WINDOW = ScoreConfig(lookahead=0, window=16, score_layers="1", pool=5, rows="mean")  # suffixes of 1-25 tokens: 16 rows
CONFIGS = {
    "window": WINDOW,
    "window-max-all-layers": ScoreConfig(lookahead=0, window=31, score_layers="all", pool=5, rows="max"),
    "window+lookahead": ScoreConfig(lookahead=3, window=4, score_layers="all", pool=5, rows="mean"),
    "paper": ScoreConfig(lookahead=4, window=0, score_layers="all", pool=13, rows="mean"),
}


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_causal_lm(tiny_dir, "float32", CPU).model


def assert_close(name, ref, got, rtol=1e-5, atol=1e-7):
    err = (ref - got).abs().max().item()
    assert torch.allclose(ref, got, rtol=rtol, atol=atol), f"{name}: max abs error {err:.3g}"


def embedded(model):
    """[(rows, columns)] of every forward call, from a hook on the embedding (every pass, early exit or not)."""
    calls = []
    handle = model.model.embed_tokens.register_forward_hook(lambda _m, args, _o: calls.append(tuple(args[0].shape)))
    return calls, handle


def test_shared_prefix_is_cut_to_leave_each_prompt_a_token():
    assert shared_prefix_len([DOC + s for s in SUFFIXES]) == len(DOC)
    assert shared_prefix_len([DOC, DOC + [7]]) == len(DOC) - 1
    assert shared_prefix_len([DOC]) == len(DOC) - 1
    assert shared_prefix_len([[1, 2], [3, 4]]) == 0


@pytest.mark.parametrize("name", CONFIGS)
def test_each_prompt_scores_as_alone(model, name):
    cfg = CONFIGS[name]
    prompts = [DOC + s for s in SUFFIXES]
    shared = speculate_shared(model, prompts, cfg, eos_ids=set(), device=CPU, with_unpooled=True)
    assert shared.num_shared == len(DOC) and shared.num_suffix_tokens == list(map(len, SUFFIXES))
    for b, (prompt, spec) in enumerate(zip(prompts, shared.speculations)):
        alone = speculate(model, prompt, cfg, eos_ids=set(), device=CPU, with_unpooled=True)
        assert spec.lookahead_ids == alone.lookahead_ids and spec.num_query_rows == alone.num_query_rows
        assert_close(f"{name} prompt {b}", alone.importance, spec.importance)
        assert_close(f"{name} prompt {b} unpooled", alone.unpooled, spec.unpooled)
    steps = sum(len(s.lookahead_ids) for s in shared.speculations)
    assert shared.num_speculator_tokens == len(DOC) + sum(map(len, SUFFIXES)) + steps


def test_prefix_is_prefilled_once(model):
    prompts = [DOC + s for s in SUFFIXES]
    calls, handle = embedded(model)
    try:
        speculate_shared(model, prompts, WINDOW, eos_ids=set(), device=CPU)
        assert calls == [(1, len(DOC)), (len(SUFFIXES), 25)]  # the prefix once, then every suffix left-padded
        calls.clear()
        speculate_shared(model, prompts, CONFIGS["window+lookahead"], eos_ids=set(), device=CPU)
        assert calls[:2] == [(1, len(DOC)), (len(SUFFIXES), 25)] and set(calls[2:]) == {(len(SUFFIXES), 1)}
        calls.clear()
        for p in prompts:  # today's path, for contrast: the document once per prompt
            speculate(model, p, WINDOW, eos_ids=set(), device=CPU)
        assert sum(r * c for r, c in calls) == len(SUFFIXES) * len(DOC) + sum(map(len, SUFFIXES))
    finally:
        handle.remove()


def test_chunked_prefix_and_split_suffix_batches_score_the_same(model):
    prompts = [DOC + s for s in SUFFIXES]
    cfg = CONFIGS["window+lookahead"]
    whole = speculate_shared(model, prompts, cfg, eos_ids=set(), device=CPU)
    calls, handle = embedded(model)
    try:
        split = speculate_shared(model, prompts, cfg, eos_ids=set(), device=CPU, chunk=13, max_batch_tokens=150)
    finally:
        handle.remove()
    assert calls[:5] == [(1, 13)] * 4 + [(1, 5)]  # 57 = 4 x 13 + 5, once
    assert prefix_batches(len(DOC), list(map(len, SUFFIXES)), 150) == [[0, 1], [2], [3]]
    for a, b in zip(whole.speculations, split.speculations):
        assert a.lookahead_ids == b.lookahead_ids
        assert_close("chunk 13, batches of 150 tokens", a.importance, b.importance)


def test_one_prompt_and_no_shared_prefix(model):
    prompt = DOC + SUFFIXES[0]
    one = speculate_shared(model, [prompt], WINDOW, eos_ids=set(), device=CPU)
    assert one.num_shared == len(prompt) - 1
    assert_close("Q = 1", speculate(model, prompt, WINDOW, set(), CPU).importance, one.speculations[0].importance)
    apart = [list(range(10, 73)), list(range(200, 240))]
    none = speculate_shared(model, apart, dataclasses.replace(WINDOW, pool=1), eos_ids=set(), device=CPU)
    assert none.num_shared == 0 and none.num_speculator_tokens == 63 + 40
    for p, spec in zip(apart, none.speculations):
        assert_close("p = 0", speculate(model, p, dataclasses.replace(WINDOW, pool=1), set(), CPU).importance,
                     spec.importance)
