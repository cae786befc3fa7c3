import math

import pytest
import torch

from spcli.config.scoring import SelectConfig
from spcli.stages.select import auto_budget, budget, is_pruned, select_tokens


def cfg(**kw):
    return SelectConfig(**{"keep": 0.25, "chunk": 4, "keep_first": 0, "keep_last": 0, "min_tokens": 0, "min_free": 0, **kw})


def test_budget_is_ceil_of_keep_times_n():
    assert budget(100, 0.1) == 10
    assert budget(101, 0.1) == 11
    assert budget(7, 0.3) == math.ceil(0.3 * 7)
    assert budget(10, 0.3) == 3  # 0.3 * 10 = 3.0000000000000004 in floats: still 3


def test_best_chunks_win_and_indices_ascend():
    imp = torch.zeros(16)
    imp[12:16] = 1.0  # chunk 3 best
    imp[4:8] = 0.5  # chunk 1 second
    kept = select_tokens(imp, cfg(keep=0.5))
    assert kept.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]


def test_chunk_score_is_mean_not_max():
    imp = torch.zeros(8)
    imp[0] = 1.0  # chunk 0: mean 0.25
    imp[4:8] = 0.3  # chunk 1: mean 0.3
    assert select_tokens(imp, cfg(keep=0.5)).tolist() == [4, 5, 6, 7]


def test_forced_tokens_count_towards_budget():
    imp = torch.zeros(40)
    imp[20:24] = 1.0
    kept = select_tokens(imp, cfg(keep=0.3, keep_first=2, keep_last=3))  # budget 12 = 2 + 3 + 7
    assert kept.numel() == 12
    assert {0, 1, 37, 38, 39} <= set(kept.tolist())
    assert {20, 21, 22, 23} <= set(kept.tolist())


def test_forced_tokens_exceeding_budget_are_all_kept():
    kept = select_tokens(torch.rand(20), cfg(keep=0.1, keep_first=4, keep_last=4))
    assert kept.tolist() == [0, 1, 2, 3, 16, 17, 18, 19]


def test_last_chunk_is_cut_to_its_best_tokens_to_hit_budget():
    imp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.9, 0.1, 0.8, 0.2])
    kept = select_tokens(imp, cfg(keep=0.25))  # budget 2 inside chunk 1
    assert kept.tolist() == [4, 6]


def test_short_last_chunk_scored_by_its_own_mean():
    imp = torch.tensor([0.1] * 8 + [0.5])  # chunk 2 has one token of 0.5
    kept = select_tokens(imp, cfg(keep=1 / 9))
    assert kept.tolist() == [8]


def test_ties_prefer_earlier_chunk():
    kept = select_tokens(torch.ones(16), cfg(keep=0.25))
    assert kept.tolist() == [0, 1, 2, 3]


def test_min_tokens_and_keep_one_keep_everything():
    imp = torch.rand(50)
    assert select_tokens(imp, cfg(min_tokens=51)).tolist() == list(range(50))
    assert select_tokens(imp, cfg(keep=1.0)).tolist() == list(range(50))
    assert not is_pruned(50, cfg(min_tokens=51))
    assert is_pruned(50, cfg(min_tokens=50))


def test_per_record_keep_overrides_config():
    imp = torch.rand(64)
    assert select_tokens(imp, cfg(keep=0.1), keep=0.5).numel() == 32


@pytest.mark.parametrize("bad", [dict(keep=0.0), dict(keep=1.5), dict(chunk=0), dict(keep_first=-1)])
def test_config_rejects_bad_values(bad):
    from spcli.errors import ConfigError

    with pytest.raises(ConfigError):
        SelectConfig(**bad)


def auto(**kw):
    return cfg(**{"keep": "auto", "keep_scale": 1.5, "keep_min": 0.1, "keep_max": 0.5, **kw})


def keep_auto(imp, c):
    """select_tokens at keep auto with `imp` as its own unpooled importance."""
    return select_tokens(imp, c, unpooled=imp)


def test_auto_one_standout_chunk_keeps_scale_chunks_within_the_minimum():
    imp = torch.zeros(80)
    imp[40:44] = 1.0  # one chunk holds all the mass: one effective chunk, 1.5 x 4 = 6 tokens
    assert auto_budget(imp, auto(keep_min=0.01)) == 6
    assert auto_budget(imp, auto()) == 8  # below keep_min: ceil(0.1 * 80)
    kept = keep_auto(imp, auto())
    assert kept.numel() == 8 and {40, 41, 42, 43} <= set(kept.tolist())


def test_auto_flat_scores_keep_the_maximum():
    assert keep_auto(torch.ones(80), auto()).numel() == 40  # nothing stands out of the median: keep_max 0.5
    assert keep_auto(torch.zeros(80), auto()).numel() == 40  # no mass at all counts as flat


