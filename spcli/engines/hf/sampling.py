"""The hf engine's sampling settings (spcli.config.sampling), applied as vLLM 0.32's sampler applies them, so that
a record gives the same tokens on both engines at temperature 0 (tests/test_engines_vllm_sampling.py).

Per decode step, on logits [B, V] float32 (vllm/v1/sample/sampler.py, Sampler.forward and sample):
  1. penalties, greedy and sampled rows alike: repetition, then frequency, then presence
     (vllm/model_executor/layers/utils.py apply_penalties; OpenAI's definition for the last two);
  2. greedy rows: argmax. Sampled rows: logits / temperature, then min_p, top_k, top_p (-inf outside), then the
     exponential race of base_pass.py. Logprobs stay those of the raw logits (vLLM's default, raw_logprobs).
The penalties' "prompt" is the kept tokens: what the base model read, and the prompt vLLM's sampler sees.
Stop strings are looked for in each row's decoded output after every step (`StopStrings`).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from spcli.engines.stop_strings import first_stop
from spcli.stages.request import PrunedRequest


class PresenceFrequencyPenalty(LogitsProcessor):
    """OpenAI's presence and frequency penalties, as vLLM applies them: logit[t] -= frequency x count(t) +
    presence x [count(t) > 0], count over the output so far. A transformers LogitsProcessor: `input_ids` [B, L]
    are the prompt (its first `prompt_len` columns, not counted) and the output."""

    def __init__(self, presence: torch.Tensor, frequency: torch.Tensor, prompt_len: int = 0):
        self.presence, self.frequency = presence, frequency  # [B] float32 each
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = output_counts(input_ids[:, self.prompt_len:], scores)  # [B, V]
        return scores - self.frequency[:, None] * counts - self.presence[:, None] * (counts > 0)


class RepetitionPenalty(LogitsProcessor):
    """vLLM's repetition penalty (apply_repetition_penalties_torch): a token of the prompt or the output so far has
    its logit x 1/p where positive, x p otherwise. `prompt_mask` [B, V] bool: the prompt's tokens."""

    def __init__(self, penalty: torch.Tensor, prompt_mask: torch.Tensor, prompt_len: int = 0):
        self.penalty, self.prompt_mask, self.prompt_len = penalty, prompt_mask, prompt_len  # [B], [B, V]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = self.prompt_mask | (output_counts(input_ids[:, self.prompt_len:], scores) > 0)  # [B, V]
        penalties = torch.where(seen, self.penalty[:, None].expand_as(scores), 1.0)
        return scores * torch.where(scores > 0, 1.0 / penalties, penalties)


def output_counts(output_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """[B, T] int64 token ids -> [B, V] float32 how often each token occurs per row."""
    counts = torch.zeros_like(scores)
    return counts.scatter_add_(1, output_ids, torch.ones_like(output_ids, dtype=scores.dtype))


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [S, V] (after temperature), min_p [S]: tokens whose probability is under min_p x the row's highest go
    to -inf (vLLM's MinPLogitsProcessor)."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def top_k_top_p_filter(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """logits [S, V], k [S] int64 (V = all), p [S] float32 (1.0 = all) -> logits with -inf outside the top k and
    outside the smallest top set of probability p (vLLM's apply_top_k_top_p_pytorch: ties at the k-th value stay,
    the most likely token always stays)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)  # [S, V] ascending
    kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))  # [S, 1] the k-th largest value
    logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    cumulative = logits_sort.softmax(dim=-1).cumsum(dim=-1)  # [S, V]
    outside = cumulative <= 1 - p.unsqueeze(1)
    outside[:, -1] = False
    logits_sort = logits_sort.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(1, logits_idx, logits_sort)


class SamplingRules:
    """One bucket's sampling settings (its rows' `PrunedRequest.sampling`), as tensors on the device."""

    def __init__(self, prompts: list[PrunedRequest], sampled: list[int], vocab_size: int, device: torch.device):
        self.device = device
        settings = [p.sampling for p in prompts]
        self.processors: list[LogitsProcessor] = []
        if any(s.presence_penalty or s.frequency_penalty for s in settings):
            self.processors.append(PresenceFrequencyPenalty(self._floats([s.presence_penalty for s in settings]),
                                                            self._floats([s.frequency_penalty for s in settings])))
        if any(s.repetition_penalty != 1.0 for s in settings):
            mask = torch.zeros(len(prompts), vocab_size, dtype=torch.bool, device=device)  # [B, V]
            for b, p in enumerate(prompts):
                mask[b, p.kept_ids().to(device)] = True
            self.processors.insert(0, RepetitionPenalty(self._floats([s.repetition_penalty for s in settings]), mask))
        picked = [settings[b] for b in sampled]  # the filters apply to sampled rows only
        self.min_p = self._floats([s.min_p for s in picked]) if any(s.min_p > 0 for s in picked) else None  # [S]
        self.top_k = self.top_p = None
        if any(s.top_k > 0 or s.top_p < 1.0 for s in picked):
            self.top_k = torch.tensor([s.top_k or vocab_size for s in picked], dtype=torch.long, device=device)  # [S]
            self.top_p = self._floats([s.top_p for s in picked])  # [S]

    def _floats(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def penalize(self, output_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """output_ids [B, T] (the tokens picked so far), logits [B, V] -> logits with the penalties applied."""
        for processor in self.processors:
            logits = processor(output_ids, logits)
        return logits

    def filter(self, scaled: torch.Tensor) -> torch.Tensor:
        """The sampled rows' logits [S, V], divided by their temperature -> min_p, top_k and top_p applied."""
        if self.min_p is not None:
            scaled = min_p_filter(scaled, self.min_p)
        if self.top_k is not None:
            scaled = top_k_top_p_filter(scaled, self.top_k, self.top_p)
        return scaled


class StopStrings:
    """Rows with stop strings: each step's picked tokens decoded with the row's output so far; a row whose text
    now holds one of its stop strings is done (its last token is output: the string's end)."""

    def __init__(self, prompts: list[PrunedRequest], tokenizer):
        self.stops = {b: p.sampling.stop for b, p in enumerate(prompts) if p.sampling.stop}
        self.tokens: dict[int, list[int]] = {b: [] for b in self.stops}
        self.tokenizer = tokenizer

    def update(self, next_ids: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """next_ids [B], active [B] bool (the token is output) -> [B] bool: rows whose output now holds a stop string."""
        ids, is_active = next_ids.tolist(), active.tolist()  # a sync: only buckets with stop strings pay it
        hit = [False] * len(ids)
        for b, stop in self.stops.items():
            if is_active[b]:
                self.tokens[b].append(ids[b])
                hit[b] = first_stop(self.tokenizer.decode(self.tokens[b], skip_special_tokens=True), stop) is not None
        return torch.tensor(hit, device=next_ids.device)
