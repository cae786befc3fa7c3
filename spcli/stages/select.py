"""Selection: which prompt tokens the base model prefills (DESIGN.md steps 7-9).

Pure function of an importance vector; no model, no IO.
"""

from __future__ import annotations

import math

import torch

from spcli.config.scoring import AUTO, SelectConfig, parse_unit_score


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


def target(n: int, cfg: SelectConfig, keep: float | str, num_forced: int, wanted: int | None = None) -> int:
    """Tokens kept for a prompt of n tokens, protected text aside: the budget `wanted` (default ceil(keep x n)),
    but at least the forced tokens plus cfg.min_free chosen ones (a short prompt keeps more than its keep rate),
    at most n."""
    wanted = budget(n, keep) if wanted is None else wanted
    return min(n, max(wanted, num_forced + cfg.min_free))


def num_forced(n: int, cfg: SelectConfig) -> int:
    return min(n, cfg.keep_first + cfg.keep_last)


def is_pruned(n: int, cfg: SelectConfig, keep: float | str | None = None) -> bool:
    """Whether a prompt of n tokens goes through the speculator at all: at least min_tokens long, and its target
    (at keep = auto: with keep_min) below n."""
    keep = cfg.keep if keep is None else keep
    if n < cfg.min_tokens or (keep != AUTO and keep >= 1.0):
        return False
    return target(n, cfg, cfg.keep_min if keep == AUTO else keep, num_forced(n, cfg)) < n


def is_kept_whole(n: int, num_kept: int, cfg: SelectConfig, keep: float | str | None = None) -> bool:
    """Whether a prompt of n tokens that kept num_kept was prefilled whole although selection would prune it: pruning
    it (or its document group) would not have paid (spcli.stages.pays, spcli.stages.share); never at
    --max-prune-cost inf. The run's end counts these rows (job/batch.py), `spcli inspect --id` says why (inspect/tokens.py)."""
    return num_kept == n and is_pruned(n, cfg, keep) and not math.isinf(cfg.max_prune_cost)


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
    assert cfg.chunk is not None, "resolve the selection chunk first (spcli.models.profiles.resolve)"
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
                  forced: torch.Tensor | None = None, unpooled: torch.Tensor | None = None,
                  units: torch.Tensor | None = None, protected: torch.Tensor | None = None) -> torch.Tensor:
    """Kept token indices, ascending int64 [m].

    importance: [n] float. The forced tokens (first/last, `forced` [n] bool: tokens a speculator of another
    tokenizer has no score for) count towards the target: ceil(keep * n) (at keep = auto: `auto_budget`, which
    reads `unpooled`, the importance before pooling), but at least the forced ones plus cfg.min_free (`target`).
    `protected` ([n] bool, text a record marks as never dropped) is kept on top of it. The rest is filled
    with whole units (`units`: [n] unit ids, spcli.stages.units; `fill_units`), or with fixed chunks of cfg.chunk
    tokens at unit = chunk or without units (`fill_chunks`: exactly the target). If the forced tokens alone reach
    the target, only they are kept.
    """
    assert cfg.chunk is not None, "resolve the selection chunk first (spcli.models.profiles.resolve)"
    keep = cfg.keep if keep is None else keep
    n = importance.shape[0]
    if not is_pruned(n, cfg, keep):
        return torch.arange(n, dtype=torch.int64)
    kept = forced_mask(n, cfg, forced)
    if keep == AUTO:
        assert unpooled is not None and unpooled.shape == importance.shape, "keep auto's budget reads the unpooled importance"
    wanted = auto_budget(unpooled, cfg, forced) if keep == AUTO else None
    remaining = target(n, cfg, keep, int(kept.sum()), wanted) - int(kept.sum())
    if protected is not None:
        kept |= protected
    if remaining > 0 and units is not None and cfg.unit != "chunk":
        fill_units(kept, importance.float(), units, cfg.unit_score, remaining)
    elif remaining > 0:
        fill_chunks(kept, importance.float(), cfg.chunk, remaining)
    return kept.nonzero().flatten()


