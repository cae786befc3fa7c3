"""Which speculator configuration a model gets when flags leave it open.

Order, each filling only what the one before left unset: the flags (`--window`, `--lookahead`,
`--score-layers`, `--pool`, `--rows`, `--chunk`), a profile written by `spcli calibrate --write-profile` for
this model folder and speculator, the preset's `self_score` when the model speculates for itself,
and last the paper's recipe (look-ahead 8, every layer, pool 13, the mean over rows, chunk 32). A profile or preset that
leaves a field out gets the paper's value for it. Profiles live in $SPCLI_CACHE/profiles/, keyed by the model
folder's content (config and weight files' names and sizes), so a renamed copy finds its profile
and a changed model does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from spcli import models
from spcli.config import PAPER_CHUNK, PAPER_SCORE, ScoreConfig, SelectConfig, parse_layers
from spcli.engine.load import parse_self

SCORE_FIELDS = ("window", "lookahead", "score_layers", "pool", "rows")  # ScoreConfig's resolvable fields
SELECT_FIELDS = ("chunk",)  # SelectConfig's
FIELDS = SCORE_FIELDS + SELECT_FIELDS
PAPER = {**PAPER_SCORE, "chunk": PAPER_CHUNK}


def model_key(path: Path) -> str:
    """A short digest of a model folder's content: config.json and the weight files' names and sizes."""
    h = hashlib.sha256()
    config = path / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def profile_path(model_path: Path, speculator: str) -> Path:
    tag = hashlib.sha256(speculator.encode()).hexdigest()[:8]
    return models.cache_root() / "profiles" / f"{model_key(model_path)}-{tag}.json"


def read_profile(model_path: Path, speculator: str) -> dict | None:
    path = profile_path(model_path, speculator)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: doc["score"][k] for k in FIELDS if k in doc.get("score", {})}


def write_profile(model_path: Path, speculator: str, score: dict, evidence: dict) -> Path:
    path = profile_path(model_path, speculator)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model": str(model_path), "speculator": speculator,
                               "score": {k: score[k] for k in FIELDS if k in score}, "evidence": evidence}, indent=2))
    os.replace(tmp, path)
    return path


def score_defaults(model: str, model_path: Path | None, speculator: str) -> tuple[dict, str]:
    """(every field of FIELDS, where they come from) for a model and its resolved speculator."""
    if model_path is not None and (profile := read_profile(model_path, speculator)):
        return {**PAPER, **profile}, f"profile {profile_path(model_path, speculator)}"
    preset = models.PRESETS.get(model)
    if preset is not None and preset.self_score and _fits(preset.self_score, parse_self(speculator)):
        return {**PAPER, **preset.self_score}, f"preset {model}"
    return dict(PAPER), "the paper's recipe"


def _fits(score: dict, k: int | None) -> bool:
    """A preset's self_score applies to `self` and to a `self:K` that holds its scored layers."""
    if k is None:
        return False
    return k == 0 or all(layer < k for a, b in parse_layers(score["score_layers"]) or [] for layer in (a, b))


def _fill(cfg, fields: tuple[str, ...], defaults: dict):
    return dataclasses.replace(cfg, **{k: defaults[k] for k in fields if getattr(cfg, k) is None})


def resolve_score(score: ScoreConfig, model: str, model_path: Path | None, speculator: str) -> ScoreConfig:
    """`score` with every field the flags left unset (None) filled in."""
    if score.is_resolved:
        return score
    return _fill(score, SCORE_FIELDS, score_defaults(model, model_path, speculator)[0])


def resolve_select(select: SelectConfig, model: str, model_path: Path | None, speculator: str) -> SelectConfig:
    """`select` with the chunk filled in where the flags left it unset."""
    if select.chunk is not None:
        return select
    return _fill(select, SELECT_FIELDS, score_defaults(model, model_path, speculator)[0])


def resolve(cfg, model: str, model_path: Path | None, speculator: str):
    """A config dataclass with `score` and `select` fields (run, eval, bench, calibrate) with both resolved
    (the profile is read once for both)."""
    if cfg.score.is_resolved and cfg.select.chunk is not None:
        return cfg
    defaults, _ = score_defaults(model, model_path, speculator)
    return dataclasses.replace(cfg, score=_fill(cfg.score, SCORE_FIELDS, defaults),
                               select=_fill(cfg.select, SELECT_FIELDS, defaults))
