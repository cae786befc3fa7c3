"""Speculator pass and scoring against a brute-force reference from eager attention weights."""

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from spcli.config import ScoreConfig
from spcli.engine import capture
from spcli.engine.load import first_layers, load_causal_lm
from spcli.engine.speculate import speculate

CPU = torch.device("cpu")


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
        spec = speculate(model, ids, ScoreConfig(lookahead=3, pool=pool), eos_ids=set(), device=CPU)
        assert spec.num_query_rows == 1 + len(spec.lookahead_ids) == 4
        ref = brute_force(tiny_dir, ids, spec.lookahead_ids, pool)
        torch.testing.assert_close(spec.importance, ref, rtol=1e-4, atol=1e-6)


def test_lookahead_zero_scores_last_prompt_token_only(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(200, 240))
    spec = speculate(model, ids, ScoreConfig(lookahead=0, pool=1), eos_ids=set(), device=CPU)
    assert spec.num_query_rows == 1 and spec.lookahead_ids == []
    torch.testing.assert_close(spec.importance, brute_force(tiny_dir, ids, [], 1), rtol=1e-4, atol=1e-6)


def test_steps_after_eos_are_dropped(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(300, 340))
    free = speculate(model, ids, ScoreConfig(lookahead=4, pool=1), eos_ids=set(), device=CPU)
    stop_at = free.lookahead_ids[2]  # pretend the third look-ahead token is EOS
    cut = speculate(model, ids, ScoreConfig(lookahead=4, pool=1), eos_ids={stop_at}, device=CPU)
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
    spec = speculate(view, ids, ScoreConfig(lookahead=2, pool=1), eos_ids=set(), device=CPU)
    assert spec.importance.shape == (40,)


def test_self_k_out_of_range_is_refused(tiny_dir):
    import pytest

    from spcli.errors import ConfigError

    base = load_causal_lm(tiny_dir, "float32", CPU).model
    with pytest.raises(ConfigError, match="1 <= K <= 3"):
        first_layers(base, 4)


def test_capture_is_registered_under_its_own_name():
    assert capture.register() == "spcli"