def fill_chunks(kept: torch.Tensor, scores: torch.Tensor, chunk: int, remaining: int) -> None:
    """Mark `remaining` more tokens of `kept` ([n] bool, in place): chunks of `chunk` tokens by mean importance
    (ties: the earlier chunk first); the last chunk taken is cut to its most important tokens."""
    n = scores.shape[0]
    order = torch.sort(-chunk_scores(scores, chunk), stable=True).indices
    for c in order.tolist():
        start, end = c * chunk, min(n, (c + 1) * chunk)
        new = (~kept[start:end]).nonzero().flatten() + start  # token indices this chunk adds
        if new.numel() == 0:
            continue
        if new.numel() > remaining:
            new = new[torch.sort(-scores[new], stable=True).indices[:remaining]]
        kept[new] = True
        remaining -= new.numel()
        if remaining == 0:
            break


def unit_scores(scores: torch.Tensor, units: torch.Tensor, is_free: torch.Tensor, reduction: str) -> torch.Tensor:
    """[num_units] float32: each unit's score over its free tokens (-inf for a unit with none). reduction: mean,
    max, or topK (the mean of its K best tokens)."""
    kind, k = parse_unit_score(reduction)
    num_units = int(units[-1]) + 1
    free_units, free_scores = units[is_free], scores[is_free]  # [f]
    out = torch.full((num_units,), float("-inf"))
    if free_units.numel() == 0:
        return out
    if kind == "max":
        return out.scatter_reduce(0, free_units, free_scores, "amax", include_self=True)
    if kind == "top":  # rank each free token within its unit, best first; keep the k best
        order = torch.sort(-free_scores, stable=True).indices
        order = order[torch.sort(free_units[order], stable=True).indices]  # by unit, best first within it
        sorted_units = free_units[order]
        first = torch.searchsorted(sorted_units, sorted_units, right=False)  # [f] index of the unit's first entry
        is_top = (torch.arange(order.numel()) - first) < k
        free_units, free_scores = sorted_units[is_top], free_scores[order][is_top]
    total = torch.zeros(num_units).scatter_add(0, free_units, free_scores)
    count = torch.zeros(num_units).scatter_add(0, free_units, torch.ones_like(free_scores))
    return torch.where(count > 0, total / count.clamp(min=1.0), out)


def fill_units(kept: torch.Tensor, scores: torch.Tensor, units: torch.Tensor, reduction: str, remaining: int) -> None:
    """Mark about `remaining` more tokens of `kept` ([n] bool, in place) with whole units, best score first (ties:
    the earlier unit). A unit that fits is taken; one that does not is taken if at least half of it fits (and
    the fill ends there), else passed over for smaller ones. So the count lands within half a unit of the
    target (units hold at most max_unit tokens, or a word-aligned piece of about chunk)."""
    is_free = ~kept
    size = torch.zeros(int(units[-1]) + 1, dtype=torch.int64).scatter_add(0, units, is_free.long())  # [num_units]
    order = torch.sort(-unit_scores(scores, units, is_free, reduction), stable=True).indices
    chosen = torch.zeros_like(size, dtype=torch.bool)
    for u, s in zip(order.tolist(), size[order].tolist()):
        if s == 0:
            continue
        if s <= remaining or 2 * remaining >= s:
            chosen[u] = True
            remaining -= s
        if remaining <= 0:
            break
    kept |= chosen[units]


def is_over_budget(n: int, cfg: SelectConfig, keep: float | str | None = None) -> bool:
    """The forced first/last tokens alone exceed the budget (ceil(keep * n); at keep = auto, its most:
    ceil(keep_max * n)) and no floor (min_free 0) adds chosen ones: only they are kept, so nothing is selected.
    With a floor a short prompt keeps more than its rate, by the rule `target` states."""
    keep = cfg.keep if keep is None else keep
    if not is_pruned(n, cfg, keep) or cfg.min_free > 0:
        return False
    return num_forced(n, cfg) > budget(n, cfg.keep_max if keep == AUTO else keep)
