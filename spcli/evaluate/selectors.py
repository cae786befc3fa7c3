"""Token selectors compared by `spcli eval`: SpecPrefill and the baselines, over one selection machinery.

Every selector only builds an importance vector [n]; `spcli.engine.select.select_tokens` then applies
the same budget ceil(keep * n), forced tokens and chunking to all of them, so they differ in what
they rank and in nothing else.

    specprefill       speculator attention of the last prompt token and the look-ahead (the paper)
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

from spcli.config import ScoreConfig, SelectConfig
from spcli.engine.select import is_pruned, select_tokens
from spcli.engine.speculate import speculate
from spcli.errors import ConfigError

SELECTORS = ("specprefill", "random", "recency", "sink-recency", "self-information")
USES_SPECULATOR = frozenset({"specprefill", "self-information"})
SURPRISAL_ROWS = 256  # LM-head rows per step: [256, V] logits at a time, never [n, V]


@dataclass
class Signals:
    """What one speculator pass over a prompt gives the selectors."""

    importance: torch.Tensor  # [n] float32, SpecPrefill token importance
    surprisal: torch.Tensor  # [n] float32, -log p(x_i | x_<i) under the speculator; 0 for token 0
    speculate_s: float  # speculator prefill + look-ahead
    score_s: float  # attention scoring
    surprisal_s: float  # LM head over every prompt position + log-softmax


def check_selectors(names: tuple[str, ...]) -> None:
    for name in names:
        if name not in SELECTORS:
            raise ConfigError(f"unknown selector {name!r}: use one of {', '.join(SELECTORS)}")


@torch.inference_mode()
def speculator_signals(
    model: nn.Module, input_ids: list[int], cfg: ScoreConfig, eos_ids: set[int], device: torch.device
) -> Signals:
    """One speculator pass (spcli's own `speculate`) that also yields per-token surprisal.

    The final hidden states [1, n, hidden] of the prefill call are caught by a forward hook on the
    decoder stack, so self-information costs an LM-head pass, not a second prefill.
    """
    hidden: list[torch.Tensor] = []

    def keep_prefill(_module, _args, output):
        if not hidden:
            hidden.append(output.last_hidden_state[0])  # [n, hidden]

    handle = model.model.register_forward_hook(keep_prefill)
    try:
        spec = speculate(model, input_ids, cfg, eos_ids, device)
    finally:
        handle.remove()  # module copies made by first_layers share the hook dict with the base model
    t0 = time.perf_counter()
    ids = torch.tensor(input_ids, device=device)  # [n]
    surprisal = torch.zeros(len(input_ids), dtype=torch.float32)  # [n]
    for start in range(0, len(input_ids) - 1, SURPRISAL_ROWS):
        end = min(len(input_ids) - 1, start + SURPRISAL_ROWS)
        logits = model.lm_head(hidden[0][start:end]).float()  # [rows, V]: predicts tokens start+1 .. end
        logp = torch.log_softmax(logits, dim=-1)
        surprisal[start + 1 : end + 1] = -logp.gather(1, ids[start + 1 : end + 1, None])[:, 0].cpu()
    return Signals(spec.importance, surprisal, spec.speculate_s, spec.score_s, time.perf_counter() - t0)


def random_seed(seed: int, example_id: str) -> int:
    """Per-example seed: one random chunk ranking per (seed, example), shared by every keep rate."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{example_id}".encode()).digest()[:7], "big")


def importance_for(selector: str, n: int, signals: Signals | None, cfg: SelectConfig, seed: int) -> torch.Tensor:
    """[n] float32 importance that makes select_tokens implement `selector`."""
    if selector in USES_SPECULATOR:
        assert signals is not None, f"{selector} needs the speculator pass"
        return signals.importance if selector == "specprefill" else signals.surprisal
    if selector == "random":
        num_chunks = math.ceil(n / cfg.chunk)
        scores = torch.rand(num_chunks, generator=torch.Generator().manual_seed(seed))  # [num_chunks]
        return scores.repeat_interleave(cfg.chunk)[:n]
    if selector in ("recency", "sink-recency"):
        return torch.arange(n, dtype=torch.float32)
    raise ConfigError(f"unknown selector {selector!r}: use one of {', '.join(SELECTORS)}")


def config_for(selector: str, cfg: SelectConfig) -> SelectConfig:
    """Recency keeps the last tokens only: no sink tokens are forced."""
    return dataclasses.replace(cfg, keep_first=0) if selector == "recency" else cfg


def select(selector: str, n: int, signals: Signals | None, cfg: SelectConfig, keep: float, seed: int) -> torch.Tensor:
    """Kept indices [m] int64, ascending, for one prompt of n tokens (all of them when it is not pruned)."""
    cfg = config_for(selector, cfg)
    if not is_pruned(n, cfg, keep):
        return torch.arange(n)  # short prompt or keep 1.0: no speculator pass was needed
    return select_tokens(importance_for(selector, n, signals, cfg, seed), cfg, keep)
