"""Speculator pass over a group of prompts that share a prefix: the prefix is prefilled once (issue 51).

QA jobs ask several questions of one document: prompts `template + document + question_b`. speculate.speculate_batch
would read the document once per question. Here, for a group of B prompts:

    prefix    [p]            the group's longest common token prefix, cut to min_b n_b - 1 (each prompt keeps at
                             least one token of its own, so each has its own last logits to look ahead from);
                             prefilled once, batch 1, `chunk` columns at a time, into a DynamicCache
    suffixes  [B', T_s]      each prompt's own tokens p .. n_b - 1, left-padded to the longest (T_s), at positions
                             p .. n_b - 1, over a copy of the prefix cache per row; attention_mask [B', p + T_s]: 1 on
                             the prefix, 0 on padding. B' prompts per forward, so that B' x (p + T_s) stays within
                             `max_batch_tokens` (each row holds its own copy of the prefix's keys and values)

Prompt b's query rows are its last min(window, n_b) prompt tokens' (from its suffix, and from the prefix's last rows
where the suffix is shorter than the window: a prefix token's query does not depend on what follows it), then its
look-ahead rows; its keys are the prefix's, then its own. Scoring is speculate.score_rows, so each prompt's importance
equals speculate.speculate's on that prompt alone (up to float rounding; tests/test_stages_speculate_shared.py) and its
Speculation is the same hand-off. Without look-ahead the passes stop after the last scored layer (early exit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig
from spcli.models.capture import QueryCapture
from spcli.models.device import synchronize
from spcli.models.load import decoder_prefix
from spcli.stages.batching import Padded, left_pad, prefix_batches
from spcli.stages.speculate import Speculation, look_ahead, prefill, score_rows, speculate_batch
from spcli.stages.share import shared_len

SUFFIX_BATCH_TOKENS = 32768  # padded tokens per suffix forward, the prefix copies included (prepare's bound)


@dataclass
class SharedSpeculation:
    """The speculator pass of one group of prompts sharing a prefix."""

    num_shared: int  # p: the prefix tokens prefilled once for the group
    speculations: list[Speculation]  # one per prompt, in order; importance [n_b] over its whole prompt
    num_speculator_tokens: int  # tokens through the speculator: p + sum_b (n_b - p) (+ look-ahead steps)

    @property
    def num_suffix_tokens(self) -> list[int]:
        return [s.importance.shape[0] - self.num_shared for s in self.speculations]


@dataclass
class PrefixPass:
    """The shared prefix, prefilled once."""

    ids: list[int]  # [p]
    cache: DynamicCache  # [1, KVH, p, D] per layer of `model`
    rows: torch.Tensor  # [L_s, 1, H, R, D] the prefix's last R = min(num_prompt_rows, p) query rows, post-RoPE
    model: nn.Module  # what ran: the decoder cut after the last scored layer (no look-ahead), else the whole model
    layers: list[int]  # the scored layers
    forward_s: float


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """The longest common token prefix of the prompts (share.shared_len), cut so each prompt keeps at least one own
    token."""
    return max(0, min(shared_len(prompts), min(map(len, prompts)) - 1))


@torch.inference_mode()
def prefill_prefix(model: nn.Module, ids: list[int], cfg: ScoreConfig, device: torch.device,
                   chunk: int = SPECULATOR_CHUNK) -> PrefixPass:
    """Prefill `ids` (p >= 1 tokens) once with the speculator `model` (a *ForCausalLM), keeping its cache and its
    last window rows. The LM head never runs: a prefix's logits are no prompt's last."""
    assert cfg.is_resolved, "resolve the score configuration first (spcli.models.profiles.resolve_score)"
    assert ids, "an empty prefix has nothing to prefill"
    t0 = time.perf_counter()
    layers = cfg.layers(getattr(model, "spcli_num_layers", model.config.num_hidden_layers))  # load_prefix sets it
    run = decoder_prefix(model, layers[-1] + 1) if cfg.lookahead == 0 else model
    batch = left_pad([torch.tensor(ids)], [torch.arange(len(ids))], device)
    cache = DynamicCache(config=run.config)
    cap = QueryCapture(layers, cfg.num_prompt_rows, len(ids))
    prefill(run.model if cfg.lookahead else run, batch, cache, cap, chunk)  # no LM head: no prompt ends here
    rows = cap.queries()  # [L_s, 1, H, R, D]
    synchronize(device)
    return PrefixPass(list(ids), cache, rows, run, layers, time.perf_counter() - t0)


def _copies(prefix: PrefixPass, num_rows: int) -> DynamicCache:
    """A new cache holding the prefix's keys and values once per row: [num_rows, KVH, p, D] per layer."""
    cache = DynamicCache(config=prefix.model.config)
    for i, layer in enumerate(prefix.cache.layers):
        cache.update(layer.keys.expand(num_rows, -1, -1, -1).contiguous(),
                     layer.values.expand(num_rows, -1, -1, -1).contiguous(), i)
    return cache


