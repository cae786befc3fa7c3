"""Capture post-RoPE queries without forking transformers.

transformers hands an attention function registered in `AttentionInterface` the query
[B, H, T, D] after RoPE and the keys after the cache update. We register one function, "spcli",
that records the last query row of each layer when a `QueryCapture` is passed through the
model's forward kwargs (`spcli_capture=`), and otherwise only delegates to sdpa.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "spcli"


class QueryCapture:
    """Per layer, the query rows of the last position of each forward call (batch of one)."""

    def __init__(self, num_layers: int):
        self.rows: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]  # L x S x [H, D]

    def record(self, layer_idx: int, query: torch.Tensor) -> None:
        assert query.shape[0] == 1, "the speculator runs one prompt at a time"
        self.rows[layer_idx].append(query[0, :, -1, :])  # [H, D]

    def queries(self) -> torch.Tensor:
        """[L, H, S, D] in capture order (row 0: the last prompt token)."""
        return torch.stack([torch.stack(layer, dim=1) for layer in self.rows])

    def drop_last(self) -> None:
        for layer in self.rows:
            layer.pop()


def _attention(module, query, key, value, attention_mask, spcli_capture: QueryCapture | None = None, **kwargs):
    if spcli_capture is not None:
        spcli_capture.record(module.layer_idx, query)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register the capturing attention (idempotent) and return its implementation name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
