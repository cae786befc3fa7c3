"""Token selectors compared by `spcli eval`: SpecPrefill and the baselines, over one selection machinery.

Every selector only builds an importance vector [n]; `spcli.stages.select.select_tokens` then applies
the same budget ceil(keep * n) (at keep auto: the one the speculator's unpooled importance gives), forced
tokens and chunking to all of them, so they differ in what they rank and in nothing else.

    specprefill       speculator attention of the configured query rows (window / look-ahead, scored layers)
    specprefill-paper the same speculator with the paper's recipe (look-ahead 8, every layer, the last
                      prompt token, pool 13, chunk 32): the old default, to compare against, paired
    random            one seeded random score per chunk: random chunks
    recency           position: the last tokens only (keep_first forced to 0; no sink)
    sink-recency      position, with the first keep_first tokens forced: StreamingLLM's sink + window
    self-information  speculator surprisal -log p(x_i | x_<i) (Selective-Context / LLMLingua)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE, SPECULATOR_CHUNK, ScoreConfig, SelectConfig
from spcli.errors import ConfigError
from spcli.stages.align import Alignment, carry
from spcli.stages.select import is_pruned, select_tokens
from spcli.stages.speculate import speculate

SELECTORS = ("specprefill", "specprefill-paper", "random", "recency", "sink-recency", "self-information")
USES_SPECULATOR = frozenset({"specprefill", "specprefill-paper", "self-information"})
SURPRISAL_ROWS = 256  # LM-head rows per step: [256, V] logits at a time, never [n, V]


@dataclass
class Signals:
    """What one speculator pass over a prompt gives the selectors."""

    importance: torch.Tensor  # [n] float32, SpecPrefill token importance
    surprisal: torch.Tensor  # [n] float32, -log p(x_i | x_<i) under the speculator; 0 for token 0
    speculate_s: float  # speculator forward + scoring (as spcli run counts it)
    surprisal_s: float  # LM head over every prompt position + log-softmax (+ the full forward after an early exit)
    paper_importance: torch.Tensor | None = None  # [n] float32 with the paper's recipe, when asked
    paper_s: float = 0.0  # its speculator pass + scoring
    forced: torch.Tensor | None = None  # [n] bool: tokens a speculator of another tokenizer has no score for
    unpooled: torch.Tensor | None = None  # [n] float32, `importance` at pool 1: keep auto's budget, when asked


def carried(signals: Signals, alignment: Alignment | None) -> Signals:
    """A speculator's signals over its own tokens carried to the base's (spcli.stages.align); as they are
    without an alignment (same tokenizer)."""
    if alignment is None:
        return signals
    paper = None if signals.paper_importance is None else carry(signals.paper_importance, alignment)
    unpooled = None if signals.unpooled is None else carry(signals.unpooled, alignment)
    return dataclasses.replace(signals, importance=carry(signals.importance, alignment),
                               surprisal=carry(signals.surprisal, alignment), paper_importance=paper,
                               forced=alignment.forced, unpooled=unpooled)


def prompt_signals(signals: Signals, n: int) -> Signals:
    """Signals over a prompt and its restated instruction (spcli.stages.restate) cut to the prompt's n tokens."""
    if signals.importance.numel() == n:
        return signals
    cut = lambda t: None if t is None else t[:n]
    return dataclasses.replace(signals, importance=signals.importance[:n], surprisal=signals.surprisal[:n],
                               paper_importance=cut(signals.paper_importance), unpooled=cut(signals.unpooled))


def check_selectors(names: tuple[str, ...]) -> None:
    for name in names:
        if name not in SELECTORS:
            raise ConfigError(f"unknown selector {name!r}: use one of {', '.join(SELECTORS)}")


