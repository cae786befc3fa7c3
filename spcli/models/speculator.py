"""The speculator's identity: `self`/`self:K` (the base's own first layers) or a model of the same or another tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spcli.errors import ConfigError
from spcli.models import lookup
from spcli.models.files import eos_ids_of, load_tokenizer, max_positions_of, read_config
from spcli.models.positions import check_full_attention


def same_vocabulary(base_tok, spec_tok) -> bool:
    """Whether a speculator tokenizes exactly like the base (same vocabulary, same ids): the switch between
    the exact index path and cross-tokenizer scoring (spcli.stages.align)."""
    return base_tok.get_vocab() == spec_tok.get_vocab()


SAME_TOKENIZER = "same tokenizer"


CROSS_TOKENIZER = "cross-tokenizer (character spans)"


@dataclass
class SpeculatorTokens:
    """A speculator with its own tokenizer: what reading a prompt in its tokens needs."""

    tokenizer: object  # a fast tokenizer (offset mappings)
    eos_ids: set[int]  # where its look-ahead stops
    max_positions: int  # its max_position_embeddings


def speculator_tokens(base_tokenizer, speculator: str, path: Path | None = None) -> SpeculatorTokens | None:
    """The speculator's own tokens where its vocabulary differs from the base's; None where it reads the
    base's ids (self, self:K, or the same vocabulary). `path`: its folder where already located."""
    if parse_self(speculator) is not None:
        return None
    path = path or lookup.locate(speculator)
    tokenizer = load_tokenizer(path)
    if same_vocabulary(base_tokenizer, tokenizer):
        return None
    if not getattr(tokenizer, "is_fast", False) or not getattr(base_tokenizer, "is_fast", False):
        raise ConfigError(
            f"speculator {speculator!r} has another tokenizer than the base; scoring across tokenizers needs fast "
            "tokenizers (tokenizer.json, for character offsets) on both sides; use a speculator of the same "
            "tokenizer or self:K"
        )
    return SpeculatorTokens(tokenizer, eos_ids_of(path, tokenizer),
                            max_positions_of(read_config(path)))


def scoring_path(base_path: Path, speculator: str, speculator_path: Path | None = None) -> str:
    """Which path scores the base's tokens: SAME_TOKENIZER or CROSS_TOKENIZER (reads tokenizers only)."""
    tokens = speculator_tokens(load_tokenizer(base_path), speculator, speculator_path)
    return SAME_TOKENIZER if tokens is None else CROSS_TOKENIZER


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


def check_speculator_attention(base_path: Path, base_name: str, speculator: str, max_prompt_tokens: int,
                               speculator_path: Path | None = None) -> None:
    """check_full_attention on the speculator's config: the base's own for self/self:K. `speculator_path`: a
    separate speculator's folder where already located."""
    if parse_self(speculator) is not None:
        check_full_attention(read_config(base_path), max_prompt_tokens, base_name, "the base (as --speculator self:K)")
    else:
        path = speculator_path or lookup.locate(speculator)
        check_full_attention(read_config(path), max_prompt_tokens, speculator, "speculator")


def self_layers(speculator: str, score, num_layers: int) -> int:
    """How many of the base's first layers a `self`/`self:K` speculator with early exit reads (score: ScoreConfig)."""
    k = parse_self(speculator) or num_layers
    return score.layers(k)[-1] + 1
