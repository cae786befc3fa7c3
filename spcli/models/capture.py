"""Capture post-RoPE queries (and keys) without forking transformers, and attend in row blocks.

transformers hands an attention function registered in `AttentionInterface` the query
[B, H, t, D] after RoPE and the keys [B, KVH, T_keys, D] after the cache update. We register one
function, "spcli", that records them at the scored layers when a `QueryCapture` is passed through
the model's forward kwargs (`spcli_capture=`), and otherwise delegates to sdpa.

Its mask function ("spcli" in `AttentionMaskInterface`) is transformers' `sdpa_mask`, except for a call
of t > 1 rows over a cache that already holds a prefix (a speculator's later prefill chunks): there
the [B, 1, t, T_keys] boolean mask, and the additive copy of the query's dtype sdpa makes of it,
would grow with the prompt. It returns a `RowBlocks` instead, and the attention builds and runs
`block_rows` query rows at a time, so a chunk's mask memory stays MASK_ELEMENTS whatever T_keys is
(rows are independent: same result).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from spcli.config.scoring import MASK_ELEMENTS

ATTN_IMPLEMENTATION = "spcli"


class QueryCapture:
    """Per scored layer, the query rows that score, as copies (a view would pin the layer's whole
    [B, H, t, D] query): the last `num_prompt_rows` of the `width` prompt columns, whether the prompt
    comes in one call or in chunks, then every later call's rows (one per decode step). Each layer
    counts the columns its calls have seen. With `keep_keys`, the keys of the last call (a single
    pass without a cache: every prompt key is in it)."""

    def __init__(self, layers: Iterable[int], num_prompt_rows: int, width: int, keep_keys: bool = False):
        self.layers = sorted(set(layers))
        self.first_row = max(0, width - num_prompt_rows)  # the first column whose query row scores
        self.keep_keys = keep_keys
        self.rows: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.layers}  # per call [B, H, t, D]
        self.num_columns = dict.fromkeys(self.layers, 0)  # columns seen so far, per layer
        self.keys: dict[int, torch.Tensor] = {}  # [B, KVH, T, D] post-RoPE

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        if layer_idx not in self.rows:
            return
        start, t = self.num_columns[layer_idx], query.shape[2]
        self.num_columns[layer_idx] = start + t
        skip = max(0, self.first_row - start)  # this call's columns before the first scored one
        if skip < t:
            self.rows[layer_idx].append(query[:, :, skip:, :].clone())
        if self.keep_keys:
            self.keys[layer_idx] = key

    def queries(self) -> torch.Tensor:
        """[L_scored, B, H, S, D]: per scored layer, the prompt rows then one row per decode step."""
        return torch.stack([torch.cat(self.rows[layer], dim=2) for layer in self.layers])




def block_rows(batch_size: int, num_keys: int) -> int:
    """Query rows per sdpa call so a [B, 1, rows, T_keys] mask holds at most MASK_ELEMENTS."""
    return max(1, MASK_ELEMENTS // (batch_size * num_keys))


@dataclass(frozen=True)
class RowBlocks:
    """A [B, 1, q_length, kv_length] boolean mask not built yet: `rows(start, end)` builds its rows
    start .. end - 1 with `sdpa_mask` (`args`: the arguments transformers passed for the whole)."""

    args: dict

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.args["batch_size"], 1, self.args["q_length"], self.args["kv_length"]

    def rows(self, start: int, end: int) -> torch.Tensor:
        args = {**self.args, "q_length": end - start, "q_offset": self.args.get("q_offset", 0) + start,
                "allow_is_causal_skip": False}
        return sdpa_mask(**args)


def _mask(**args) -> torch.Tensor | RowBlocks | None:
    """sdpa's mask, or RowBlocks where the query has a prefix in the cache (kv_length > q_length > 1): there
    transformers could not skip the mask and would build all of it."""
    if args["q_length"] > 1 and args["kv_length"] > args["q_length"]:
        return RowBlocks(args)
    return sdpa_mask(**args)


def _blocked(module, query, key, value, mask: torch.Tensor | RowBlocks, **kwargs):
    b, _, t, num_keys = mask.shape
    step = block_rows(b, num_keys)
    build = mask.rows if isinstance(mask, RowBlocks) else lambda s, e: mask[:, :, s:e]
    parts = [sdpa_attention_forward(module, query[:, :, s : s + step], key, value, build(s, min(s + step, t)), **kwargs)[0]
             for s in range(0, t, step)]  # each [B, rows, H, D]
    return torch.cat(parts, dim=1), None


def _attention(module, query, key, value, attention_mask, spcli_capture: QueryCapture | None = None, **kwargs):
    """sdpa, in row blocks where the mask is RowBlocks, or, in a speculator pass, where a mask tensor of
    more than MASK_ELEMENTS covers the whole query (sdpa would make an additive copy of all of it)."""
    if spcli_capture is not None:
        spcli_capture.record(module.layer_idx, query, key)
    if isinstance(attention_mask, RowBlocks):
        return _blocked(module, query, key, value, attention_mask, **kwargs)
    if (spcli_capture is not None and attention_mask is not None and attention_mask.shape[2] == query.shape[2]
            and attention_mask.numel() > MASK_ELEMENTS):
        return _blocked(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the capturing attention (idempotent) and return its implementation name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _mask)
    return ATTN_IMPLEMENTATION
