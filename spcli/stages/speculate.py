"""Speculator pass: score every prompt token from the speculator's attention (DESIGN.md steps 1-6).

A batch of B prompts is left-padded to its longest length T (`batching.left_pad`), so every prompt ends at column T - 1:

    input_ids      [B, T]  pad on the left
    attention_mask [B, T]  0 on padding
    position_ids   [B, T]  0 .. n_b - 1 on prompt b's tokens (the one-at-a-time positions)

Query rows, at every scored layer: the last `window` prompt tokens (at least the last one), each
row limited to keys at or before its own position, then one row per look-ahead token (all n
keys). The speculator prefills `chunk` columns at a time into a DynamicCache (attention mask and
position ids of the growing prefix), so its activations are one chunk's, not the prompt's; the
window rows are captured across chunks. Without look-ahead it stops after the last scored layer
(early exit: no later layer, no final norm, no LM head; the cache covers those layers only), and
once prefilled only the scored layers' keys and the query rows are kept for scoring; with
look-ahead the prompts decode their greedy look-ahead together on the whole cache. A prompt's
importance does not depend on the other prompts of its batch, nor on the chunk size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig
from spcli.kernels.score import token_importance
from spcli.models.capture import QueryCapture
from spcli.models.device import synchronize
from spcli.models.load import decoder_prefix
from spcli.stages.batching import Padded, left_pad


@dataclass
class Speculation:
    importance: torch.Tensor  # [n] float32, on CPU
    num_query_rows: int  # prompt rows + look-ahead steps actually scored (EOS ends the look-ahead)
    lookahead_ids: list[int]  # the greedy look-ahead tokens
    speculate_s: float  # this prompt's share of the batch's forward passes + its scoring
    unpooled: torch.Tensor | None = None  # [n] float32 on CPU, the importance at pool 1 (keep auto's budget)


def prefill(model: nn.Module, batch: Padded, cache: DynamicCache, cap: QueryCapture, chunk: int, **kwargs):
    """Prefill `batch` into `cache`, `chunk` columns at a time; returns the last chunk's output."""
    width = batch.input_ids.shape[1]
    for start in range(0, width, chunk):
        end = min(start + chunk, width)
        out = model(input_ids=batch.input_ids[:, start:end], attention_mask=batch.attention_mask[:, :end],
                    position_ids=batch.position_ids[:, start:end], past_key_values=cache, use_cache=True,
                    spcli_capture=cap, **kwargs)
    return out


@torch.inference_mode()
def speculate_batch(
    model: nn.Module, prompts: list[list[int]], cfg: ScoreConfig, eos_ids: set[int], device: torch.device,
    chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False,
) -> list[Speculation]:
    """One Speculation per prompt. `model`: the speculator, a *ForCausalLM; `cfg` resolved; `chunk`:
    columns per prefill call (the batch's, padding included); `with_unpooled`: also score at pool 1, for
    keep = auto's budget (a second scoring call on the same rows and keys; none where cfg.pool is 1)."""
    assert cfg.is_resolved, "resolve the score configuration first (spcli.models.profiles.resolve_score)"
    assert chunk >= 1, f"chunk must be >= 1, got {chunk}"
    t0 = time.perf_counter()
    layers = cfg.layers(getattr(model, "spcli_num_layers", model.config.num_hidden_layers))  # load_prefix sets it
    batch = left_pad([torch.tensor(p) for p in prompts], [torch.arange(len(p)) for p in prompts], device)
    width = batch.input_ids.shape[1]
    cap = QueryCapture(layers, cfg.num_prompt_rows, width)
    num_steps = [0] * len(prompts)  # look-ahead rows of each prompt
    lookahead: list[list[int]] = [[] for _ in prompts]
    if cfg.lookahead == 0:
        prefix = decoder_prefix(model, layers[-1] + 1)
        cache = DynamicCache(config=prefix.config)
        prefill(prefix, batch, cache, cap, chunk)
        keys = [cache.layers[layer].keys for layer in layers]  # L_s x [B, KVH, T, D]
        del cache  # the values and the unscored layers' keys: scoring reads none of them
    else:
        cache = DynamicCache(config=model.config)
        out = prefill(model, batch, cache, cap, chunk, logits_to_keep=1)
        next_pos = torch.tensor(list(map(len, prompts)), device=device)  # [B]
        lookahead = look_ahead(model, out.logits[:, -1], batch.attention_mask, next_pos, cache, cap, cfg.lookahead,
                               eos_ids)
        num_steps = list(map(len, lookahead))
        keys = [cache.layers[layer].keys for layer in layers]  # after the look-ahead: the cache re-allocates
    queries = cap.queries()  # [L_s, B, H, S, D]
    synchronize(device)  # CUDA runs ahead of the host: the clock waits for the forward passes to finish
    forward_s = time.perf_counter() - t0
    total = sum(map(len, prompts))
    out_specs = []
    for b, prompt in enumerate(prompts):
        s0 = time.perf_counter()
        n, pad = len(prompt), batch.pads[b]
        captured = min(cfg.num_prompt_rows, width)  # prefill rows captured for the whole batch
        rows = min(cfg.num_prompt_rows, n)  # prompt b's own: the last columns, which are never padding
        q = queries[:, b, :, captured - rows : captured + num_steps[b]].contiguous()  # [L_s, H, S_b, D]
        own_keys = [k[b, :, pad:width] for k in keys]
        importance, unpooled = score_rows(q, own_keys, cfg, rows, num_steps[b], with_unpooled)
        synchronize(importance.device)
        share = forward_s * n / total
        out_specs.append(Speculation(importance.float().cpu(), q.shape[2], lookahead[b],
                                     share + time.perf_counter() - s0,
                                     None if unpooled is None else unpooled.float().cpu()))
    return out_specs