@torch.inference_mode()
def speculator_signals(
    model: nn.Module, input_ids: list[int], cfg: ScoreConfig, eos_ids: set[int], device: torch.device,
    with_surprisal: bool = True, with_paper: bool = False, chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False,
) -> Signals:
    """One speculator pass (spcli's own `speculate`, `chunk` tokens per prefill call) that also yields
    per-token surprisal.

    With look-ahead, the final hidden states [1, n, hidden] of the prefill calls are caught by a
    forward hook on the decoder stack, so self-information costs an LM-head pass, not a second
    prefill. After an early exit (no look-ahead) there are none: a full forward computes them.
    Without `with_surprisal` (no self-information selector) surprisal is all zeros and costs nothing.
    `with_unpooled`: the importance at pool 1 too (keep auto's budget, for every selector).
    """
    paper = (speculate(model, input_ids, dataclasses.replace(cfg, **PAPER_SCORE), eos_ids, device, chunk=chunk)
             if with_paper else None)
    extra = (paper.importance, paper.speculate_s) if paper else (None, 0.0)
    if not with_surprisal:
        spec = speculate(model, input_ids, cfg, eos_ids, device, chunk=chunk, with_unpooled=with_unpooled)
        return Signals(spec.importance, torch.zeros(len(input_ids)), spec.speculate_s, 0.0, *extra,
                       unpooled=spec.unpooled)
    hidden: list[torch.Tensor] = []

    def keep_prefill(_module, _args, output):
        if sum(h.shape[0] for h in hidden) < len(input_ids):  # the prefill's chunks, not the look-ahead steps
            hidden.append(output.last_hidden_state[0])  # [chunk, hidden]

    is_early_exit = cfg.lookahead == 0
    handle = None if is_early_exit else model.model.register_forward_hook(keep_prefill)
    try:
        spec = speculate(model, input_ids, cfg, eos_ids, device, chunk=chunk, with_unpooled=with_unpooled)
    finally:
        if handle is not None:
            handle.remove()  # module copies made by first_layers share the hook dict with the base model
    t0 = time.perf_counter()
    ids = torch.tensor(input_ids, device=device)  # [n]
    if is_early_exit:
        hidden.append(model.model(input_ids=ids[None]).last_hidden_state[0])
    states = torch.cat(hidden)  # [n, hidden]
    surprisal = torch.zeros(len(input_ids), dtype=torch.float32)  # [n]
    for start in range(0, len(input_ids) - 1, SURPRISAL_ROWS):
        end = min(len(input_ids) - 1, start + SURPRISAL_ROWS)
        logits = model.lm_head(states[start:end]).float()  # [rows, V]: predicts tokens start+1 .. end
        logp = torch.log_softmax(logits, dim=-1)
        surprisal[start + 1 : end + 1] = -logp.gather(1, ids[start + 1 : end + 1, None])[:, 0].cpu()
    return Signals(spec.importance, surprisal, spec.speculate_s, time.perf_counter() - t0, *extra,
                   unpooled=spec.unpooled)


def random_seed(seed: int, example_id: str) -> int:
    """Per-example seed: one random chunk ranking per (seed, example), shared by every keep rate."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{example_id}".encode()).digest()[:7], "big")


def importance_for(selector: str, n: int, signals: Signals | None, cfg: SelectConfig, seed: int) -> torch.Tensor:
    """[n] float32 importance that makes select_tokens implement `selector`."""
    if selector in USES_SPECULATOR:
        assert signals is not None, f"{selector} needs the speculator pass"
        if selector == "specprefill-paper":
            assert signals.paper_importance is not None, "speculator_signals(with_paper=True)"
            return signals.paper_importance
        return signals.importance if selector == "specprefill" else signals.surprisal
    if selector == "random":
        num_chunks = math.ceil(n / cfg.chunk)
        scores = torch.rand(num_chunks, generator=torch.Generator().manual_seed(seed))  # [num_chunks]
        return scores.repeat_interleave(cfg.chunk)[:n]
    if selector in ("recency", "sink-recency"):
        return torch.arange(n, dtype=torch.float32)
    raise ConfigError(f"unknown selector {selector!r}: use one of {', '.join(SELECTORS)}")


def config_for(selector: str, cfg: SelectConfig) -> SelectConfig:
    """Recency keeps the last tokens only: no sink tokens are forced. The paper's recipe selects fixed chunks of 32."""
    if selector == "recency":
        return dataclasses.replace(cfg, keep_first=0)
    return dataclasses.replace(cfg, chunk=PAPER_CHUNK, unit="chunk") if selector == "specprefill-paper" else cfg


def select(selector: str, n: int, signals: Signals | None, cfg: SelectConfig, keep: float | str, seed: int,
           layout=None) -> torch.Tensor:
    """Kept indices [m] int64, ascending, for one prompt of n tokens (all of them when it is not pruned);
    `layout`: the prompt's selection units and protected tokens (spcli.stages.tokenize.Layout); the paper's
    recipe selects fixed chunks."""
    cfg = config_for(selector, cfg)
    if not is_pruned(n, cfg, keep):
        return torch.arange(n)  # short prompt or keep 1.0: no speculator pass was needed
    forced = signals.forced if signals is not None and selector in USES_SPECULATOR else None
    unpooled = None if signals is None else signals.unpooled  # keep auto: the speculator's budget, for every selector
    units, protected = (None, None) if layout is None else (layout.units, layout.protected)
    return select_tokens(importance_for(selector, n, signals, cfg, seed), cfg, keep, forced, unpooled, units, protected)
