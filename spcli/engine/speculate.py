"""Speculator pass: prefill the whole prompt, look ahead greedily, score every prompt token.

DESIGN.md steps 1-5. The speculator runs one prompt at a time, so every prompt gets its own query
rows (the canonical code's batched-query bug cannot happen) and its scores do not depend on
which other prompts share its batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.config import ScoreConfig
from spcli.engine.capture import QueryCapture
from spcli.kernels.score import token_importance


@dataclass
class Speculation:
    importance: torch.Tensor  # [n] float32, on CPU
    num_query_rows: int  # 1 + look-ahead steps actually scored (EOS ends the look-ahead)
    lookahead_ids: list[int]  # the greedy look-ahead tokens
    speculate_s: float  # prefill + look-ahead
    score_s: float  # scoring kernel


@torch.inference_mode()
def speculate(
    model: nn.Module, input_ids: list[int], cfg: ScoreConfig, eos_ids: set[int], device: torch.device
) -> Speculation:
    t0 = time.perf_counter()
    n = len(input_ids)
    num_layers = model.config.num_hidden_layers
    cap = QueryCapture(num_layers)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([input_ids], device=device)  # [1, n]
    out = model(
        input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
        use_cache=True, logits_to_keep=1, spcli_capture=cap,
    )
    keys = [layer.keys[0, :, :n, :] for layer in cache.layers]  # L x [KVH, n, D], post-RoPE views
    lookahead: list[int] = []
    next_id = int(out.logits[0, -1].argmax())
    for step in range(cfg.lookahead):
        if next_id in eos_ids:
            break  # the EOS token's query and everything after it are not scored
        lookahead.append(next_id)
        out = model(
            input_ids=torch.tensor([[next_id]], device=device),
            attention_mask=torch.ones(1, n + step + 1, dtype=torch.long, device=device),
            position_ids=torch.tensor([[n + step]], device=device),
            past_key_values=cache, use_cache=True, logits_to_keep=1, spcli_capture=cap,
        )
        next_id = int(out.logits[0, -1].argmax())
    t1 = time.perf_counter()
    queries = cap.queries()  # [L, H, S, D]
    importance = token_importance(queries, keys, pool=cfg.pool, impl=cfg.impl)
    if importance.is_cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return Speculation(importance.float().cpu(), queries.shape[2], lookahead, t1 - t0, t2 - t1)
