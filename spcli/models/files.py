"""A model folder's files without its weights: tokenizer, config, end-of-sequence ids (read once per process)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from spcli.errors import ModelError


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: Path):
    """The folder's tokenizer, read once per process (~1 s each for Qwen's: spcli.models.resolved reads the base's
    and the speculator's to tell their tokenizers apart, the engines read them again). Shared: never mutated."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer from {path}: {e}") from e


def eos_token_ids(model: nn.Module, tokenizer) -> set[int]:
    """End-of-sequence ids from the generation config and the tokenizer (never hard-coded)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


@dataclass(frozen=True)
class BaseFiles:
    """What the base model's folder says without its weights."""

    path: Path
    tokenizer: object
    eos_ids: set[int]
    pad_id: int
    max_positions: int  # max_position_embeddings


def read_base(path: Path) -> BaseFiles:
    tokenizer = load_tokenizer(path)
    eos_ids = eos_ids_of(path, tokenizer)
    pad = tokenizer.pad_token_id
    return BaseFiles(path, tokenizer, eos_ids, int(pad if pad is not None else min(eos_ids, default=0)),
                     max_positions_of(read_config(path)))


def max_positions_of(config) -> int:
    """config.json's max_position_embeddings (unbounded where it has none)."""
    return int(getattr(config, "max_position_embeddings", None) or 1 << 30)


def read_config(path: Path):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read the model config in {path}: {e}") from e
    return getattr(config, "text_config", None) or config


def eos_ids_of(path: Path, tokenizer) -> set[int]:
    """End-of-sequence ids from the generation config, the model config and the tokenizer (never
    hard-coded); read from the folder, so no weights are needed."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        generation = None
    return eos_token_ids(SimpleNamespace(generation_config=generation, config=read_config(path)), tokenizer)


def read_model_config(path: Path) -> dict:
    c = json.loads((Path(path) / "config.json").read_text())
    return {**c.get("text_config", {}), **c}
