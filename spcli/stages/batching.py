"""Prompts of unequal length in one padded batch: one grouping rule and one left-pad for the speculator's
passes (`prepare`) and the base's buckets (`hf_pass`); `prefix_batches` for rows over copies of a shared prefix
(speculate_shared, engines/hf/shared_pass).

A group's padded size is rows x width (its longest prompt); `length_groups` grows a group greedily, in
length order, while that size stays within max_padding x (its real tokens) + slack_per_row x rows and
max_tokens. Left padding makes every prompt end at the last column:

    input_ids      [B, T]  the ids, pad on the left (a pad id or any real id: masked out)
    attention_mask [B, T]  0 on padding
    position_ids   [B, T]  each prompt's own positions (gaps kept), 0 on padding
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def length_groups(lengths: list[int], *, longest_first: bool, max_padding: float, slack_per_row: int = 0,
                  max_tokens: float = math.inf) -> list[list[int]]:
    """Indices grouped by length, in length order (longest or shortest first); a prompt over max_tokens goes alone."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i] if longest_first else lengths[i]):
        g = groups[-1] if groups else None
        if g:
            rows, width = len(g) + 1, max(lengths[g[0]], lengths[i])
            if rows * width <= min(max_tokens, max_padding * (real + lengths[i]) + slack_per_row * rows):
                g.append(i)
                real += lengths[i]
                continue
        groups.append([i])
        real = lengths[i]
    return groups


def prefix_batches(num_shared: int, own_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of rows run together over copies of a shared prefix of num_shared tokens, in order: a batch's rows x
    (num_shared + its longest own part) stays within max_tokens (a row over it runs alone)."""
    batches: list[list[int]] = []
    longest = 0
    for i, n in enumerate(own_lens):
        if batches and (len(batches[-1]) + 1) * (num_shared + max(longest, n)) <= max_tokens:
            batches[-1].append(i)
            longest = max(longest, n)
        else:
            batches.append([i])
            longest = n
    return batches


@dataclass
class Padded:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    pads: list[int]  # padding before prompt b

    @property
    def is_padded(self) -> bool:
        return any(self.pads)


def left_pad(ids: list[torch.Tensor], positions: list[torch.Tensor], device: torch.device,
             fill: int | None = None) -> Padded:
    """ids[b], positions[b]: [m_b] int64 each; padding holds `fill` (None: the row's first id)."""
    width = max(len(p) for p in ids)
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    position_ids = torch.zeros_like(input_ids)
    mask = torch.zeros_like(input_ids)
    pads = [width - len(p) for p in ids]
    for b, (p, pos, pad) in enumerate(zip(ids, positions, pads)):
        input_ids[b, pad:] = p
        input_ids[b, :pad] = p[0] if fill is None else fill
        position_ids[b, pad:] = pos
        mask[b, pad:] = 1
    return Padded(input_ids.to(device), mask.to(device), position_ids.to(device), pads)
