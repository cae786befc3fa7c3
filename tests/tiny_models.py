"""Tiny random-weight Llama models built from a config (nothing is downloaded), for tests to import
(`from tiny_models import build_tiny`: a module of its own, since tests/ and tests/slurm/ each have a
conftest). Real sizes of SmolLM2-135M for reference: hidden 576, 30 layers, 9 heads, 3 KV heads, head
dim 64, vocab 49152.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Tiny models cost next to nothing per layer, and their LM head more than their layers: spcli.stages.pays finds that
# pruning them never pays and prefills their prompts whole. Runs that test the pruning mechanics prune anyway.
ALWAYS_PRUNE = ("--max-prune-cost", "inf")

TINY = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)


def build_tiny(dest: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    return dest
