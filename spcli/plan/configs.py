"""config.json facts of the presets, for planning where their weights are not on this machine.

The values are those of the published Llama-3.1/3.2 config.json files (meta-llama/...); the parameter
counts they give (tests/test_plan.py) are the published ones: 8,030,261,248 (8B), 70,553,706,496 (70B),
405,853,388,800 (405B), 1,235,814,400 (1B). smollm2-135m's are its converted folder's config.json
(tests check them against it when it is here).
"""

from __future__ import annotations

from pathlib import Path

from spcli.errors import ModelError
from spcli.models import lookup
from spcli.plan.shapes import ModelShape

LLAMA3_VOCAB = 128256
LLAMA31_CONTEXT = 131072

SHIPPED_CONFIGS: dict[str, dict] = {
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192),
    "llama-1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, intermediate_size=8192, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=True,
                     max_position_embeddings=LLAMA31_CONTEXT),
    "llama-8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=14336, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=False,
                     max_position_embeddings=LLAMA31_CONTEXT),
    "llama-70b": dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, intermediate_size=28672, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=False,
                      max_position_embeddings=LLAMA31_CONTEXT),
    "llama-405b-fp8": dict(num_hidden_layers=126, hidden_size=16384, num_attention_heads=128, num_key_value_heads=8,
                           head_dim=128, intermediate_size=53248, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=False,
                           max_position_embeddings=LLAMA31_CONTEXT),
}
SHIPPED = "shipped config (no weights here)"


def local_folder(name: str) -> Path | None:
    """The model's folder on this machine, if it is already there; never converts, builds or downloads."""
    return lookup.local_folder(name)


def model_shape(name: str, dtype: str = "bfloat16") -> ModelShape:
    """A local folder's config.json and safetensors headers, else the shipped config of a preset."""
    if name in lookup.BENCH_PAIR:
        raise ModelError(f"{name} is `spcli bench`'s random-weight model: plan its folder once built, or a preset")
    folder = local_folder(name)
    if folder is not None:
        return ModelShape.from_folder(folder, name=name)
    if name in SHIPPED_CONFIGS:
        return ModelShape.from_config(name, SHIPPED_CONFIGS[name], SHIPPED, dtype=dtype)
    lookup.locate(name)  # raises the usual "unknown model" / "not on this machine" error
    raise AssertionError(f"{name} was located but has no folder")
