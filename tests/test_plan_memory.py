"""The speculator's GPU share and the base's per-GPU memory (spcli/plan/memory.py), by hand."""

from __future__ import annotations

import pytest

from spcli.config.scoring import ScoreConfig
from spcli.errors import ConfigError
from spcli.plan.configs import SHIPPED_CONFIGS
from spcli.plan.memory import (
    GiB, base_weight_bytes_per_gpu, batched_chunk_tokens, gpu_memory_utilization, kv_bytes_per_token_per_gpu,
    measured_prompt_len, prompt_len_within, speculator_reserve, speculator_share,
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
        "activations": 4 * c * (3 * 14336 + 4 * 4096) * b,  # one chunk across a group's 4 rows of 8192: 3.89 GB
        "mask": 2**24 * (1 + b),  # one 2^24-element block of the chunk's c x n mask, booleans and sdpa's copy: 0.05 GB
        "scoring": 2 * 32 * (a + 1) * n * 4,  # 0.08 GB
        "context": GiB,
    }
    reserve = speculator_reserve(LLAMA_8B, n, PAPER, b, chunk=c)
    assert {k: getattr(reserve, k) for k in terms} == terms
    assert round(reserve.total / 1e9, 2) == 25.99  # the docstring's number
    assert gpu_memory_utilization(H100_BYTES, reserve.total) == 0.69  # floor((85.52 - 25.99) / 85.52, 2)
    assert gpu_memory_utilization(H100_BYTES, 2 * GiB) == 0.9  # vLLM's default caps it
    share = speculator_share(LLAMA_8B, PAPER, n, c, H100_BYTES, b)
    assert (share.reserve, share.gpu_memory_utilization) == (reserve, 0.69)


def test_activations_follow_the_batched_chunk_and_the_cache_the_prompt():
    small, long = (speculator_reserve(LLAMA_8B, n, PAPER, 2, chunk=8192) for n in (32768, 131072))
    assert long.activations == small.activations  # flat in n at a fixed chunk
    assert long.kv == 2 * 32 * 8 * 128 * (131072 + 8) * 2  # the cache grows with n: 17.2 GB
    # a smaller chunk does not shrink them while many rows share a group: 16 rows of 2048 are in flight at once
    assert speculator_reserve(LLAMA_8B, 32768, PAPER, 2, chunk=2048).activations == small.activations
    wide = speculator_reserve(LLAMA_8B, 131072, PAPER, 2, chunk=65536)  # a 131072-token prompt alone, 65536 at a time
    assert wide.activations == 65536 * (3 * 14336 + 4 * 4096) * 2


def test_batched_chunks_count_every_row_of_a_group():
    """The tokens one forward holds, against the groups speculate_prompts really forms (prepare.speculator_groups)."""
    from spcli.config.scoring import SPECULATOR_BATCH_TOKENS
    from spcli.stages.prepare import speculator_groups

    for n, chunk, min_prompt in ((32768, 8192, 1), (4000, 8, 512), (131072, 65536, 1), (9000, 4096, 2000)):
        c = batched_chunk_tokens(n, chunk, min_prompt)
        seen = 0
        for w in range(min_prompt, n + 1, max(1, (n - min_prompt) // 97)):  # prompts of one length w, as many as fit
            lengths = [w] * (SPECULATOR_BATCH_TOKENS // w + 2)
            rows = max(map(len, speculator_groups(lengths)))
            seen = max(seen, rows * min(chunk, w))
        assert seen <= c, (n, chunk, seen, c)
    assert batched_chunk_tokens(32768, 8192) == 32768 and batched_chunk_tokens(4000, 8, 512) == 64 * 8


def test_early_exit_caches_only_the_layers_it_runs():
    """Window 32, layer 13 of 32, no look-ahead (GemFilter's Llama-3.1-8B layer), first 14 layers loaded."""
    n, b = 32768, 2
    shape = LLAMA_8B.first_layers(14)
    score = ScoreConfig(lookahead=0, window=32, score_layers="13", pool=13)
    chunked = speculator_reserve(shape, n, score, b, chunk=8192)
    assert chunked.weights == (128256 * 4096 * 2 + 14 * 218_112_000 + 4096) * b  # embeddings, LM head, 14 layers
    assert chunked.kv == 2 * 14 * 8 * 128 * n * b  # 14 layers' cache: later chunks attend to it
    one_pass = speculator_reserve(shape, n, score, b, chunk=n)  # one chunk: the DynamicCache still fills every layer
    assert one_pass.kv == chunked.kv and one_pass.activations == n * (3 * 14336 + 4 * 4096) * b
    assert chunked.total < 0.7 * speculator_reserve(LLAMA_8B, n, PAPER, b).total


def test_a_speculator_that_leaves_too_little_is_refused():
    with pytest.raises(ConfigError, match="leaving too little for the base model: lower --max-prompt-len"):
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


def test_the_prompt_bound_is_what_vllm_left_free_after_its_start():
    """Issue 40: the replica's prompt bound from the memory free once vLLM is up (each worker's mem_get_info),
    not only the plan: the planned bound where its reserve fits, the longest prompt that fits where less is free
    (a note says so), a refusal where nothing fits."""
    score = PAPER
    reserve = lambda n: speculator_reserve(LLAMA_8B, n, score, 2, 8192).total
    planned = 32768
    assert measured_prompt_len(reserve(planned) + 1, planned, LLAMA_8B, score, 2, 8192) == (planned, None)
    free = (reserve(8192) + reserve(16384)) // 2  # something else holds the rest of the GPU
    fits, note = measured_prompt_len(free, planned, LLAMA_8B, score, 2, 8192)
    assert 8192 <= fits < 16384 and reserve(fits) <= free < reserve(fits + 1)
    assert note.startswith(f"vLLM left {free / GiB:.2f} GiB free on a GPU where the speculator's reserve for 32768")
    assert f"prompts up to {fits} tokens" in note
    assert prompt_len_within(reserve(1) - 1, LLAMA_8B, score, 2, 8192, planned) == 0
    with pytest.raises(ConfigError, match="no prompt fits; lower --gpu-memory-utilization"):
        measured_prompt_len(reserve(1) - 1, planned, LLAMA_8B, score, 2, 8192)
