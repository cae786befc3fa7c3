"""Selection: which prompt tokens the base model prefills (DESIGN.md steps 7-9).

Pure function of an importance vector; no model, no IO.
"""

from __future__ import annotations

import math

import torch

from spcli.config import AUTO, SelectConfig


def budget(n: int, keep: float) -> int:
    """Number of tokens kept for a prompt of n tokens: ceil(keep * n), computed without float noise."""
    return min(n, math.ceil(round(keep * n, 9)))


def forced_mask(n: int, cfg: SelectConfig, forced: torch.Tensor | None = None) -> torch.Tensor:
    """[n] bool: the first keep_first and last keep_last tokens, and `forced` ([n] bool: tokens the
    speculator has no score for, cross-tokenizer), always kept."""
    mask = torch.zeros(n, dtype=torch.bool) if forced is None else forced.clone()
    mask[: cfg.keep_first] = True
    if cfg.keep_last > 0:
        mask[max(0, n - cfg.keep_last) :] = True
    return mask


def is_pruned(n: int, cfg: SelectConfig, keep: float | str | None = None) -> bool:
    """Whether a prompt of n tokens goes through the speculator at all (keep = auto: whenever keep_min
    could drop a token)."""
    keep = cfg.keep if keep is None else keep
    if n < cfg.min_tokens:
        return False
    if keep == AUTO:
        return budget(n, cfg.keep_min) < n
    return keep < 1.0 and budget(n, keep) < n


def chunk_scores(importance: torch.Tensor, chunk: int) -> torch.Tensor:
    """[num_chunks] float32: each chunk's mean importance (the last chunk may be shorter)."""
    n = importance.shape[0]
    num_chunks = math.ceil(n / chunk)
    padded = torch.zeros(num_chunks * chunk, dtype=torch.float32)
    padded[:n] = importance.float()
    counts = torch.full((num_chunks,), float(chunk))
    counts[-1] = n - (num_chunks - 1) * chunk
    return padded.view(num_chunks, chunk).sum(dim=1) / counts


def chunk_masses(importance: torch.Tensor, cfg: SelectConfig, forced: torch.Tensor,
                 sharpen: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per chunk of cfg.chunk tokens, over the tokens that are not `forced` ([n] bool), float64 [num_chunks]:
    the mean score s_c (0 for a chunk with no free token), the number of free tokens, and the mass
    (`auto_budget`: with `sharpen` size_c * max(0, s_c - median s_c over chunks with a free token), else the sum)."""
    assert cfg.chunk is not None, "resolve the selection chunk first (spcli.profiles.resolve)"
    n = importance.shape[0]
    free = (~forced).double()  # [n]
    scores = importance.double().clamp(min=0.0) * free
    num_chunks = math.ceil(n / cfg.chunk)
    pad = num_chunks * cfg.chunk - n
    summed = torch.nn.functional.pad(scores, (0, pad)).view(num_chunks, cfg.chunk).sum(dim=1)  # [num_chunks]
    sizes = torch.nn.functional.pad(free, (0, pad)).view(num_chunks, cfg.chunk).sum(dim=1)  # free tokens per chunk
    is_free = sizes > 0
    mean = torch.where(is_free, summed / sizes.clamp(min=1.0), torch.zeros_like(summed))
    if not sharpen or not bool(is_free.any()):
        return mean, sizes, summed
    return mean, sizes, (mean - float(mean[is_free].median())).clamp(min=0.0) * sizes


def clamp_budget(n: int, cfg: SelectConfig, wanted: int) -> int:
    """keep = auto: a wanted number of tokens within [ceil(keep_min * n), ceil(keep_max * n)]."""
    return max(budget(n, cfg.keep_min), min(budget(n, cfg.keep_max), wanted))


def auto_budget(importance: torch.Tensor, cfg: SelectConfig, forced: torch.Tensor | None = None) -> int:
    """keep = auto: the tokens kept for this prompt (DESIGN.md step 8; the criterion of issue 20).

    `importance`: [n], unpooled (pool 1: pooling smears a needle's peak over its neighbours, and every prompt
    then looks diffuse). Over the tokens that are not forced, chunk c has a mean score s_c and a mass
    m_c = size_c * max(0, s_c - median_c s_c): what stands out of the prompt's own background. With p_c = m_c / sum m,
    the effective number of chunks that stand out is exp(-sum p_c log p_c): about 1 when one chunk holds the mass
    (one needle), many when it is spread (several facts, a text to summarise). The budget is the forced tokens
    plus keep_scale x that number of chunks' tokens, clamped to [ceil(keep_min * n), ceil(keep_max * n)]. No mass
    at all (flat or zero scores) gives the maximum.
    """
    n = importance.shape[0]
    forced = forced_mask(n, cfg, forced)
    _, sizes, mass = chunk_masses(importance, cfg, forced)
    total = float(mass.sum())
    if not bool((sizes > 0).any()) or total <= 0.0:
        return budget(n, cfg.keep_max)
    p = mass[mass > 0] / total
    num_effective = math.exp(-float((p * p.log()).sum()))  # the perplexity of the standout mass, in chunks
    return clamp_budget(n, cfg, int(forced.sum()) + math.ceil(round(cfg.keep_scale * num_effective * cfg.chunk, 9)))


def select_tokens(importance: torch.Tensor, cfg: SelectConfig, keep: float | str | None = None,
                  forced: torch.Tensor | None = None, unpooled: torch.Tensor | None = None) -> torch.Tensor:
    """Kept token indices, ascending int64 [m].

    importance: [n] float. Chunks of cfg.chunk tokens are ranked by mean importance (ties: the
    earlier chunk first). The forced tokens count towards the budget: ceil(keep * n), or
    `auto_budget` at keep = auto; the best chunks fill the rest; the last chunk taken is cut to its
    most important tokens so that exactly the budget is kept. If the forced tokens alone exceed the
    budget, only they are kept. `forced`: [n] bool, more tokens to force (see forced_mask). `unpooled`: [n],
    the importance before pooling, which keep = auto's budget reads (needed there).
    """
    assert cfg.chunk is not None, "resolve the selection chunk first (spcli.profiles.resolve)"
    keep = cfg.keep if keep is None else keep
    n = importance.shape[0]
    if not is_pruned(n, cfg, keep):
        return torch.arange(n, dtype=torch.int64)
    kept = forced_mask(n, cfg, forced)
    if keep == AUTO:
        assert unpooled is not None and unpooled.shape == importance.shape, "keep auto's budget reads the unpooled importance"
    num_budget = auto_budget(unpooled, cfg, forced) if keep == AUTO else budget(n, keep)
    remaining = num_budget - int(kept.sum())
    if remaining <= 0:
        return kept.nonzero().flatten()

    scores = importance.float()
    order = torch.sort(-chunk_scores(scores, cfg.chunk), stable=True).indices

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


def is_over_budget(n: int, cfg: SelectConfig, keep: float | str | None = None) -> bool:
    """The forced first/last tokens alone exceed the budget (ceil(keep * n); at keep = auto, its most:
    ceil(keep_max * n)), so only they are kept and the rate asked for cannot be met."""
    keep = cfg.keep if keep is None else keep
    if not is_pruned(n, cfg, keep):
        return False
    num_forced = min(n, cfg.keep_first + cfg.keep_last)
    return num_forced > budget(n, cfg.keep_max if keep == AUTO else keep)
