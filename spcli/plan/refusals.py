"""The `--engine vllm` speculator refusals known from names and configs alone, in one function that
`spcli plan` and `VllmEngine` both call (the engine before vLLM starts, so nothing is loaded first).

vLLM holds the base's weights in its own format; a `self`/`self:K` speculator reads the base's first
layers from the checkpoint into transformers, which needs (1) no look-ahead: decoding runs every layer,
a second copy of the model beside vLLM's; (2) layers transformers can run: not an FP8 or otherwise
quantized checkpoint; (3) 1 <= K <= the base's layers.
"""

from __future__ import annotations

from spcli.config.scoring import ScoreConfig
from spcli.errors import ConfigError
from spcli.models import lookup
from spcli.models.speculator import parse_self


def base_quantization(model: str, stored: str | None) -> str | None:
    """How the base's layers are stored: the checkpoint's own `quantization_config` method (`stored`), else the
    preset's (llama-405b-fp8: fp8); None where they are plain."""
    preset = lookup.PRESETS.get(model)
    return stored or (preset.quantization if preset else None)


def stored_quantization(config: dict) -> str | None:
    """config.json's `quantization_config` method, "quantized" where it names none; None without one."""
    q = config.get("quantization_config")
    return None if q is None else str((q or {}).get("quant_method") or "quantized")


def refuse_speculator(speculator: str, model: str, score: ScoreConfig, quantization: str | None,
                      num_layers: int) -> None:
    """Raise ConfigError where `--engine vllm` cannot run `speculator` beside `model` (call only where prompts are
    pruned: at keep 1.0 none runs). `score` resolved; `quantization` from base_quantization; `num_layers` the base's."""
    k = parse_self(speculator)
    if k is None:
        return
    if score.lookahead:
        raise ConfigError(
            f"--engine vllm cannot use --speculator {speculator} with look-ahead: decoding look-ahead tokens needs "
            f"all of {model!r}'s layers in transformers, a second copy of the weights beside vLLM's. Use early exit "
            "(--lookahead 0 with --window and --score-layers: only the layers up to the last scored one are read), "
            "a separate speculator of the same tokenizer, --speculator NAME|FOLDER (e.g. llama-8b for "
            "llama-405b-fp8), or --engine hf"
        )
    if quantization:
        raise ConfigError(
            f"--engine vllm cannot use --speculator {speculator} on {model!r}, a {quantization} base: transformers "
            "cannot run its quantized layers, which that speculator reads from the checkpoint; pass a separate "
            "speculator of the same tokenizer (--speculator NAME|FOLDER, e.g. llama-8b for llama-405b-fp8) or --keep 1.0"
        )
    if not 0 <= k <= num_layers:
        raise ConfigError(f"--speculator self:K needs 1 <= K <= {num_layers} (the base model's layers), got {k}")
