"""Capture post-RoPE queries (and keys) without forking transformers.

transformers hands an attention function registered in `AttentionInterface` the query
[B, H, T, D] after RoPE and the keys [B, KVH, T_keys, D] after the cache update. We register one
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
    [B, H, T, D] query), and with `keep_keys` the keys of the last call (early exit: no cache)."""

    def __init__(self, layers: Iterable[int], num_prompt_rows: int, keep_keys: bool = False):
        self.layers = sorted(set(layers))
        self.num_prompt_rows = num_prompt_rows
        self.keep_keys = keep_keys
        self.rows: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.layers}  # per call [B, H, t, D]
        self.keys: dict[int, torch.Tensor] = {}  # [B, KVH, T, D] post-RoPE

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        if layer_idx not in self.rows:
            return
        t = min(self.num_prompt_rows, query.shape[2])  # the prefill's last rows; a decode step's one row
        self.rows[layer_idx].append(query[:, :, -t:, :].clone())
        if self.keep_keys:
            self.keys[layer_idx] = key

    def queries(self) -> torch.Tensor:
        """[L_scored, B, H, S, D]: per scored layer, the prompt rows then one row per decode step."""
        return torch.stack([torch.cat(self.rows[layer], dim=2) for layer in self.layers])


def _attention(module, query, key, value, attention_mask, spcli_capture: QueryCapture | None = None, **kwargs):
    if spcli_capture is not None:
        spcli_capture.record(module.layer_idx, query, key)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the capturing attention (idempotent) and return its implementation name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
