"""Fidelity against full prefill, task scores against references, and bootstrap confidence intervals.

Fidelity needs no labels: it compares a pruned run with the full-prefill run of the same prompt.
Task scores follow SQuAD-style normalisation (lower case, no punctuation or articles).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
import torch

_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def first_token_agrees(ref: list[int], got: list[int]) -> float:
    """1.0 when the first generated token is the same (both stopping at once counts as the same)."""
    return float(ref[:1] == got[:1])


def prefix_matches(ref: list[int], got: list[int], num_tokens: int = 16) -> float:
    """1.0 when the first `num_tokens` greedy tokens are identical (a shorter output must match exactly)."""
    return float(ref[:num_tokens] == got[:num_tokens])


def kl_divergence(ref_logprobs: torch.Tensor, logprobs: torch.Tensor) -> float:
    """KL(full || pruned) of the first decode step, in nats. Inputs: [V] log-softmax, float."""
    p = ref_logprobs.double()
    q = logprobs.double()
    return max(0.0, float((p.exp() * (p - q)).sum()))


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """|A & B| / |A | B| of two kept-index sets."""
    sa, sb = set(a.tolist()), set(b.tolist())
    union = len(sa | sb)
    return len(sa & sb) / union if union else 1.0


def covered(kept: torch.Tensor, spans: list[tuple[int, int]]) -> float | None:
    """Fraction of the token positions in `spans` ([start, end) pairs) that were kept; None without spans."""
    wanted = [i for s, e in spans for i in range(s, e)]
    if not wanted:
        return None
    kept_set = set(kept.tolist())
    return sum(i in kept_set for i in wanted) / len(wanted)


def whole_facts(kept: torch.Tensor, spans: list[tuple[int, int]]) -> float | None:
    """Fraction of the spans ([start, end) pairs, one per fact sentence) kept whole, every token; None without spans.
    An answer needs its fact entire: a number missing one token is a wrong number (docs/results.md, "Which layer, window, pool and chunk")."""
    if not spans:
        return None
    kept_set = set(kept.tolist())
    return sum(all(i in kept_set for i in range(s, e)) for s, e in spans) / len(spans)


FACT_MEASURES = {"facts": whole_facts, "tokens": covered}  # `spcli calibrate --metric`


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def contains(output: str, answers: tuple[str, ...], require_all: bool) -> float:
    """require_all: the fraction of answers found in the output; else 1.0 when any is found."""
    out = f" {normalize(output)} "
    found = [f" {normalize(a)} " in out for a in answers]
    return sum(found) / len(found) if require_all else float(any(found))


def exact_match(output: str, answers: tuple[str, ...], require_all: bool) -> float:
    targets = [" ".join(answers)] if require_all else list(answers)
    return float(any(normalize(output) == normalize(a) for a in targets))


def token_f1(output: str, answers: tuple[str, ...], require_all: bool) -> float:
    """SQuAD token F1: best over alternative answers, or against all answers together when all are required."""
    targets = [" ".join(answers)] if require_all else list(answers)
    got = normalize(output).split()
    best = 0.0
    for a in targets:
        want = normalize(a).split()
        common = sum((Counter(got) & Counter(want)).values())
        if common:
            precision, recall = common / len(got), common / len(want)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float  # 2.5th percentile of the bootstrap distribution
    hi: float  # 97.5th percentile
    n: int

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "-"
        return f"{self.mean:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


NAN = float("nan")


def bootstrap(values, num_resamples: int = 2000, seed: int = 0) -> Interval:
    """Mean with a 95% percentile-bootstrap interval; None values are left out of n."""
    x = np.array([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return Interval(NAN, NAN, NAN, 0)
    means = x[np.random.default_rng(seed).integers(0, x.size, size=(num_resamples, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Interval(float(x.mean()), float(lo), float(hi), int(x.size))


def bootstrap_ratio(numerator, denominator, num_resamples: int = 2000, seed: int = 0) -> Interval:
    """sum(numerator) / sum(denominator) over paired samples (e.g. a speedup), with a paired 95% interval."""
    pairs = [(a, b) for a, b in zip(numerator, denominator) if a is not None and b is not None]
    if not pairs:
        return Interval(NAN, NAN, NAN, 0)
    a, b = (np.array(v, dtype=np.float64) for v in zip(*pairs))
    idx = np.random.default_rng(seed).integers(0, a.size, size=(num_resamples, a.size))
    ratios = a[idx].sum(axis=1) / b[idx].sum(axis=1)
    point = float(a.sum() / b.sum())
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return Interval(point, float(lo), float(hi), int(a.size))
