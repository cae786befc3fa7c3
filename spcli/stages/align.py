"""Cross-tokenizer scoring: a speculator with another tokenizer scores the base's tokens through characters.

Both tokenizers read the same text: a raw prompt as is, or each the messages in its own chat template.
Only characters both renderings share can be matched: the whole prompt, or each message's content
(`content_regions` finds them). A token's characters inside region k are placed on one shared axis at
offset(k) + (position - region start), offset(k) = the lengths of regions 0 .. k-1, so the same
content character has the same coordinate under both tokenizers.

    pair (i, j)        base token i and speculator token j cover at least one common character
    importance[i]      max over the pairs (i, j) of speculator importance[j]
    forced[i]          base token i has no pair (its own template tokens, a BOS): kept whatever the budget

Pure functions over character offsets (a fast tokenizer's `offset_mapping`): no model, no tokenizer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

Span = tuple[int, int]  # [start, end) characters; start == end: the token covers no character


class AlignmentError(ValueError):
    """The two renderings do not share the characters they should (a template that rewrites content)."""


@dataclass
class Alignment:
    """Which speculator tokens cover which base tokens' characters."""

    base_index: torch.Tensor  # [P] int64, base token of pair p
    spec_index: torch.Tensor  # [P] int64, speculator token of pair p
    num_base: int
    num_spec: int

    @property
    def forced(self) -> torch.Tensor:
        """[num_base] bool: base tokens no speculator token covers, kept regardless of the budget."""
        mask = torch.ones(self.num_base, dtype=torch.bool)
        mask[self.base_index] = False
        return mask


def content_regions(text: str, contents: list[str]) -> list[Span]:
    """Where each of `contents` appears in `text`, in order, each searched after the previous one."""
    regions, cursor = [], 0
    for k, content in enumerate(contents):
        start = text.find(content, cursor)
        if start < 0:
            raise AlignmentError(f"message {k}'s content does not appear as is in the chat template's rendering")
        regions.append((start, start + len(content)))
        cursor = start + len(content)
    return regions


def shared_spans(offsets: list[Span], regions: list[Span]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each token's characters inside the regions, on the shared axis: (token [Q], start [Q], end [Q]),
    sorted by start. A token covering two regions gives two pieces; one outside every region, none."""
    spans = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)  # [n, 2]
    tokens, starts, ends = [], [], []
    shift = 0
    for lo, hi in regions:
        a, b = np.maximum(spans[:, 0], lo), np.minimum(spans[:, 1], hi)
        inside = np.nonzero(a < b)[0]
        tokens.append(inside)
        starts.append(a[inside] - lo + shift)
        ends.append(b[inside] - lo + shift)
        shift += hi - lo
    token, start, end = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (tokens, starts, ends))
    order = np.argsort(start, kind="stable")
    return token[order], start[order], end[order]


def align(base_offsets: list[Span], base_regions: list[Span], spec_offsets: list[Span],
          spec_regions: list[Span]) -> Alignment:
    """The pairs of base and speculator tokens whose shared characters overlap. Region k of the base and
    region k of the speculator must hold the same text (so have the same length)."""
    if [b - a for a, b in base_regions] != [b - a for a, b in spec_regions]:
        raise AlignmentError("the two renderings' shared regions differ in length")
    bt, bs, be = shared_spans(base_offsets, base_regions)
    st, ss, se = shared_spans(spec_offsets, spec_regions)
    # speculator pieces j overlap base piece (a, b) iff ss[j] < b and se[j] > a; ss is sorted, and the
    # running max of se bounds the first candidate from below
    hi = np.searchsorted(ss, be, side="left")  # [Qb] first piece starting at or after b
    lo = np.searchsorted(np.maximum.accumulate(se) if se.size else se, bs, side="right")  # [Qb]
    counts = np.maximum(hi - lo, 0)
    base_piece = np.repeat(np.arange(bt.size), counts)
    spec_piece = np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    hit = (ss[spec_piece] < be[base_piece]) & (se[spec_piece] > bs[base_piece])
    num_spec = len(spec_offsets)
    keys = np.sort(bt[base_piece[hit]] * max(num_spec, 1) + st[spec_piece[hit]])
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys  # [P] sorted, no duplicates
    return Alignment(torch.from_numpy(keys // max(num_spec, 1)), torch.from_numpy(keys % max(num_spec, 1)),
                     len(base_offsets), num_spec)


def carry(importance: torch.Tensor, alignment: Alignment | None) -> torch.Tensor:
    """[num_base] float32: each base token's max over the speculator tokens it pairs with (0 where forced).
    `importance`: [num_spec] float32. Without an alignment (same tokenizer) the importance as it is."""
    if alignment is None:
        return importance
    assert importance.shape == (alignment.num_spec,), (importance.shape, alignment.num_spec)
    out = torch.zeros(alignment.num_base, dtype=torch.float32)
    return out.scatter_reduce_(0, alignment.base_index, importance.float()[alignment.spec_index], "amax",
                               include_self=False)


def restrict(alignment: Alignment, base_kept: list[int]) -> tuple[list[int], Alignment]:
    """After truncation keeps the base tokens `base_kept` (ascending): the speculator tokens to keep
    (ascending) and the alignment between the two kept sequences. A speculator token goes when every base
    token it covers went; one that covers no base token (its own template) stays."""
    new_base = torch.full((alignment.num_base,), -1, dtype=torch.int64)
    new_base[torch.tensor(base_kept, dtype=torch.int64)] = torch.arange(len(base_kept))
    is_kept_pair = new_base[alignment.base_index] >= 0  # [P]
    covers_any = torch.zeros(alignment.num_spec, dtype=torch.bool)
    covers_any[alignment.spec_index] = True
    covers_kept = torch.zeros(alignment.num_spec, dtype=torch.bool)
    covers_kept[alignment.spec_index[is_kept_pair]] = True
    spec_kept = (covers_kept | ~covers_any).nonzero().flatten()  # [n_spec']
    new_spec = torch.full((alignment.num_spec,), -1, dtype=torch.int64)
    new_spec[spec_kept] = torch.arange(spec_kept.numel())
    return spec_kept.tolist(), Alignment(new_base[alignment.base_index[is_kept_pair]],
                                         new_spec[alignment.spec_index[is_kept_pair]], len(base_kept),
                                         int(spec_kept.numel()))
