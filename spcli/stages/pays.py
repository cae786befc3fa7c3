"""Whether pruning a prompt pays: its speculator pass plus the prefill of what it keeps, against a full prefill.

Both sides in FLOPs (spcli.plan.flops), for a prompt of n tokens keeping m (its selection target plus its
protected text):

    cost(n, m) = (F_s(n) + F_base(m)) / F_base(n)

A prompt whose cost is at least --max-prune-cost (SelectConfig.max_prune_cost, 0.9) is prefilled whole, as at keep 1.0: at keep 0.3 on a short prompt
with a speculator that runs half the base's layers (SmolLM2-135M's `self`, layer 14 of 30) the pruned prompt
would cost about as much as the whole one, and the run then pays the speculator for nothing (issue 38). The
rows say so: their num_kept_tokens equals num_prompt_tokens and the run's end names how many (batch.py).

FLOPs understate what the speculator costs on a CPU (transformers runs it, at about half vLLM's speed per
FLOP, docs/results/job), hence the margin below 1. keep auto's budget is known only after scoring: it prunes.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from spcli.config.scoring import AUTO, ScoreConfig, SelectConfig
from spcli.models.speculator import parse_self
from spcli.plan.flops import prefill_flops, speculator_flops
from spcli.plan.shapes import ModelShape


def _shape(folder: Path) -> ModelShape | None:
    config = Path(folder) / "config.json"
    if not config.is_file():  # a GGUF file or a hub id: no config here to count with
        return None
    return ModelShape.from_config(Path(folder).name, json.loads(config.read_text()), str(config))


@functools.lru_cache(maxsize=8)
def shapes(base_path: Path, speculator: str, speculator_path: Path | None) -> tuple[ModelShape, ModelShape] | None:
    """(base, speculator) shapes, or None where either has no config.json to count with."""
    base = _shape(base_path)
    if base is None:
        return None
    k = parse_self(speculator)
    if k is not None:
        return base, base if not k else base.first_layers(min(k, base.num_layers))
    spec = _shape(speculator_path) if speculator_path is not None else None
    return None if spec is None else (base, spec)


def cost(base: ModelShape, spec: ModelShape, score: ScoreConfig, n: int, m: int, n_spec: int | None = None) -> float:
    """cost(n, m) of the module docstring; n_spec: the speculator's own prompt length (its tokenizer, restated
    instruction), default n."""
    return (speculator_flops(spec, n_spec or n, score) + prefill_flops(base, m)) / prefill_flops(base, n)


def pays(pair: tuple[ModelShape, ModelShape] | None, score: ScoreConfig, select: SelectConfig, keep, n: int,
         num_protected: int, n_spec: int | None = None) -> bool:
    """Whether a prompt of n tokens (num_protected of them protected, outside the budget) is worth pruning at
    `keep` (the selection target: select.target)."""
    from spcli.stages.select import num_forced, target

    if pair is None or keep == AUTO or math.isinf(select.max_prune_cost):
        return True
    m = min(n, target(n, select, keep, num_forced(n, select)) + num_protected)
    return cost(*pair, score, n, m, n_spec) < select.max_prune_cost
