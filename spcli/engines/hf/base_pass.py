"""The base pass on transformers: prefill only the kept tokens at their original positions, then
decode from n.

DESIGN.md steps 9-10. The requests are first split into length buckets (`length_buckets`), shortest
first, so a short prompt is never padded to a long one and gets its first token as soon as its own
bucket is prefilled. A bucket is left-padded to its longest kept length M:

    input_ids      [B, M]  kept token ids (pad on the left)
    attention_mask [B, M]  0 on padding; None when the bucket has no padding
    position_ids   [B, M]  kept indices (the RoPE positions; gaps are kept), 0 on padding

The mask stays 2-D: sdpa's mask builder (transformers' `sdpa_mask`) makes what the kernel needs,
and with no padding it builds nothing (the kernel's causal flag). Decode step t feeds one token per
row at position n_b + t. The KV cache holds kept tokens only. Finish bookkeeping stays on the device;
the loop syncs once per step (`done.all()`; twice in a bucket with stop strings), and the tokens come back once
at the end. Penalties, filters and stop strings (a request's `sampling`): sampling.py, as vLLM applies them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from spcli.engines.hf.sampling import SamplingRules, StopStrings
from spcli.engines.stop_strings import stop_at
from spcli.errors import StopAtSafePoint
from spcli.models.device import synchronize
from spcli.stages.batching import left_pad, length_groups
from spcli.stages.request import Generation, PrunedRequest, TokenLogprob

MAX_PADDING = 1.25  # a bucket's padded tokens over its real tokens ...
PADDING_SLACK = 256  # ... plus this many pad tokens per row: a bucket costs a decode loop, so short prompts share one


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """Indices grouped by length, shortest first; a bucket's padded size B*M stays within
    MAX_PADDING * (its real tokens) + PADDING_SLACK * B."""
    return length_groups(lengths, longest_first=False, max_padding=MAX_PADDING, slack_per_row=PADDING_SLACK)


@torch.inference_mode()
def generate(
    model: nn.Module,
    prompts: list[PrunedRequest],
    tokenizer,
    eos_ids: set[int],
    pad_id: int,
    device: torch.device,
    keep_first_logprobs: bool = False,
    bucket: bool = True,
    should_stop=lambda: False,
) -> list[Generation]:
    """One Generation per request, in order. keep_first_logprobs: also return the first step's [V]
    log-softmax. bucket=False runs the requests as one padded batch (for comparison). should_stop()
    is asked between decode steps: StopAtSafePoint drops the whole call."""
    t0 = time.perf_counter()
    groups = length_buckets([int(p.kept.numel()) for p in prompts]) if bucket else [list(range(len(prompts)))]
    out: list[Generation | None] = [None] * len(prompts)
    for group in groups:
        batch = Bucket([prompts[i] for i in group], eos_ids, device, model.config.vocab_size, tokenizer)
        for i, gen in zip(group, batch.run(model, tokenizer, pad_id, keep_first_logprobs, t0, should_stop)):
            out[i] = gen
    return out  # type: ignore[return-value]


@dataclass
class _Steps:
    """What the decode loop keeps per step, on the device until the end."""

    ids: list[torch.Tensor]  # per step [B] int64, the picked token
    active: list[torch.Tensor]  # per step [B] bool, the token is output (not EOS, row not done)
    logprob: list[torch.Tensor]  # per step [B] float32, the picked token's logprob (when asked)
    top_ids: list[torch.Tensor]  # per step [B, N] int64
    top_logprobs: list[torch.Tensor]  # per step [B, N] float32


class Bucket:
    """One bucket: prefill (`prefill`, or the one `run` is given: shared_pass's), then decode until every row stops."""

    def __init__(self, prompts: list[PrunedRequest], eos_ids: set[int], device: torch.device, vocab_size: int,
                 tokenizer):
        self.prompts = prompts
        self.device = device
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)  # [E]
        self.max_tokens = torch.tensor([p.max_tokens for p in prompts], device=device)  # [B]
        self.num_logprobs = max(p.num_logprobs for p in prompts)
        sampled = [b for b, p in enumerate(prompts) if p.temperature > 0]
        self.sampled = torch.tensor(sampled, dtype=torch.long, device=device)  # [S]
        self.temperature = torch.tensor([prompts[b].temperature for b in sampled], device=device)  # [S]
        # one generator per sampled row, on the device: a row's draws do not depend on its batch
        self.generators = [torch.Generator(device=device).manual_seed(prompts[b].seed) for b in sampled]
        self.rules = SamplingRules(prompts, sampled, vocab_size, device)
        self.stops = StopStrings(prompts, tokenizer) if any(p.sampling.stop for p in prompts) else None

    def pick(self, logits: torch.Tensor, picked: list[torch.Tensor]) -> torch.Tensor:
        """logits [B, V] float32, picked: the ids [B] of the steps before -> next ids [B]: penalties applied,
        then greedy, or sampled per row (the filters, then the exponential race: argmax p / E with E ~ Exp(1)
        draws from p), batched over the sampled rows."""
        if self.rules.processors:
            output_ids = torch.stack(picked, dim=1) if picked else logits.new_zeros(len(logits), 0, dtype=torch.long)
            logits = self.rules.penalize(output_ids, logits)  # [B, V]
        next_ids = logits.argmax(dim=-1)
        if self.generators:
            race = torch.stack([torch.empty(logits.shape[-1], device=self.device).exponential_(generator=g)
                                for g in self.generators])  # [S, V]
            scores = self.rules.filter(logits[self.sampled] / self.temperature[:, None]) - race.log()
            next_ids[self.sampled] = scores.argmax(dim=-1)
        return next_ids

    def record(self, steps: _Steps, logits: torch.Tensor, next_ids: torch.Tensor) -> None:
        steps.ids.append(next_ids)
        if self.num_logprobs:
            logp = torch.log_softmax(logits, dim=-1)  # [B, V]
            steps.logprob.append(logp.gather(1, next_ids[:, None])[:, 0])
            top = logp.topk(self.num_logprobs, dim=-1)
            steps.top_ids.append(top.indices)
            steps.top_logprobs.append(top.values)

    def prefill(self, model: nn.Module, pad_id: int) -> tuple[DynamicCache, torch.Tensor | None, torch.Tensor]:
        """Every row's kept tokens at their positions: (the cache, the mask [B, M] (None without padding), the last
        logits [B, V] float32)."""
        batch = left_pad([p.kept_ids() for p in self.prompts], [p.kept for p in self.prompts], self.device, fill=pad_id)
        mask = batch.attention_mask if batch.is_padded else None
        cache = DynamicCache(config=model.config)
        out = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=batch.position_ids,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, mask, out.logits[:, -1, :].float()

    def run(self, model: nn.Module, tokenizer, pad_id: int, keep_first_logprobs: bool, t0: float,
            should_stop, prefill=None) -> list[Generation]:
        """prefill(model, pad_id) -> (cache, mask, logits) as Bucket.prefill's (default: it)."""
        prompts, device = self.prompts, self.device
        num_rows = len(prompts)
        next_pos = torch.tensor([p.num_prompt_tokens for p in prompts], device=device)  # [B] n

        t_start = time.perf_counter()
        cache, mask, logits = (prefill or self.prefill)(model, pad_id)
        first = torch.log_softmax(logits, dim=-1).cpu() if keep_first_logprobs else None
        steps = _Steps([], [], [], [], [])
        next_ids = self.pick(logits, steps.ids)
        self.record(steps, logits, next_ids)
        synchronize(device)
        t1 = time.perf_counter()

        done = torch.zeros(num_rows, dtype=torch.bool, device=device)  # [B]
        is_stop = torch.zeros_like(done)  # [B] stopped on EOS
        num_out = torch.zeros(num_rows, dtype=torch.long, device=device)  # [B]
        max_steps = max(p.max_tokens for p in prompts)
        for step in range(max_steps):
            is_eos = torch.isin(next_ids, self.eos) & ~done
            active = ~done & ~is_eos
            steps.active.append(active)
            is_stop |= is_eos
            num_out += active
            done |= is_eos | (num_out >= self.max_tokens)
            if self.stops is not None:
                is_stop_string = self.stops.update(next_ids, active)  # [B]
                is_stop |= is_stop_string
                done |= is_stop_string
            if step == max_steps - 1 or bool(done.all()):  # the loop's one sync
                break
            if should_stop():
                raise StopAtSafePoint
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(num_rows, 1)], dim=1)
            out = model(input_ids=next_ids.view(num_rows, 1), attention_mask=mask,
                        position_ids=(next_pos + step).view(num_rows, 1), past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :].float()
            next_ids = self.pick(logits, steps.ids)
            self.record(steps, logits, next_ids)
        t2 = time.perf_counter()
        return self._generations(steps, is_stop.tolist(), tokenizer, first,
                                 ttft_s=t1 - t0, prefill_s=t1 - t_start, decode_s=t2 - t1)

    def _generations(self, steps: _Steps, is_stop: list[bool], tokenizer, first, ttft_s, prefill_s, decode_s):
        num_steps = len(steps.active)
        ids = torch.stack(steps.ids[:num_steps], dim=1).tolist()  # [B, T]
        active = torch.stack(steps.active, dim=1).tolist()  # [B, T]
        if self.num_logprobs:
            lp = torch.stack(steps.logprob[:num_steps], dim=1).tolist()  # [B, T]
            top_ids = torch.stack(steps.top_ids[:num_steps], dim=1).tolist()  # [B, T, N]
            top_lp = torch.stack(steps.top_logprobs[:num_steps], dim=1).tolist()  # [B, T, N]
        gens = []
        for b, p in enumerate(self.prompts):
            kept_steps = [t for t in range(num_steps) if active[b][t]]
            tokens = [ids[b][t] for t in kept_steps]
            logprobs = None
            if p.num_logprobs:
                k = p.num_logprobs
                logprobs = [TokenLogprob(ids[b][t], lp[b][t], list(zip(top_ids[b][t][:k], top_lp[b][t][:k])))
                            for t in kept_steps]
            decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)
            _, text, _ = stop_at(tokens, decode, p.sampling.stop)  # the text before the stop string it ended on
            gens.append(Generation(
                tokens, text, "stop" if is_stop[b] else "length",
                ttft_s=ttft_s, prefill_s=prefill_s, decode_s=decode_s, logprobs=logprobs,
                first_logprobs=first[b] if first is not None else None,
            ))
        return gens