def test_auto_effective_number_of_chunks_by_hand():
    imp = torch.full((80,), 0.01)  # 20 chunks of 4; the background 0.01 is every chunk's median ...
    imp[8:12], imp[32:36], imp[60:64] = 0.2, 0.1, 0.05  # ... chunks 2, 8, 15 stand out by 0.76, 0.36, 0.16
    p = (0.76 / 1.28, 0.36 / 1.28, 0.16 / 1.28)  # 0.59375, 0.28125, 0.125
    effective = math.exp(-(0.59375 * math.log(0.59375) + 0.28125 * math.log(0.28125) + 0.125 * math.log(0.125)))
    assert sum(p) == pytest.approx(1.0) and effective == pytest.approx(2.525, abs=1e-3)
    c = lambda scale: auto(keep_scale=scale, keep_min=0.01, keep_max=1.0)
    assert auto_budget(imp, c(1.0)) == 11  # ceil(2.525 x 4)
    assert auto_budget(imp, c(2.0)) == 21  # ceil(20.2)
    assert keep_auto(imp, c(1.0)).tolist() == [8, 9, 10, 11, 32, 33, 34, 35, 60, 61, 62]  # the last chunk cut


def test_auto_tells_one_peak_from_many_over_a_floor():
    """Unpooled scores of a real prompt sit on a floor; relative to the median, one peak is one effective chunk
    and eight equal peaks are eight."""
    one, many = torch.full((800,), 0.01), torch.full((800,), 0.01)
    one[400:408] = 0.5
    for c in range(8):
        many[40 + 96 * c : 48 + 96 * c] = 0.5
    c = auto(chunk=8, keep_min=0.01, keep_max=0.5)
    assert (auto_budget(one, c), auto_budget(many, c)) == (12, 96)  # 1.5 x 1 x 8, 1.5 x 8 x 8


def test_auto_needs_the_unpooled_importance():
    with pytest.raises(AssertionError, match="unpooled"):
        select_tokens(torch.ones(80), auto())
    assert select_tokens(torch.ones(80), auto(), keep=0.25).numel() == 20  # a fixed keep does not read it


def test_auto_bounds_clamp_the_budget():
    imp = torch.zeros(100)
    imp[50:54] = 1.0
    assert keep_auto(imp, auto(keep_min=0.3, keep_max=0.6)).numel() == 30
    assert keep_auto(torch.rand(100) + 1.0, auto(keep_min=0.05, keep_max=0.2)).numel() == 20
    assert keep_auto(torch.ones(100), auto(keep_min=1.0, keep_max=1.0)).numel() == 100


def test_auto_counts_forced_tokens_and_leaves_them_out_of_the_mass():
    imp = torch.zeros(80)
    imp[:4] = 100.0  # forced sink: a huge score that must not decide the mass
    imp[76:] = 100.0  # forced tail
    imp[40:44] = 1.0  # the only free mass: one chunk
    c = auto(keep_first=4, keep_last=4, keep_min=0.05, keep_scale=1.0)
    assert auto_budget(imp, c) == 12  # 8 forced + one effective chunk of 4
    kept = keep_auto(imp, c)
    assert kept.tolist() == [0, 1, 2, 3, 40, 41, 42, 43, 76, 77, 78, 79]
    # forced tokens alone above keep_max: they are kept and nothing else
    assert keep_auto(imp, auto(keep_first=8, keep_last=8, keep_max=0.1)).numel() == 16


def test_auto_is_pruned_but_not_below_min_tokens():
    assert is_pruned(80, auto())
    assert not is_pruned(80, auto(min_tokens=81))
    assert keep_auto(torch.rand(80), auto(min_tokens=81)).tolist() == list(range(80))
    assert is_pruned(80, cfg(keep=1.0), keep="auto")  # a record's own keep wins
    assert select_tokens(torch.ones(80), cfg(keep=0.1), keep="auto", unpooled=torch.ones(80)).numel() == 40


@pytest.mark.parametrize("bad", [dict(keep="half"), dict(keep="auto", keep_scale=0.0), dict(keep_scale=101.0),
                                 dict(keep_min=0.0), dict(keep_max=1.2), dict(keep_min=0.6, keep_max=0.5)])
def test_config_rejects_bad_auto_values(bad):
    from spcli.errors import ConfigError

    with pytest.raises(ConfigError):
        SelectConfig(**bad)


def test_parse_keep():
    from spcli.config.scoring import parse_keep
    from spcli.errors import ConfigError

    assert parse_keep("auto") == "auto" and parse_keep("AUTO") == "auto" and parse_keep("0.25") == 0.25
    for bad in ("0", "1.5", "x", ""):
        with pytest.raises(ConfigError, match="--keep"):
            parse_keep(bad)
