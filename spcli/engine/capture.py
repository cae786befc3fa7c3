"""Capture post-RoPE queries (and keys) without forking transformers.

transformers hands an attention function registered in `AttentionInterface` the query
[B, H, t, D] after RoPE and the keys [B, KVH, T_keys, D] after the cache update. We register one
function, "spcli", that records them at the scored layers when a `QueryCapture` is passed through
the model's forward kwargs (`spcli_capture=`), and otherwise only delegates to sdpa.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

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


MASKED_ROWS = 1024  # query rows per sdpa call of a speculator pass with a mask


def _attention(module, query, key, value, attention_mask, spcli_capture: QueryCapture | None = None, **kwargs):
    """sdpa; in a speculator pass with a mask [B, 1, t, T_keys], `MASKED_ROWS` query rows at a time:
    sdpa turns a boolean mask into an additive one of the query's dtype, which for a prefill chunk of
    t rows over a long prefix would be t x T_keys elements (rows are independent: same result)."""
    if spcli_capture is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    spcli_capture.record(module.layer_idx, query, key)
    if attention_mask is None or attention_mask.shape[2] != query.shape[2] or query.shape[2] <= MASKED_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    parts = [sdpa_attention_forward(module, query[:, :, s : s + MASKED_ROWS], key, value,
                                    attention_mask[:, :, s : s + MASKED_ROWS], **kwargs)[0]
             for s in range(0, query.shape[2], MASKED_ROWS)]  # each [B, rows, H, D]
    return torch.cat(parts, dim=1), None


def register() -> str:
    """Register the capturing attention (idempotent) and return its implementation name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
