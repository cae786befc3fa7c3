"""Selectors: one budget, forced tokens and chunking for all; each ranks what it says it ranks."""

import dataclasses
import math

import torch

from spcli.config.scoring import PAPER_CHUNK, ScoreConfig, SelectConfig
from spcli.models.load import first_layers, load_causal_lm
from spcli.stages.select import budget, select_tokens
from spcli.stages.speculate import speculate
from spcli.evaluate.selectors import SELECTORS, Signals, select, speculator_signals

CPU = torch.device("cpu")
CFG = SelectConfig(keep=1.0, chunk=32, keep_first=4, keep_last=64, min_tokens=0, min_free=0, unit="chunk")  # exact budgets
N = 1000  # odd on purpose: the last chunk is short


def signals(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Signals(torch.rand(n, generator=g), torch.rand(n, generator=g) * 10, 0.0, 0.0, torch.rand(n, generator=g))


def test_every_selector_keeps_exactly_the_budget_and_the_forced_tokens():
    sig = signals()
    for selector in SELECTORS:
        for keep in (0.1, 0.3, 0.5):
            kept = select(selector, N, sig, CFG, keep, seed=1)
            assert kept.numel() == budget(N, keep), (selector, keep)
            assert torch.equal(kept, torch.unique(kept)), "ascending, no repeats"
            assert set(range(N - 64, N)) <= set(kept.tolist())
            if selector != "recency":
                assert set(range(4)) <= set(kept.tolist())


def test_unpruned_prompts_keep_everything_without_a_speculator_pass():
    short = SelectConfig(keep=1.0, min_tokens=256)
    for selector in SELECTORS:
        assert select(selector, 200, None, short, 0.1, 0).tolist() == list(range(200))
        assert select(selector, N, None, CFG, 1.0, 0).tolist() == list(range(N))


def test_recency_keeps_exactly_the_tail_and_sink_recency_adds_the_sink():
    b = budget(N, 0.3)
    assert select("recency", N, None, CFG, 0.3, 0).tolist() == list(range(N - b, N))
    assert select("sink-recency", N, None, CFG, 0.3, 0).tolist() == list(range(4)) + list(range(N - b + 4, N))


def test_random_is_seeded_and_picks_whole_chunks():
    a = select("random", N, None, CFG, 0.3, seed=7)
    assert torch.equal(a, select("random", N, None, CFG, 0.3, seed=7))
    assert not torch.equal(a, select("random", N, None, CFG, 0.3, seed=8))
    kept, forced = set(a.tolist()), set(range(4)) | set(range(N - 64, N))
    partial = 0
    for c in range(math.ceil(N / 32)):
        free = set(range(c * 32, min(N, c * 32 + 32))) - forced
        partial += bool(free) and 0 < len(free & kept) < len(free)
    assert partial <= 1, "only the chunk that meets the budget may be cut"


def test_speculator_selectors_rank_their_own_signal():
    sig = signals()
    sig.importance[320:352] = 100.0  # one chunk stands out in attention
    sig.surprisal[640:672] = 1000.0  # another in surprisal
    spec = set(select("specprefill", N, sig, CFG, 0.1, 0).tolist())
    info = set(select("self-information", N, sig, CFG, 0.1, 0).tolist())
    assert set(range(320, 352)) <= spec and not set(range(640, 672)) <= spec
    assert set(range(640, 672)) <= info and not set(range(320, 352)) <= info


def test_speculator_signals_reuse_one_pass_and_match_a_reference(tiny_dir):
    """Also with the prefill in chunks (64 does not divide n = 300): the hook gathers every chunk's states."""
    base = load_causal_lm(tiny_dir, "float32", CPU).model
    model = first_layers(base, 2)
    ids = list(range(1000, 1300))
    hooks_before = len(base.model._forward_hooks)
    cfg = ScoreConfig(lookahead=3, window=0, score_layers="all", pool=13, rows="mean")
    ref_importance = speculate(model, ids, cfg, set(), CPU).importance
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [n, V]
    ref = -torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    for chunk in (8192, 64):
        sig = speculator_signals(model, ids, cfg, set(), CPU, chunk=chunk)
        assert len(base.model._forward_hooks) == hooks_before, "the hook is removed (first_layers shares the dict)"
        torch.testing.assert_close(sig.importance, ref_importance, rtol=1e-4, atol=1e-6)
        assert sig.surprisal[0] == 0
        torch.testing.assert_close(sig.surprisal[1:], ref, rtol=1e-4, atol=1e-4)


def test_specprefill_paper_is_the_paper_recipe_on_the_same_speculator(tiny_dir):
    """`specprefill-paper` ranks by the look-ahead-8, every-layer importance; `specprefill` by the configured one."""
    base = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(300, 420))
    window = ScoreConfig(lookahead=0, window=16, score_layers="1", pool=13, rows="mean")
    sig = speculator_signals(base, ids, window, set(), CPU, with_surprisal=False, with_paper=True)
    paper = speculate(base, ids, ScoreConfig(lookahead=8, window=0, score_layers="all", pool=13, rows="mean"), set(), CPU).importance
    torch.testing.assert_close(sig.paper_importance, paper)
    torch.testing.assert_close(sig.importance, speculate(base, ids, window, set(), CPU).importance)
    assert not torch.allclose(sig.importance, sig.paper_importance) and sig.paper_s > 0
    cfg = SelectConfig(keep=1.0, chunk=8, keep_last=8, min_tokens=16, min_free=0)
    assert torch.equal(select("specprefill-paper", len(ids), sig, cfg, 0.3, 0),
                       select_tokens(paper, dataclasses.replace(cfg, chunk=PAPER_CHUNK), 0.3))  # its own chunk of 32
