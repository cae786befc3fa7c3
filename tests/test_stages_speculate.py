"""Speculator pass and scoring against a brute-force reference from eager attention weights.

The tiny model has 3 layers; real SmolLM2-135M has 30 (tests/conftest.py)."""

import dataclasses

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from spcli.config.scoring import ScoreConfig
from spcli.models import capture
from spcli.models.load import first_layers, load_causal_lm
from spcli.stages.speculate import speculate, speculate_batch

CPU = torch.device("cpu")


def paper(lookahead: int, pool: int) -> ScoreConfig:
    """The paper's rows: the last prompt token and the look-ahead, every layer."""
    return ScoreConfig(lookahead=lookahead, window=0, score_layers="all", pool=pool, rows="mean")


def brute_force(model_dir, ids, lookahead_ids, pool):
    """Eager attention over prompt + look-ahead; renormalise each query row over the n prompt keys."""
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    n, steps = len(ids), len(lookahead_ids) + 1
    full = torch.tensor([ids + lookahead_ids])
    with torch.no_grad():
        att = eager(full, attention_mask=torch.ones_like(full), output_attentions=True).attentions
    per_step = []
    for s in range(steps):
        rows = torch.stack([a[0, :, n - 1 + s, :n] for a in att])  # [L, H, n]
        rows = rows / rows.sum(-1, keepdim=True)
        if pool > 1:
            rows = F.avg_pool1d(rows.reshape(-1, 1, n), pool, 1, pool // 2, count_include_pad=True).reshape(rows.shape)
        per_step.append(rows.amax(dim=(0, 1)))
    return torch.stack(per_step).mean(0)


def test_importance_equals_eager_attention_brute_force(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(100, 160))
    for pool in (1, 5):
        spec = speculate(model, ids, paper(3, pool), eos_ids=set(), device=CPU)
        assert spec.num_query_rows == 1 + len(spec.lookahead_ids) == 4
        ref = brute_force(tiny_dir, ids, spec.lookahead_ids, pool)
        torch.testing.assert_close(spec.importance, ref, rtol=1e-4, atol=1e-6)


def test_lookahead_zero_scores_last_prompt_token_only(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(200, 240))
    spec = speculate(model, ids, paper(0, 1), eos_ids=set(), device=CPU)
    assert spec.num_query_rows == 1 and spec.lookahead_ids == []
    torch.testing.assert_close(spec.importance, brute_force(tiny_dir, ids, [], 1), rtol=1e-4, atol=1e-6)


def test_steps_after_eos_are_dropped(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(300, 340))
    free = speculate(model, ids, paper(4, 1), eos_ids=set(), device=CPU)
    stop_at = free.lookahead_ids[2]  # pretend the third look-ahead token is EOS
    cut = speculate(model, ids, paper(4, 1), eos_ids={stop_at}, device=CPU)
    first_eos = free.lookahead_ids.index(stop_at)
    assert cut.lookahead_ids == free.lookahead_ids[:first_eos]
    assert cut.num_query_rows == 1 + first_eos


def test_self_k_shares_every_parameter(tiny_dir):
    base = load_causal_lm(tiny_dir, "float32", CPU).model
    view = first_layers(base, 2)
    base_ptrs = {p.data_ptr() for p in base.parameters()}
    assert {p.data_ptr() for p in view.parameters()} <= base_ptrs
    assert len(view.model.layers) == 2 and len(base.model.layers) == 3
    assert base.config.num_hidden_layers == 3  # the base is untouched
    # The view really runs 2 layers: same as a model truncated by hand.
    ids = list(range(10, 50))
    spec = speculate(view, ids, paper(2, 1), eos_ids=set(), device=CPU)
    assert spec.importance.shape == (40,)


def test_self_k_out_of_range_is_refused(tiny_dir):
    import pytest

    from spcli.errors import ConfigError

    base = load_causal_lm(tiny_dir, "float32", CPU).model
    with pytest.raises(ConfigError, match="1 <= K <= 3"):
        first_layers(base, 4)


def test_capture_is_registered_under_its_own_name():
    assert capture.register() == "spcli"


def brute_force_rows(model_dir, ids, lookahead_ids, pool, window, layers, reduce="mean"):
    """Eager attention: the last `window` prompt rows (causal: each already normalised over the keys
    up to its own position) and the look-ahead rows renormalised over the n prompt keys, at `layers`."""
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    n = len(ids)
    full = torch.tensor([ids + lookahead_ids])
    with torch.no_grad():
        att = eager(full, attention_mask=torch.ones_like(full), output_attentions=True).attentions
    positions = [*range(n - window, n), *range(n, n + len(lookahead_ids))]
    per_row = []
    for p in positions:
        rows = torch.stack([att[layer][0, :, p, :n] for layer in layers])  # [L_s, H, n]
        assert torch.all(rows[..., p + 1 :] == 0)  # causal: nothing after its own position
        rows = rows / rows.sum(-1, keepdim=True)
        if pool > 1:
            rows = F.avg_pool1d(rows.reshape(-1, 1, n), pool, 1, pool // 2, count_include_pad=True).reshape(rows.shape)
        per_row.append(rows.amax(dim=(0, 1)))
    return torch.stack(per_row).mean(0) if reduce == "mean" else torch.stack(per_row).amax(0)


def test_window_rows_are_causal_and_match_eager_attention(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(400, 463))  # n = 63
    for window, layers, lookahead in ((17, "1", 0), (8, "0,2", 0), (5, "all", 2), (1, "-1", 0)):
        cfg = ScoreConfig(lookahead=lookahead, window=window, score_layers=layers, pool=5, rows="mean")
        spec = speculate(model, ids, cfg, eos_ids=set(), device=CPU)
        assert spec.num_query_rows == window + len(spec.lookahead_ids)
        ref = brute_force_rows(tiny_dir, ids, spec.lookahead_ids, 5, window, cfg.layers(3))
        torch.testing.assert_close(spec.importance, ref, rtol=1e-4, atol=1e-6)
    cfg = ScoreConfig(lookahead=2, window=5, score_layers="all", pool=5, rows="max")  # --rows max: the max over rows
    spec = speculate(model, ids, cfg, eos_ids=set(), device=CPU)
    ref = brute_force_rows(tiny_dir, ids, spec.lookahead_ids, 5, 5, cfg.layers(3), "max")
    torch.testing.assert_close(spec.importance, ref, rtol=1e-4, atol=1e-6)


def test_score_layer_choice_changes_the_importance(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(500, 560))
    one = speculate(model, ids, ScoreConfig(lookahead=0, window=16, score_layers="0", pool=1, rows="mean"), set(), CPU).importance
    two = speculate(model, ids, ScoreConfig(lookahead=0, window=16, score_layers="2", pool=1, rows="mean"), set(), CPU).importance
    both = speculate(model, ids, ScoreConfig(lookahead=0, window=16, score_layers="0,2", pool=1, rows="mean"), set(), CPU).importance
    assert not torch.allclose(one, two)
    assert torch.all(both >= torch.minimum(one, two) - 1e-7)  # a max over both layers per row, then a mean


def count_calls(model):
    calls = {"layers": [0] * len(model.model.layers), "norm": 0, "lm_head": 0}

    def layer_hook(i):
        def hook(*_):
            calls["layers"][i] += 1
        return hook

    handles = [layer.register_forward_hook(layer_hook(i)) for i, layer in enumerate(model.model.layers)]
    handles.append(model.model.norm.register_forward_hook(lambda *_: calls.__setitem__("norm", calls["norm"] + 1)))
    handles.append(model.lm_head.register_forward_hook(lambda *_: calls.__setitem__("lm_head", calls["lm_head"] + 1)))
    return calls, handles


def test_early_exit_runs_only_the_layers_it_needs(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(600, 650))
    calls, handles = count_calls(model)
    try:
        speculate(model, ids, ScoreConfig(lookahead=0, window=8, score_layers="1", pool=1, rows="mean"), set(), CPU)
        assert calls == {"layers": [1, 1, 0], "norm": 0, "lm_head": 0}  # layers 0-1, no norm, no logits
        speculate(model, ids, ScoreConfig(lookahead=2, window=8, score_layers="1", pool=1, rows="mean"), set(), CPU)
        assert calls["layers"] == [4, 4, 3] and calls["lm_head"] == 3  # look-ahead needs the whole model
    finally:
        for h in handles:
            h.remove()


def test_unpooled_is_the_same_pass_scored_at_pool_1(tiny_dir):
    """with_unpooled (keep auto's budget): the importance at pool 1 from the same rows and keys, batched as alone;
    brute force (eager attention) for the paper's rows, and none unless asked."""
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    prompts = [list(range(100, 160)), list(range(300, 340))]
    for cfg in (paper(3, 5), ScoreConfig(lookahead=0, window=16, score_layers="1", pool=5, rows="max")):
        together = speculate_batch(model, prompts, cfg, eos_ids=set(), device=CPU, with_unpooled=True)
        for p, spec in zip(prompts, together):
            at_1 = speculate(model, p, dataclasses.replace(cfg, pool=1), eos_ids=set(), device=CPU)
            torch.testing.assert_close(spec.unpooled, at_1.importance, rtol=1e-5, atol=1e-7)
            assert not torch.equal(spec.unpooled, spec.importance), "pool 5 smooths"
            if cfg.lookahead:
                torch.testing.assert_close(spec.unpooled, brute_force(tiny_dir, p, spec.lookahead_ids, 1),
                                           rtol=1e-4, atol=1e-6)
    assert speculate(model, prompts[0], paper(3, 5), eos_ids=set(), device=CPU).unpooled is None


def test_batched_importance_equals_one_at_a_time(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    prompts = [list(range(700, 763)), list(range(800, 840)), list(range(900, 1000)), list(range(20, 29))]
    for cfg in (ScoreConfig(lookahead=0, window=16, score_layers="1", pool=5, rows="mean"),
                ScoreConfig(lookahead=3, window=4, score_layers="all", pool=5, rows="mean"),
                paper(4, 13)):
        together = speculate_batch(model, prompts, cfg, eos_ids=set(), device=CPU)
        for p, spec in zip(prompts, together):
            alone = speculate(model, p, cfg, eos_ids=set(), device=CPU)
            assert spec.lookahead_ids == alone.lookahead_ids and spec.num_query_rows == alone.num_query_rows
            torch.testing.assert_close(spec.importance, alone.importance, rtol=1e-5, atol=1e-7)


def test_batched_lookahead_stops_each_prompt_at_its_own_eos(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    prompts = [list(range(300, 340)), list(range(1300, 1370))]
    free = speculate_batch(model, prompts, paper(4, 1), eos_ids=set(), device=CPU)
    stop = free[0].lookahead_ids[1]
    cut = speculate_batch(model, prompts, paper(4, 1), eos_ids={stop}, device=CPU)
    for f, c in zip(free, cut):
        expected = f.lookahead_ids[: f.lookahead_ids.index(stop)] if stop in f.lookahead_ids else f.lookahead_ids
        assert c.lookahead_ids == expected and c.num_query_rows == 1 + len(expected)


def test_capture_keeps_copies_of_the_scored_rows_only(tiny_dir):
    """No view pins a layer's whole [B, H, n, D] query: each kept row block owns its storage."""
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    cap = capture.QueryCapture([1], num_prompt_rows=8, width=200, keep_keys=True)
    ids = torch.tensor([list(range(100, 300))])  # n = 200
    from spcli.models.load import decoder_prefix

    with torch.inference_mode():
        decoder_prefix(model, 2)(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, spcli_capture=cap)
    [rows] = cap.rows[1]
    assert rows.shape == (1, 4, 8, 16)  # [B, H, W, D] of the tiny model
    assert rows.untyped_storage().nbytes() == rows.numel() * rows.element_size()
    assert set(cap.keys) == {1} and cap.keys[1].shape == (1, 2, 200, 16)  # keys of the scored layer only


def test_capture_takes_the_last_window_rows_across_chunks():
    """Rows of the prompt's last W columns, wherever the chunks split them, then every decode row."""
    cap = capture.QueryCapture([0], num_prompt_rows=5, width=12)
    columns = torch.arange(14, dtype=torch.float32)[None, None, :, None]  # [1, 1, 14, 1]: row j holds j
    for start, end in ((0, 4), (4, 8), (8, 10), (10, 12), (12, 13), (13, 14)):  # prefill chunks, then 2 decode steps
        cap.record(0, columns[:, :, start:end], key=None)
    assert cap.queries()[0, 0, 0, :, 0].tolist() == [7, 8, 9, 10, 11, 12, 13]
    assert [r.shape[2] for r in cap.rows[0]] == [1, 2, 2, 1, 1]  # the first chunk holds none of the window


def chunk_cases():
    """(prompts, cfg, chunks): widths 63 and 100 (n = 63, 40, 100, 9 left-padded); chunks that do (7 of 63,
    20 of 100) and do not (10, 62, 7 of 100, 33) divide the width; the window rows (16, 5) straddle chunk
    boundaries (e.g. 16 rows over chunks of 7); chunk 1; a chunk longer than the prompt."""
    one, batch = [list(range(400, 463))], [list(range(700, 763)), list(range(800, 840)), list(range(900, 1000)),
                                           list(range(20, 29))]
    early = ScoreConfig(lookahead=0, window=16, score_layers="1", pool=5, rows="mean")
    ahead = ScoreConfig(lookahead=3, window=5, score_layers="all", pool=5, rows="mean")
    return [(one, early, (1, 7, 10, 64)), (one, ahead, (7, 62)), (one, paper(2, 13), (10,)),
            (batch, early, (7, 20)), (batch, ahead, (33,))]


def test_chunked_importance_equals_the_unchunked_pass(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    for prompts, cfg, chunks in chunk_cases():
        whole = speculate_batch(model, prompts, cfg, eos_ids=set(), device=CPU, chunk=1 << 20)
        for chunk in chunks:
            parts = speculate_batch(model, prompts, cfg, eos_ids=set(), device=CPU, chunk=chunk)
            for w, p in zip(whole, parts):
                assert p.lookahead_ids == w.lookahead_ids and p.num_query_rows == w.num_query_rows, (cfg, chunk)
                torch.testing.assert_close(p.importance, w.importance, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"{cfg}, chunk {chunk}: {m}")


def test_masked_attention_in_row_blocks_equals_one_call(tiny_dir, monkeypatch):
    """A speculator pass with a mask runs sdpa a few query rows at a time (MASK_ELEMENTS here 120: 6 rows of a
    20-key first chunk, fewer rows as the prefix grows, the last block shorter), building each later chunk's
    mask block by block (RowBlocks): the same importance as one mask for the whole chunk."""
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    (prompts, early, _), (_, ahead, _) = chunk_cases()[3:5]
    whole = {cfg: speculate_batch(model, prompts, cfg, set(), CPU, chunk=20) for cfg in (early, ahead)}
    built, real_rows = [], capture.RowBlocks.rows
    monkeypatch.setattr(capture, "MASK_ELEMENTS", 120)
    monkeypatch.setattr(capture.RowBlocks, "rows", lambda self, s, e: built.append(e - s) or real_rows(self, s, e))
    for cfg in (early, ahead):
        for w, p in zip(whole[cfg], speculate_batch(model, prompts, cfg, set(), CPU, chunk=20)):
            assert p.lookahead_ids == w.lookahead_ids
            torch.testing.assert_close(p.importance, w.importance, rtol=1e-5, atol=1e-7)
    assert built and max(built) <= 120 // (len(prompts) * 21), "blocks of a later chunk fit the element budget"


def test_a_later_chunk_gets_row_blocks_not_a_mask_of_its_whole_prefix(tiny_dir):
    """The mask function leaves the first chunk (no prefix) and decode steps to transformers' sdpa_mask and
    returns RowBlocks for a chunk over a cached prefix, whose rows equal sdpa_mask's rows of the whole."""
    from transformers.masking_utils import sdpa_mask

    pad = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    args = dict(batch_size=2, q_length=3, kv_length=8, q_offset=5, kv_offset=0, attention_mask=pad, device="cpu")
    blocks = capture._mask(**args)
    assert isinstance(blocks, capture.RowBlocks) and blocks.shape == (2, 1, 3, 8)
    whole = sdpa_mask(**{**args, "allow_is_causal_skip": False})
    assert torch.equal(torch.cat([blocks.rows(0, 2), blocks.rows(2, 3)], dim=2), whole)
    assert capture._mask(**{**args, "q_length": 8, "q_offset": 0}) is not None  # first chunk: a tensor
    assert not isinstance(capture._mask(**{**args, "q_length": 8, "q_offset": 0}), capture.RowBlocks)
    assert not isinstance(capture._mask(**{**args, "q_length": 1, "q_offset": 7}), capture.RowBlocks)


def test_chunks_run_each_prompt_column_once(tiny_dir):
    """ceil(T / chunk) prefill calls per layer, early exit still stops after the last scored layer."""
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    calls, handles = count_calls(model)
    try:
        speculate_batch(model, [list(range(600, 650))], ScoreConfig(lookahead=0, window=8, score_layers="1", pool=1, rows="mean"),
                        set(), CPU, chunk=16)
        assert calls == {"layers": [4, 4, 0], "norm": 0, "lm_head": 0}  # 50 columns in chunks of 16
    finally:
        for h in handles:
            h.remove()
