"""The speculator's GPU share and the base's per-GPU memory (spcli/plan/memory.py), by hand."""

from __future__ import annotations

import pytest

from spcli.config import ScoreConfig
from spcli.errors import ConfigError
from spcli.plan.configs import SHIPPED_CONFIGS
from spcli.plan.memory import (
    GiB, base_weight_bytes_per_gpu, gpu_memory_utilization, kv_bytes_per_token_per_gpu, speculator_reserve,
    speculator_share,
)
from spcli.plan.shapes import ModelShape

LLAMA_8B = ModelShape.from_config("llama-8b", SHIPPED_CONFIGS["llama-8b"], "test")  # 8,030,261,248 params
H100_BYTES = 81559 * (1 << 20)  # nvidia-smi's total for an H100 80GB SXM
PAPER = ScoreConfig(lookahead=8, window=0, score_layers="all", pool=13)


def test_reserve_of_an_8b_speculator_for_a_32k_prompt_in_chunks():
    n, a, b, c = 32768, 8, 2, 8192
    terms = {
        "weights": 8_030_261_248 * b,  # 16.06 GB
        "kv": 2 * 32 * 8 * 128 * (n + a) * b,  # 128 KiB per token: 4.30 GB
        "repeated_kv": 2 * 32 * 128 * n * b,  # one layer's K, V for all 32 query heads: 0.54 GB
        "queries": 32 * 32 * (a + 1) * 128 * b,  # the scored rows of every layer: 2.4 MB
        "activations": c * (3 * 14336 + 4 * 4096) * b,  # one chunk: 0.97 GB (at n it would be 3.89 GB)
        "mask": 2**24 * (1 + b),  # one 2^24-element block of the chunk's c x n mask, booleans and sdpa's copy: 0.05 GB
        "scoring": 2 * 32 * (a + 1) * n * 4,  # 0.08 GB
        "context": GiB,
    }
    reserve = speculator_reserve(LLAMA_8B, n, PAPER, b, chunk=c)
    assert {k: getattr(reserve, k) for k in terms} == terms
    assert round(reserve.total / 1e9, 2) == 23.07  # the docstring's number
    assert gpu_memory_utilization(H100_BYTES, reserve.total) == 0.73  # floor((85.52 - 23.07) / 85.52, 2)
    assert gpu_memory_utilization(H100_BYTES, 2 * GiB) == 0.9  # vLLM's default caps it
    share = speculator_share(LLAMA_8B, PAPER, n, c, H100_BYTES, b)
    assert (share.reserve, share.gpu_memory_utilization) == (reserve, 0.73)


def test_activations_follow_the_chunk_and_the_cache_the_prompt():
    small, long = (speculator_reserve(LLAMA_8B, n, PAPER, 2, chunk=8192) for n in (32768, 131072))
    assert long.activations == small.activations  # flat in n at a fixed chunk
    assert long.kv == 2 * 32 * 8 * 128 * (131072 + 8) * 2  # the cache grows with n: 17.2 GB
    assert speculator_reserve(LLAMA_8B, 32768, PAPER, 2, chunk=2048).activations == small.activations // 4


def test_early_exit_caches_only_the_layers_it_runs():
    """Window 32, layer 13 of 32, no look-ahead (GemFilter's Llama-3.1-8B layer), first 14 layers loaded."""
    n, b = 32768, 2
    shape = LLAMA_8B.first_layers(14)
    score = ScoreConfig(lookahead=0, window=32, score_layers="13", pool=13)
    chunked = speculator_reserve(shape, n, score, b, chunk=8192)
    assert chunked.weights == (128256 * 4096 * 2 + 14 * 218_112_000 + 4096) * b  # embeddings, LM head, 14 layers
    assert chunked.kv == 2 * 14 * 8 * 128 * n * b  # 14 layers' cache: later chunks attend to it
    one_pass = speculator_reserve(shape, n, score, b, chunk=n)  # one chunk: no cache, the scored layer's keys
    assert one_pass.kv == (1 + 2) * 8 * 128 * n * b and one_pass.activations == n * (3 * 14336 + 4 * 4096) * b
    assert chunked.total < 0.7 * speculator_reserve(LLAMA_8B, n, PAPER, b).total


def test_a_speculator_that_leaves_too_little_is_refused():
    with pytest.raises(ConfigError, match="leaving too little for the base model: lower --max-model-len"):
        gpu_memory_utilization(16 * GiB, 15 * GiB)


def test_base_weights_split_over_ranks_and_kv_heads_copied_past_their_number():
    shape = ModelShape.from_config("llama-8b", SHIPPED_CONFIGS["llama-8b"], "test")
    norms = (2 * 32 + 1) * 4096 * 2
    assert base_weight_bytes_per_gpu(shape, 1, None) == 8_030_261_248 * 2
    layer = 4096 * 4096 * 2 + 3 * 4096 * 14336  # q, o, MLP
    kv = 2 * 4096 * 1024  # k, v: 8 heads of 128
    embed = 2 * 128256 * 4096
    assert base_weight_bytes_per_gpu(shape, 4, None) == (32 * (layer + kv) * 2 + embed * 2) // 4 + norms
    # tp 16 > 8 KV heads: each rank holds one KV head (a copy), not half of one
    assert base_weight_bytes_per_gpu(shape, 16, None) == (32 * layer * 2 + embed * 2) // 16 + 32 * kv * 2 // 8 + norms
    assert base_weight_bytes_per_gpu(shape, 1, "fp8") == 32 * (layer + kv) + embed * 2 + norms
    assert kv_bytes_per_token_per_gpu(shape, 4, 2) == 32 * 2 * 2 * 128 * 2
    assert kv_bytes_per_token_per_gpu(shape, 16, 1) == 32 * 2 * 1 * 128 * 1