@torch.inference_mode()
def speculate_suffixes(prefix: PrefixPass, suffixes: list[list[int]], cfg: ScoreConfig, eos_ids: set[int],
                       device: torch.device, with_unpooled: bool = False) -> list[Speculation]:
    """One Speculation per suffix (each >= 1 token), of the prompt prefix.ids + suffix, from one forward over copies
    of the prefix cache (left-padded suffixes, positions p ..), then the look-ahead; scored over all its keys."""
    t0 = time.perf_counter()
    p, num_rows = len(prefix.ids), len(suffixes)
    assert all(suffixes), "every prompt needs a token of its own after the prefix"
    own = left_pad([torch.tensor(s) for s in suffixes], [torch.arange(p, p + len(s)) for s in suffixes], device)
    width = own.input_ids.shape[1]
    mask = torch.cat([own.attention_mask.new_ones(num_rows, p), own.attention_mask], dim=1)  # [B, p + T_s]
    batch = Padded(own.input_ids, mask, own.position_ids, own.pads)
    cache = _copies(prefix, num_rows)
    cap = QueryCapture(prefix.layers, cfg.num_prompt_rows, width)
    lookahead: list[list[int]] = [[] for _ in suffixes]
    if cfg.lookahead == 0:
        prefix.model(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                     past_key_values=cache, use_cache=True, spcli_capture=cap)
    else:
        out = prefix.model(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                           past_key_values=cache, use_cache=True, logits_to_keep=1, spcli_capture=cap)
        next_pos = torch.tensor([p + len(s) for s in suffixes], device=device)  # [B] n_b
        lookahead = look_ahead(prefix.model, out.logits[:, -1], mask, next_pos, cache, cap, cfg.lookahead, eos_ids)
    keys = [cache.layers[layer].keys for layer in prefix.layers]  # L_s x [B, KVH, p + T_s (+ steps), D]
    queries = cap.queries()  # [L_s, B, H, S, D]: the suffixes' last rows, then the look-ahead's
    synchronize(device)
    forward_s = time.perf_counter() - t0
    total = sum(map(len, suffixes))
    captured = min(cfg.num_prompt_rows, width)  # suffix columns captured for the whole batch
    out_specs = []
    for b, suffix in enumerate(suffixes):
        s0 = time.perf_counter()
        n, pad, steps = p + len(suffix), batch.pads[b], len(lookahead[b])
        rows = min(cfg.num_prompt_rows, n)  # the prompt's last rows: from its suffix, then the prefix's last ones
        from_suffix = min(rows, len(suffix))
        q = queries[:, b, :, captured - from_suffix : captured + steps]  # [L_s, H, from_suffix + steps, D]
        if rows > from_suffix:
            q = torch.cat([prefix.rows[:, 0, :, prefix.rows.shape[3] - (rows - from_suffix) :], q], dim=2)
        own_keys = [torch.cat([k[b, :, :p], k[b, :, p + pad : p + width]], dim=1) for k in keys]  # L_s x [KVH, n, D]
        importance, unpooled = score_rows(q.contiguous(), own_keys, cfg, rows, steps, with_unpooled)
        synchronize(importance.device)
        out_specs.append(Speculation(importance.float().cpu(), q.shape[2], lookahead[b],
                                     forward_s * len(suffix) / total + time.perf_counter() - s0,
                                     None if unpooled is None else unpooled.float().cpu()))
    return out_specs


def speculate_shared(model: nn.Module, prompts: list[list[int]], cfg: ScoreConfig, eos_ids: set[int],
                     device: torch.device, chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False,
                     max_batch_tokens: int = SUFFIX_BATCH_TOKENS) -> SharedSpeculation:
    """The group's Speculations, the shared prefix prefilled once (each prompt's speculate_s: its share of the
    prefix by prompt, plus its suffix pass and scoring). Prompts sharing no token run as speculate_batch."""
    p = shared_prefix_len(prompts)
    if p == 0:
        specs = speculate_batch(model, prompts, cfg, eos_ids, device, chunk=chunk, with_unpooled=with_unpooled)
        return SharedSpeculation(0, specs, sum(map(len, prompts)) + sum(len(s.lookahead_ids) for s in specs))
    prefix = prefill_prefix(model, prompts[0][:p], cfg, device, chunk)
    suffixes = [q[p:] for q in prompts]
    specs: list[Speculation | None] = [None] * len(prompts)
    for group in prefix_batches(p, list(map(len, suffixes)), max_batch_tokens):
        for i, spec in zip(group, speculate_suffixes(prefix, [suffixes[i] for i in group], cfg, eos_ids, device,
                                                     with_unpooled)):
            spec.speculate_s += prefix.forward_s / len(prompts)
            specs[i] = spec
    steps = sum(len(s.lookahead_ids) for s in specs)
    return SharedSpeculation(p, specs, p + sum(map(len, suffixes)) + steps)  # type: ignore[arg-type]
