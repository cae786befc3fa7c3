"""Loading the base model and its speculator for the hf engine."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from spcli import models
from spcli.engine import capture
from spcli.errors import ConfigError, ModelError

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    model: nn.Module  # a *ForCausalLM in eval mode, attention "spcli"
    path: Path
    num_layers: int


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(path: Path, dtype: str, device: torch.device) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    impl = capture.register()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=TORCH_DTYPES[dtype], attn_implementation=impl, local_files_only=True
        )
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model from {path}: {e}") from e
    model.to(device).eval()
    return LoadedModel(model, path, model.config.num_hidden_layers)


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer from {path}: {e}") from e


def first_layers(base: nn.Module, num_layers: int) -> nn.Module:
    """A view of `base` that runs only its first `num_layers` decoder layers, then its final norm and LM head.

    Shares every parameter tensor with `base` (shallow module copies): no extra weight memory.
    """
    total = base.config.num_hidden_layers
    if num_layers in (0, total):
        return base
    if not 1 <= num_layers <= total:
        raise ConfigError(f"--speculator self:K needs 1 <= K <= {total} (the base model's layers), got {num_layers}")
    config = copy.copy(base.config)
    config.num_hidden_layers = num_layers
    inner = copy.copy(base.model)
    inner._modules = dict(base.model._modules)
    inner.layers = nn.ModuleList(list(base.model.layers)[:num_layers])
    inner.config = config
    view = copy.copy(base)
    view._modules = dict(base._modules)
    view.model = inner
    view.config = config
    return view


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


def check_same_vocabulary(base_tok, spec_tok, base_name: str, spec_name: str) -> None:
    """A speculator must tokenize exactly like the base: same vocabulary, same ids."""
    if base_tok.get_vocab() != spec_tok.get_vocab():
        raise ConfigError(
            f"speculator {spec_name!r} does not share the tokenizer of {base_name!r} "
            f"(vocabularies differ: {len(spec_tok)} vs {len(base_tok)} tokens); use a model of the same family or self:K"
        )


def parse_self(speculator: str) -> int | None:
    """'self:K' -> K; 'self' -> 0 (all layers: the base is its own speculator); anything else -> None."""
    if speculator == "self":
        return 0
    if not speculator.startswith("self:"):
        return None
    try:
        return int(speculator.split(":", 1)[1])
    except ValueError:
        raise ConfigError(f"--speculator self:K needs an integer K, got {speculator!r}") from None


def resolve_path(name: str) -> Path:
    return models.locate(name)
