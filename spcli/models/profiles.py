"""Which speculator configuration a model gets when flags leave it open.

Order, each filling only what the one before left unset: the flags (`--window`, `--lookahead`,
`--score-layers`, `--pool`, `--rows`, `--chunk`), a profile written by `spcli calibrate --write-profile`
for this model folder and speculator, the preset's `self_score` when the model speculates for itself (or
its `speculator_scores` entry for a separate speculator it was measured with), and last a fallback: for `self` / `self:K`,
early exit at the middle layer (within the K) with window 32 and no look-ahead (a truncated model
decodes poor look-ahead tokens; DESIGN.md step 6), for a separate speculator the paper's recipe
(look-ahead 8, every layer, pool 13, the mean over rows, chunk 32). A profile or preset that leaves a
field out gets the paper's value for it. Profiles live in $SPCLI_CACHE/profiles/, keyed by the model
folder's content (config and weight files' names and sizes), so a renamed copy finds its profile
and a changed model does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE, ScoreConfig, SelectConfig, parse_layers
from spcli.models import lookup
from spcli.models.files import read_config
from spcli.models.folders import cache_root
from spcli.models.speculator import parse_self

SCORE_FIELDS = ("window", "lookahead", "score_layers", "pool", "rows")  # ScoreConfig's resolvable fields
SELECT_FIELDS = ("chunk",)  # SelectConfig's
FIELDS = SCORE_FIELDS + SELECT_FIELDS
PAPER = {**PAPER_SCORE, "chunk": PAPER_CHUNK}


model_key = lookup.model_key  # a profile's key: the model folder's content, so a renamed copy finds it


def speculator_identity(speculator: str) -> str:
    """What a profile and a preset's speculator_scores know a speculator by: a preset's name (also for a folder
    holding a preset's model), a folder's content (`model_key`), or the name as given (self:K, an HF id)."""
    if (preset := lookup.recognise(speculator)) is not None:
        return preset
    path = Path(speculator).expanduser()
    return f"folder:{model_key(path)}" if (path / "config.json").is_file() else speculator


def profile_path(model_path: Path, speculator: str) -> Path:
    tag = hashlib.sha256(speculator_identity(speculator).encode()).hexdigest()[:8]
    return cache_root() / "profiles" / f"{model_key(model_path)}-{tag}.json"


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


def describe(settings: dict) -> str:
    """Scoring settings (score fields and the chunk) as `spcli models` and `spcli bench` print them."""
    d = settings
    return (f"layers {d['score_layers']}, window {d['window']}, look-ahead {d['lookahead']}, pool {d['pool']}, "
            f"rows {d['rows']}, chunk {d['chunk']}")


FALLBACK_WINDOW = 32
FALLBACK = "fallback"  # how a fallback's source begins (the banner then suggests `spcli calibrate`)


def score_defaults(model: str, model_path: Path | None, speculator: str) -> tuple[dict, str]:
    """(every field of FIELDS, where they come from) for a model and its resolved speculator."""
    if model_path is not None and (profile := read_profile(model_path, speculator)):
        return {**PAPER, **profile}, f"profile {profile_path(model_path, speculator)}"
    name = lookup.recognise(model if model_path is None or model in lookup.PRESETS else str(model_path))
    preset = lookup.PRESETS.get(name)
    label = f"preset {name}" + ("" if name == model else f" (recognised: {model_path} holds its config and weights)")
    k = parse_self(speculator)
    if preset is not None and preset.self_score and _fits(preset.self_score, k):
        return {**PAPER, **preset.self_score}, label
    if preset is not None and (spec := speculator_identity(speculator)) in (preset.speculator_scores or {}):
        return {**PAPER, **preset.speculator_scores[spec]}, label
    if k is not None and model_path is not None:
        layer = middle_layer(model_path, k)
        return ({**PAPER, "window": FALLBACK_WINDOW, "lookahead": 0, "score_layers": str(layer)},
                f"{FALLBACK}: early exit at the middle layer")
    return dict(PAPER), f"{FALLBACK}: the paper's recipe"


def middle_layer(model_path: Path, k: int) -> int:
    """The fallback's one scored layer for self (k 0) or self:K: the middle of the base's layers, within
    the first K; the speculator runs up to it and stops (early exit)."""
    num_layers = int(read_config(model_path).num_hidden_layers)
    return (num_layers - 1) // 2 if k == 0 else min((num_layers - 1) // 2, k - 1)


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


def resolve_with_source(cfg, model: str, model_path: Path | None, speculator: str):
    """(resolve(cfg, ...), settings_source of the result), from one read of the defaults (spcli.models.resolved)."""
    defaults, source = score_defaults(model, model_path, speculator)
    cfg = dataclasses.replace(cfg, score=_fill(cfg.score, SCORE_FIELDS, defaults),
                              select=_fill(cfg.select, SELECT_FIELDS, defaults))
    return cfg, _source(cfg.score, cfg.select, defaults, source, model, speculator)


def settings_source(score: ScoreConfig, select: SelectConfig, model: str, model_path: Path | None, speculator: str) -> str:
    """Where resolved scoring settings came from, for the banner: flags, a profile, a preset or a fallback (which
    suggests `spcli calibrate`). A field that differs from the defaults was set by a flag."""
    return _source(score, select, *score_defaults(model, model_path, speculator), model, speculator)


def _source(score: ScoreConfig, select: SelectConfig, defaults: dict, source: str, model: str, speculator: str) -> str:
    given = {**{k: getattr(score, k) for k in SCORE_FIELDS}, "chunk": select.chunk}
    flagged = [k for k in FIELDS if given[k] != defaults[k]]
    if len(flagged) == len(FIELDS):
        return "flags"
    flags = f"flags ({', '.join(flagged)}), the rest from " if flagged else ""
    hint = (f"; `spcli calibrate --model {model} --speculator {speculator}` measures them for this model"
            if source.startswith(FALLBACK) else "")
    return flags + source + hint
