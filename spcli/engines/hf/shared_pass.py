"""The base pass on transformers for a group of requests that share a kept prefix: the shared part is prefilled once
(issue 51, QA jobs asking several questions of one document).

Contract (for the job loop that groups requests; nothing calls this yet):

    requests   B PrunedRequests whose token_ids share their first p tokens (a document and its template, as
               speculate_shared.shared_prefix_len finds them); each one's `kept` is everything its base sees
    shared     [m_s] int64, ascending positions < p, a subset of every request's kept: the group's kept document,
               prefilled ONCE, one row, position_ids = the positions themselves (RoPE sees the gaps, as hf_pass)
    own_b      kept_b minus shared, ascending, at least one token (the request's own last logits): appended after
               the shared part, at their original positions, from a copy of the shared cache per row (rows in
               batches of batching.prefix_batches: rows x (m_s + longest own part) <= max_batch_tokens)

then decoding from n_b as hf_pass does (the same Bucket: greedy or seeded sampling, EOS, max_tokens, logprobs).
Where every own position lies after the last shared one (a question after its document) the result is the
hf_pass.generate of the same kept set: exact (tests/test_hf_shared.py). An own position inside the document (a
per-question top-up) is still prefilled at its position, but after the shared part in the cache, so it attends to
every shared token, later ones included, and no shared token attends to it: an approximation, whose answers
benches/shared_docs_rules.py measures. Generation.prefill_s is the own tokens' prefill; the shared part's is in
ttft_s (counted from the call's start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.models.device import synchronize
from spcli.stages.batching import left_pad, prefix_batches
from spcli.engines.hf.base_pass import Bucket
from spcli.stages.request import Generation, PrunedRequest
from spcli.errors import StopAtSafePoint

SHARED_BATCH_TOKENS = 65536  # cache rows x tokens per own-part batch (each row holds a copy of the shared part)


@dataclass
class SharedPrefill:
    """The group's shared kept part, prefilled once."""

    positions: torch.Tensor  # [m_s] int64, ascending
    cache: DynamicCache  # [1, KVH, m_s, D] per layer
    prefill_s: float


def own_positions(req: PrunedRequest, shared: torch.Tensor) -> torch.Tensor:
    """[m_b - m_s] int64, ascending: the request's kept positions that are not shared."""
    return req.kept[~torch.isin(req.kept, shared)]


def check_group(requests: list[PrunedRequest], shared: torch.Tensor) -> None:
    assert requests, "a group has at least one request"
    p = int(shared.max()) + 1 if shared.numel() else 0
    head = requests[0].token_ids[:p]
    for r in requests:
        assert r.token_ids[:p] == head, f"{r.record_id}: the shared positions must hold the same tokens in every request"
        assert bool(torch.isin(shared, r.kept).all()), f"{r.record_id}: its kept set must hold every shared position"
        assert own_positions(r, shared).numel() >= 1, f"{r.record_id}: needs a kept token of its own after the shared part"
    assert bool((shared[1:] > shared[:-1]).all()), "shared positions must be ascending"


def prefill_shared(model: nn.Module, token_ids: list[int], shared: torch.Tensor, device: torch.device) -> SharedPrefill:
    """token_ids[shared] at positions `shared`, one row, into a new cache (no LM head: no request ends here)."""
    t0 = time.perf_counter()
    cache = DynamicCache(config=model.config)
    if shared.numel():
        ids = torch.tensor(token_ids, dtype=torch.long)[shared]
        model.model(input_ids=ids[None].to(device), position_ids=shared[None].to(device), past_key_values=cache,
                    use_cache=True)
    synchronize(device)
    return SharedPrefill(shared, cache, time.perf_counter() - t0)


def _copies(part: SharedPrefill, config, num_rows: int) -> DynamicCache:
    """A new cache holding the shared keys and values once per row: [num_rows, KVH, m_s, D] per layer."""
    cache = DynamicCache(config=config)
    if part.positions.numel():
        for i, layer in enumerate(part.cache.layers):
            cache.update(layer.keys.expand(num_rows, -1, -1, -1).contiguous(),
                         layer.values.expand(num_rows, -1, -1, -1).contiguous(), i)
    return cache


def own_prefill(part: SharedPrefill, requests: list[PrunedRequest], device: torch.device):
    """Bucket.run's prefill for `requests`: each row's own kept tokens after a copy of the shared part.
    Returns prefill(model, pad_id) -> (cache, mask [B, m_s + T] or None without padding, last logits [B, V])."""

    def prefill(model: nn.Module, pad_id: int):
        own = [own_positions(r, part.positions) for r in requests]
        batch = left_pad([torch.tensor(r.token_ids, dtype=torch.long)[o] for r, o in zip(requests, own)], own, device,
                         fill=pad_id)  # [B, T]
        mask = None
        if batch.is_padded:
            mask = torch.cat([batch.attention_mask.new_ones(len(requests), part.positions.numel()),
                              batch.attention_mask], dim=1)  # [B, m_s + T]: padding sits between shared and own
        cache = _copies(part, model.config, len(requests))
        out = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, mask, out.logits[:, -1, :].float()

    return prefill


@torch.inference_mode()
def generate_shared(model: nn.Module, requests: list[PrunedRequest], shared: torch.Tensor, tokenizer, eos_ids: set[int],
                    pad_id: int, device: torch.device, keep_first_logprobs: bool = False, should_stop=lambda: False,
                    max_batch_tokens: int = SHARED_BATCH_TOKENS) -> list[Generation]:
    """One Generation per request, in order, the shared kept part prefilled once for all of them (module docstring:
    the contract). `model`: the base, a *ForCausalLM; the rest as hf_pass.generate. should_stop() is asked
    between decode steps and between batches: StopAtSafePoint drops the whole call."""
    t0 = time.perf_counter()
    shared = shared.to(torch.int64)
    check_group(requests, shared)
    part = prefill_shared(model, requests[0].token_ids, shared, device)
    own_lens = [int(own_positions(r, shared).numel()) for r in requests]
    out: list[Generation | None] = [None] * len(requests)
    for rows in prefix_batches(int(shared.numel()), own_lens, max_batch_tokens):
        if should_stop():
            raise StopAtSafePoint
        group = [requests[i] for i in rows]
        bucket = Bucket(group, eos_ids, device)
        gens = bucket.run(model, tokenizer, pad_id, keep_first_logprobs, t0, should_stop,
                          prefill=own_prefill(part, group, device))
        for i, gen in zip(rows, gens):
            out[i] = gen
    return out  # type: ignore[return-value]
