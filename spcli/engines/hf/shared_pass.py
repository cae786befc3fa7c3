"""The base pass on transformers for groups of requests that each share a kept prefix: every group's shared part is
prefilled once (issue 51, QA jobs asking several questions of one document).

Contract (HFEngine.generate calls it for the members of a document group, spcli/stages/share.py). A `SharedGroup`:

    requests   B PrunedRequests whose token_ids share their first p tokens (a document and its template, as
               speculate_shared.shared_prefix_len finds them); each one's `kept` is everything its base sees
    shared     [m_s] int64, ascending positions < p, a subset of every request's kept: the group's kept document,
               prefilled ONCE, one row, position_ids = the positions themselves (RoPE sees the gaps, as base_pass)
    own_b      kept_b minus shared, ascending, at least one token (the request's own last logits): appended after
               the shared part, at their original positions

then decoding from n_b as base_pass does (its Bucket: greedy or seeded sampling, EOS, max_tokens, logprobs). Rows of
several groups run together, `max_batch_tokens` cache slots at a time (rows x (longest shared + longest own part)):

    cache   [R, KVH, M, D] per layer  each row's group's shared keys/values right-aligned in M = the batch's longest
                                      m_s (copies), then its own tokens, left-padded to the longest own part T
    mask    [R, M + T]                1 on each row's shared and own tokens, 0 on padding (None where none)

Where every own position lies after the last shared one (a question after its document) the result is
base_pass.generate's of the same kept set: exact (tests/test_engines_hf_shared_pass.py). An own position inside the
document (a per-question top-up) is still prefilled at its position, but after the shared part in the cache, so it
attends to every shared token, later ones included, and no shared token attends to it: an approximation
(benches/shared_docs_rules.py measures its answers). Generation.prefill_s is the own tokens' prefill; the shared
parts' is in ttft_s (from the call's start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.engines.hf.base_pass import Bucket
from spcli.errors import StopAtSafePoint
from spcli.stages.batching import left_pad, prefix_batches
from spcli.stages.request import Generation, PrunedRequest

SHARED_BATCH_TOKENS = 65536  # cache slots (rows x (shared + own) tokens) per batch: each row holds a copy of its group's


@dataclass
class SharedGroup:
    """Requests whose kept sets share `shared` (the module docstring's contract)."""

    requests: list[PrunedRequest]
    shared: torch.Tensor  # [m_s] int64, ascending positions < the group's common prefix

    def __post_init__(self) -> None:
        self.shared = self.shared.to(torch.int64)

    def own(self, b: int) -> torch.Tensor:
        """[m_b - m_s] int64, ascending: request b's kept positions that are not shared."""
        kept = self.requests[b].kept
        return kept[~torch.isin(kept, self.shared)]

    def check(self) -> None:
        assert self.requests, "a group has at least one request"
        shared = self.shared
        assert bool((shared[1:] > shared[:-1]).all()), "shared positions must be ascending"
        p = int(shared[-1]) + 1 if shared.numel() else 0
        head = self.requests[0].token_ids[:p]
        for b, r in enumerate(self.requests):
            assert r.token_ids[:p] == head, f"{r.record_id}: the shared positions must hold the same tokens in every request"
            assert bool(torch.isin(shared, r.kept).all()), f"{r.record_id}: its kept set must hold every shared position"
            assert self.own(b).numel() >= 1, f"{r.record_id}: needs a kept token of its own after the shared part"


def prefill_shared(model: nn.Module, group: SharedGroup, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The group's shared tokens at their positions, one row (no LM head: no request ends there): per layer
    (keys, values), each [KVH, m_s, D]."""
    cache = DynamicCache(config=model.config)
    if group.shared.numel():
        ids = torch.tensor(group.requests[0].token_ids, dtype=torch.long)[group.shared]
        model.model(input_ids=ids[None].to(device), position_ids=group.shared[None].to(device), past_key_values=cache,
                    use_cache=True)
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    return []


def own_prefill(rows: list[tuple[PrunedRequest, torch.Tensor, list]], device: torch.device):
    """Bucket.run's prefill for rows (request, own positions [T_b], its group's shared (keys, values) per layer):
    prefill(model, pad_id) -> (cache, mask [R, M + T] or None, last logits [R, V] float32), the layout above."""

    def prefill(model: nn.Module, pad_id: int):
        num_rows, num_layers = len(rows), model.config.num_hidden_layers
        lens = [kv[0][0].shape[1] if kv else 0 for _, _, kv in rows]  # m_s per row
        width = max(lens)  # M
        batch = left_pad([torch.tensor(r.token_ids, dtype=torch.long)[o] for r, o, _ in rows], [o for _, o, _ in rows],
                         device, fill=pad_id)  # [R, T]
        shared_mask = torch.zeros(num_rows, width, dtype=batch.attention_mask.dtype, device=device)  # [R, M]
        for b, m in enumerate(lens):
            shared_mask[b, width - m :] = 1
        cache = DynamicCache(config=model.config)
        if width:
            for layer in range(num_layers):
                ref = next(kv for _, _, kv in rows if kv)[layer][0]  # [KVH, m, D]
                keys = ref.new_zeros(num_rows, ref.shape[0], width, ref.shape[2])  # [R, KVH, M, D]
                values = torch.zeros_like(keys)
                for b, (_, _, kv) in enumerate(rows):
                    if kv:
                        keys[b, :, width - lens[b] :], values[b, :, width - lens[b] :] = kv[layer]
                cache.update(keys, values, layer)
        mask = torch.cat([shared_mask, batch.attention_mask], dim=1)  # [R, M + T]
        mask = None if bool(mask.all()) else mask
        out = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, mask, out.logits[:, -1, :].float()

    return prefill


@torch.inference_mode()
def generate_shared(model: nn.Module, groups: list[SharedGroup], tokenizer, eos_ids: set[int], pad_id: int,
                    device: torch.device, keep_first_logprobs: bool = False, should_stop=lambda: False,
                    max_batch_tokens: int = SHARED_BATCH_TOKENS) -> list[list[Generation]]:
    """Per group, one Generation per request, in order; each group's shared kept part prefilled once (the module
    docstring: the contract). `model`: the base, a *ForCausalLM; the rest as base_pass.generate. should_stop() is
    asked between decode steps and between batches: StopAtSafePoint drops the whole call."""
    t0 = time.perf_counter()
    for g in groups:
        g.check()
    parts = [prefill_shared(model, g, device) for g in groups]
    rows = [(g.requests[b], g.own(b), parts[i], (i, b)) for i, g in enumerate(groups) for b in range(len(g.requests))]
    out = [[None] * len(g.requests) for g in groups]
    longest_shared = max(int(g.shared.numel()) for g in groups)
    for batch in prefix_batches(longest_shared, [int(r[1].numel()) for r in rows], max_batch_tokens):
        if should_stop():
            raise StopAtSafePoint
        chosen = [rows[j] for j in batch]
        bucket = Bucket([r for r, *_ in chosen], eos_ids, device, model.config.vocab_size, tokenizer)
        gens = bucket.run(model, tokenizer, pad_id, keep_first_logprobs, t0, should_stop,
                          prefill=own_prefill([(r, o, kv) for r, o, kv, _ in chosen], device))
        for (*_, (i, b)), gen in zip(chosen, gens):
            out[i][b] = gen
    return out  # type: ignore[return-value]
