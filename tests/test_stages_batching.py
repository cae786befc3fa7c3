"""One grouping rule and one left-pad for the speculator's groups and the base's buckets."""

import torch

from spcli.engines.hf import base_pass as hf_pass

from spcli.stages import prepare
from spcli.stages.batching import left_pad, length_groups


def padded_size(lengths, group):
    return len(group) * max(lengths[i] for i in group)


def test_speculator_groups_go_longest_first_within_their_padding_and_token_caps():
    lengths = [100, 2000, 1990, 30, 1000, 980, 2000, 5000]
    groups = prepare.speculator_groups(lengths, max_tokens=4500)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert [lengths[g[0]] for g in groups] == sorted((lengths[g[0]] for g in groups), reverse=True)
    for g in groups:
        real = sum(lengths[i] for i in g)
        assert len(g) == 1 or padded_size(lengths, g) <= min(4500, prepare.MAX_PADDING * real)
    assert groups[0] == [7]  # over max_tokens: alone
    assert {1, 6} <= set(groups[1]) and 2 not in groups[1]  # 3 x 2000 > 4500


def test_one_rule_two_orders():
    lengths = [5, 6, 50, 52]
    assert length_groups(lengths, longest_first=True, max_padding=1.1) == [[3, 2], [1, 0]]
    assert length_groups(lengths, longest_first=False, max_padding=1.1) == [[0, 1], [2, 3]]
    assert length_groups(lengths, longest_first=False, max_padding=1.1, slack_per_row=40) == [[0, 1, 2, 3]]
    assert hf_pass.length_buckets(lengths) == length_groups(lengths, longest_first=False, max_padding=hf_pass.MAX_PADDING,
                                                             slack_per_row=hf_pass.PADDING_SLACK)


def test_left_pad_ends_every_row_at_the_last_column_with_its_own_positions():
    batch = left_pad([torch.tensor([7, 8, 9]), torch.tensor([4])], [torch.tensor([0, 5, 9]), torch.tensor([3])],
                     torch.device("cpu"), fill=0)
    assert batch.input_ids.tolist() == [[7, 8, 9], [0, 0, 4]]
    assert batch.position_ids.tolist() == [[0, 5, 9], [0, 0, 3]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.pads == [0, 2] and batch.is_padded
    same = left_pad([torch.tensor([1, 2])], [torch.arange(2)], torch.device("cpu"))
    assert not same.is_padded and same.input_ids.tolist() == [[1, 2]]
