"""Base pass: prefill only the kept tokens at their original positions, then decode from n.

DESIGN.md steps 9-10. A batch is left-padded to its longest kept length M:

    input_ids      [B, M]  kept token ids (pad on the left)
    attention_mask [B, M]  0 on padding
    position_ids   [B, M]  kept indices (the RoPE positions; gaps are kept), 0 on padding

Decode step t feeds one token per row at position n_b + t. The KV cache holds kept tokens only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache


@dataclass
class PrunedPrompt:
    input_ids: torch.Tensor  # [m] int64, kept token ids
    position_ids: torch.Tensor  # [m] int64, ascending kept indices into the original prompt
    num_prompt_tokens: int  # n, the original length; decoding starts at position n
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0


@dataclass
class Generation:
    token_ids: list[int]  # generated tokens, EOS excluded
    finish_reason: str  # "stop" (EOS) or "length"
    first_logprobs: torch.Tensor | None  # [V] float32 log-softmax of the first decode step, when asked


@dataclass
class BatchTimings:
    prefill_s: float  # the batched prefill, up to the first token of every row
    decode_s: float


def _pick(logits: torch.Tensor, prompts: list[PrunedPrompt], generators: list[torch.Generator | None]) -> torch.Tensor:
    """logits [B, V] -> next ids [B]: greedy, or sampled per row from its own generator."""
    next_ids = logits.argmax(dim=-1)
    for b, p in enumerate(prompts):
        if p.temperature > 0:
            probs = torch.softmax(logits[b].float() / p.temperature, dim=-1).cpu()
            next_ids[b] = int(torch.multinomial(probs, 1, generator=generators[b]))
    return next_ids


@torch.inference_mode()
def generate_pruned(
    model: nn.Module,
    prompts: list[PrunedPrompt],
    eos_ids: set[int],
    pad_id: int,
    device: torch.device,
    keep_first_logprobs: bool = False,
) -> tuple[list[Generation], BatchTimings]:
    t0 = time.perf_counter()
    num_rows = len(prompts)
    width = max(p.input_ids.numel() for p in prompts)
    input_ids = torch.full((num_rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((num_rows, width), dtype=torch.long)
    attention_mask = torch.zeros((num_rows, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        m = p.input_ids.numel()
        input_ids[b, width - m :] = p.input_ids
        position_ids[b, width - m :] = p.position_ids
        attention_mask[b, width - m :] = 1
    input_ids, position_ids, attention_mask = (t.to(device) for t in (input_ids, position_ids, attention_mask))
    generators = [torch.Generator().manual_seed(p.seed) if p.temperature > 0 else None for p in prompts]
    next_pos = torch.tensor([p.num_prompt_tokens for p in prompts], device=device)  # [B]

    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=cache, use_cache=True, logits_to_keep=1,
    )
    logits = out.logits[:, -1, :].float()  # [B, V]
    first = torch.log_softmax(logits, dim=-1).cpu() if keep_first_logprobs else None
    next_ids = _pick(logits, prompts, generators)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()

    tokens: list[list[int]] = [[] for _ in prompts]
    finish = [""] * num_rows
    max_steps = max(p.max_tokens for p in prompts)
    for step in range(max_steps):
        for b, p in enumerate(prompts):
            if finish[b]:
                continue
            tok = int(next_ids[b])
            if tok in eos_ids:
                finish[b] = "stop"
            else:
                tokens[b].append(tok)
                if len(tokens[b]) >= p.max_tokens:
                    finish[b] = "length"
        if all(finish) or step == max_steps - 1:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(num_rows, 1)], dim=1)
        out = model(
            input_ids=next_ids.view(num_rows, 1), attention_mask=attention_mask,
            position_ids=(next_pos + step).view(num_rows, 1), past_key_values=cache, use_cache=True,
        )
        next_ids = _pick(out.logits[:, -1, :].float(), prompts, generators)
    t2 = time.perf_counter()
    gens = [
        Generation(tokens[b], finish[b] or "length", first[b] if first is not None else None)
        for b in range(num_rows)
    ]
    return gens, BatchTimings(t1 - t0, t2 - t1)
