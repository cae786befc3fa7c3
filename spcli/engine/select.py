"""Selection: which prompt tokens the base model prefills (DESIGN.md steps 6-8).

Pure function of an importance vector; no model, no IO.
"""

from __future__ import annotations

import math

import torch

from spcli.config import SelectConfig


def budget(n: int, keep: float) -> int:
    """Number of tokens kept for a prompt of n tokens: ceil(keep * n), computed without float noise."""
    return min(n, math.ceil(round(keep * n, 9)))


def forced_mask(n: int, cfg: SelectConfig) -> torch.Tensor:
    """[n] bool: the first keep_first and last keep_last tokens, always kept."""
    mask = torch.zeros(n, dtype=torch.bool)
    mask[: cfg.keep_first] = True
    if cfg.keep_last > 0:
        mask[max(0, n - cfg.keep_last) :] = True
    return mask


def is_pruned(n: int, cfg: SelectConfig, keep: float | None = None) -> bool:
    """Whether a prompt of n tokens goes through the speculator at all."""
    keep = cfg.keep if keep is None else keep
    return keep < 1.0 and n >= cfg.min_tokens and budget(n, keep) < n


def select_tokens(importance: torch.Tensor, cfg: SelectConfig, keep: float | None = None) -> torch.Tensor:
    """Kept token indices, ascending int64 [m].

    importance: [n] float. Chunks of cfg.chunk tokens are ranked by mean importance (ties: the
    earlier chunk first). The forced tokens count towards the budget ceil(keep * n); the best
    chunks fill the rest; the last chunk taken is cut to its most important tokens so that
    exactly the budget is kept. If the forced tokens alone exceed the budget, only they are kept.
    """
    keep = cfg.keep if keep is None else keep
    n = importance.shape[0]
    if not is_pruned(n, cfg, keep):
        return torch.arange(n, dtype=torch.int64)
    kept = forced_mask(n, cfg)
    remaining = budget(n, keep) - int(kept.sum())
    if remaining <= 0:
        return kept.nonzero().flatten()

    scores = importance.float()
    num_chunks = math.ceil(n / cfg.chunk)
    padded = torch.zeros(num_chunks * cfg.chunk, dtype=torch.float32)
    padded[:n] = scores
    counts = torch.full((num_chunks,), float(cfg.chunk))
    counts[-1] = n - (num_chunks - 1) * cfg.chunk
    chunk_scores = padded.view(num_chunks, cfg.chunk).sum(dim=1) / counts  # [num_chunks]
    order = torch.sort(-chunk_scores, stable=True).indices

    for c in order.tolist():
        start, end = c * cfg.chunk, min(n, (c + 1) * cfg.chunk)
        new = (~kept[start:end]).nonzero().flatten() + start  # token indices this chunk adds
        if new.numel() == 0:
            continue
        if new.numel() > remaining:
            best = torch.sort(-scores[new], stable=True).indices[:remaining]
            new = new[best]
        kept[new] = True
        remaining -= new.numel()
        if remaining == 0:
            break
    return kept.nonzero().flatten()
