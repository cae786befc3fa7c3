import math

import pytest
import torch

from spcli.config import SelectConfig
from spcli.engine.select import budget, is_pruned, select_tokens


def cfg(**kw):
    return SelectConfig(**{"keep": 0.25, "chunk": 4, "keep_first": 0, "keep_last": 0, "min_tokens": 0, **kw})


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