def look_ahead(model: nn.Module, logits: torch.Tensor, mask: torch.Tensor, next_pos: torch.Tensor, cache: DynamicCache,
               cap: QueryCapture, num_steps: int, eos_ids: set[int]) -> list[list[int]]:
    """Greedy look-ahead of every row together on the whole cache, each row's tokens until its first EOS (an EOS
    token's query and all after it are not scored). logits [B, V]: the prefill's last; mask [B, T] over the cache;
    next_pos [B]: each row's first look-ahead position. The captured rows grow by one per step taken."""
    lookahead: list[list[int]] = [[] for _ in range(logits.shape[0])]
    alive = [True] * logits.shape[0]
    for step in range(num_steps):
        next_ids = logits.argmax(dim=-1)  # [B]
        for b, tok in enumerate(next_ids.tolist()):
            alive[b] = alive[b] and tok not in eos_ids
            if alive[b]:
                lookahead[b].append(tok)
        if not any(alive):
            break
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
        out = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=(next_pos + step)[:, None],
                    past_key_values=cache, use_cache=True, logits_to_keep=1, spcli_capture=cap)
        logits = out.logits[:, -1]
    return lookahead


def score_rows(q: torch.Tensor, keys: list[torch.Tensor], cfg: ScoreConfig, num_prompt_rows: int, num_steps: int,
               with_unpooled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One prompt's importance [n] (and at pool 1 where `with_unpooled`, else None) from its query rows q
    [L_s, H, S, D] (its last `num_prompt_rows` prompt tokens', each causal, then `num_steps` look-ahead rows over
    all n keys) and its keys L_s x [KVH, n, D]."""
    n = keys[0].shape[1]
    limits = None
    if num_prompt_rows > 1:
        limits = torch.tensor([*range(n - num_prompt_rows + 1, n + 1), *[n] * num_steps], device=q.device)  # [S]
    importance = token_importance(q, keys, pool=cfg.pool, impl=cfg.impl, row_limits=limits, rows=cfg.rows)
    unpooled = None
    if with_unpooled:
        unpooled = importance if cfg.pool == 1 else token_importance(q, keys, pool=1, impl=cfg.impl,
                                                                     row_limits=limits, rows=cfg.rows)
    return importance, unpooled


def speculate(model: nn.Module, input_ids: list[int], cfg: ScoreConfig, eos_ids: set[int],
              device: torch.device, chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False) -> Speculation:
    """One prompt alone (a batch of one)."""
    return speculate_batch(model, [input_ids], cfg, eos_ids, device, chunk=chunk, with_unpooled=with_unpooled)[0]
