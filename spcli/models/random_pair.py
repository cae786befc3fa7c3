"""A random-weight base/speculator pair whose per-token cost ratio is Llama-3.1-8B : Llama-3.1-405B.

The paper's setting (8B speculating for 405B) cannot run here, but its cost structure can: the
base is a 405B-shaped Llama scaled down to CPU size (FFN/hidden 3.25, 8 query heads per KV head),
and the speculator's FFN width is solved so that its FLOPs per prompt token, attention included,
are the same fraction of the base's as 8B's are of 405B's at the same prompt length. Built from
configs with random weights (nothing downloaded) and cached under $SPCLI_CACHE/models/.

    flops_per_token(c, n) = layers * (2 * hidden * (2 * q_dim + 2 * kv_dim)   # q, k, v, o projections
                                      + 6 * hidden * ffn                      # gate, up, down
                                      + 2 * q_dim * (n + 1))                  # q.K^T and p.V, mean context (n+1)/2
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from spcli.models.folders import building, cache_root, convert_gguf, converted_smollm2, smollm2_gguf

BASE_NAME = "random-405b"  # `spcli bench --model random-405b` (its default speculator: random-8b)
SPECULATOR_NAME = "random-8b"
PAIR_LENGTH = 2048  # prompt length at which the FLOP ratio is matched


@dataclass(frozen=True)
class Shape:
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int = 128

    def flops_per_token(self, n: int) -> float:
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden * (2 * q_dim + 2 * kv_dim) + 6 * self.hidden * self.ffn + 2 * q_dim * (n + 1)
        return float(self.layers * per_layer)


# Published configs (config.json of meta-llama/Llama-3.1-8B-Instruct and -405B-Instruct).
LLAMA_8B = Shape(hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8)
LLAMA_405B = Shape(hidden=16384, ffn=53248, layers=126, heads=128, kv_heads=8)
BASE = Shape(hidden=1024, ffn=3328, layers=6, heads=16, kv_heads=2, head_dim=64)


def target_ratio(n: int = PAIR_LENGTH) -> float:
    return LLAMA_8B.flops_per_token(n) / LLAMA_405B.flops_per_token(n)


def speculator_shape(n: int = PAIR_LENGTH) -> Shape:
    """Two layers of hidden 192 (3 heads, 1 KV head); the FFN width (a multiple of 16) matches the ratio."""
    fixed = Shape(hidden=192, ffn=0, layers=2, heads=3, kv_heads=1, head_dim=64)
    budget = target_ratio(n) * BASE.flops_per_token(n) - fixed.flops_per_token(n)
    ffn = max(16, round(budget / (6 * fixed.hidden * fixed.layers) / 16) * 16)
    return Shape(**{**asdict(fixed), "ffn": ffn})


def pair_ratio(n: int) -> tuple[float, float]:
    """(FLOP ratio of this pair, FLOP ratio of 8B/405B) at prompt length n."""
    return speculator_shape().flops_per_token(n) / BASE.flops_per_token(n), target_ratio(n)


def _llama_config(shape: Shape, vocab_size: int, eos_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.ffn, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=32768, rope_theta=500000.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=eos_id, pad_token_id=eos_id,
    )


def _build(dest: Path, shape: Shape, tokenizer_dir: Path, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(shape, len(tokenizer), int(tokenizer.eos_token_id))).to(torch.bfloat16)
    with building(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def ensure_pair() -> dict[str, Path]:
    """{name: folder} of the two random models, built once (seconds) with the SmolLM2 tokenizer."""
    root = cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    spec = speculator_shape()
    folders = {BASE_NAME: (root / f"random-405b-shape-{BASE.hidden}x{BASE.layers}", BASE, 0),
               SPECULATOR_NAME: (root / f"random-8b-shape-{spec.hidden}x{spec.layers}-ffn{spec.ffn}", spec, 1)}
    tokenizer_dir = None
    for dest, shape, seed in folders.values():
        if not (dest / "config.json").is_file():
            tokenizer_dir = tokenizer_dir or convert_gguf(smollm2_gguf(), converted_smollm2())  # the embedded smollm2-135m
            _build(dest, shape, tokenizer_dir, seed)
    return {name: dest for name, (dest, _, _) in folders.items()}
