"""spcli/kernels/score_triton.py: the kernels (`tri`) against the reference (`ref`), under Triton's interpreter on CPU.

Outputs are NaN-filled first, so an element no program wrote fails. Row blocks: at most 64 (head,
step) rows per tile; max_rows=16 forces several head blocks per key head at test sizes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_kernels_score import DEVICE, TOLERANCES, assert_close, make_inputs, needs_triton, window_limits
from test_kernels_score import score as kernels_fixture

score = kernels_fixture  # the module fixture `score`: score.py with kernels this machine can run


def run_kernel(score, queries, keys, pool, row_limits=None, max_rows=64, rows="mean"):
    """The launcher on one prompt, writing into a NaN-poisoned output so an unwritten element fails."""
    num_steps, n = queries.shape[2], keys[0].shape[1]
    cu_steps = torch.tensor([0, num_steps], dtype=torch.int32, device=DEVICE)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    out = torch.full((n,), math.nan, device=DEVICE)
    return score.importance_triton(queries, cu_steps, keys, cu_seqlens, pool, n, num_steps, row_limits, out=out,
                                   max_rows=max_rows, rows=rows)


SHAPES = [  # (n, head dim, steps, pool, dtype, layers): odd n around the 128-wide tiles
    *[(n, d, s, p, torch.bfloat16, 3) for n in (1, 31, 33) for d in (64, 128) for s in (1, 8) for p in (1, 13)],
    *[(1000, d, s, p, torch.bfloat16, 2) for d, s, p in ((64, 8, 13), (128, 1, 13), (64, 1, 1), (128, 8, 1), (64, 8, 31))],
    *[(n, d, 8, 13, dt, 2) for n, d in ((33, 64), (1000, 128)) for dt in (torch.float32, torch.float16)],
    (4097, 128, 8, 13, torch.float32, 2),
    (4097, 128, 8, 13, torch.bfloat16, 2),
    (4097, 64, 1, 1, torch.float16, 2),
]


@needs_triton
@pytest.mark.parametrize(
    "n, head_dim, num_steps, pool, dtype, num_layers", SHAPES,
    ids=[f"n{n}-D{d}-S{s}-pool{p}-{str(dt)[6:]}-L{l}" for n, d, s, p, dt, l in SHAPES],
)
def test_kernel_matches_reference(score, n, head_dim, num_steps, pool, dtype, num_layers):
    queries, keys = make_inputs(num_layers, 9, 3, num_steps, n, head_dim, dtype, seed=n)
    ref = score.importance_reference(queries, keys, pool)
    tri = run_kernel(score, queries, keys, pool)
    assert_close(f"n={n} D={head_dim} S={num_steps} pool={pool} {dtype}", ref, tri, *TOLERANCES[dtype])


@needs_triton
def test_kernel_reads_cache_views_in_place(score):
    n, num_steps, pool = 150, 4, 13
    gen = torch.Generator().manual_seed(1)
    caches = [torch.randn(2, 3, n + 20, 64, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2)]  # [B,KVH,T,D]
    keys = [c[1, :, :n, :] for c in caches]  # L x [KVH, n, D], not contiguous
    queries = (2 * torch.randn(2, 9, num_steps, 64, generator=gen)).to(DEVICE, torch.bfloat16)
    assert not keys[0].is_contiguous()
    ref = score.importance_reference(queries, keys, pool)
    assert_close("cache views", ref, run_kernel(score, queries, keys, pool), *TOLERANCES[torch.bfloat16])
    assert_close("dispatcher", ref, score.token_importance(queries, keys, pool=pool, impl="triton"),
                 *TOLERANCES[torch.bfloat16])


@needs_triton
@pytest.mark.parametrize("pool", [1, 13])
def test_packed_matches_per_prompt(score, pool):
    lens, steps = [31, 1, 200, 33], [8, 1, 3, 5]
    gen = torch.Generator().manual_seed(2)
    queries = (2 * torch.randn(2, 9, sum(steps), 64, generator=gen)).to(DEVICE, torch.float16)  # [L, H, S_total, D]
    keys = [torch.randn(3, sum(lens), 64, generator=gen).to(DEVICE, torch.float16) for _ in range(2)]  # L x [KVH, N, D]
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_steps = torch.tensor([0, *torch.tensor(steps).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    per_prompt = torch.cat([
        score.importance_reference(queries[:, :, cu_steps[b] : cu_steps[b + 1]],
                                   [k[:, cu_seqlens[b] : cu_seqlens[b + 1]] for k in keys], pool)
        for b in range(len(lens))
    ])
    ref = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, pool=pool, impl="torch")
    tri = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, pool=pool, impl="triton")
    assert_close("packed ref", per_prompt, ref, 0.0, 0.0)
    assert_close("packed tri", per_prompt, tri, *TOLERANCES[torch.float16])
    out = torch.full((sum(lens),), math.nan, device=DEVICE)
    poisoned = score.importance_triton(queries, cu_steps, keys, cu_seqlens, pool, max(lens), max(steps), out=out)
    assert_close("packed launcher", per_prompt, poisoned, *TOLERANCES[torch.float16])


WINDOWS = [  # (window W, look-ahead rows, n, heads, KV heads, dtype, pool, max_rows)
    (1, 0, 63, 9, 3, torch.float32, 13, 64),
    (1, 8, 63, 9, 3, torch.bfloat16, 13, 64),
    (17, 0, 127, 9, 3, torch.bfloat16, 13, 64),
    (17, 8, 1000, 9, 3, torch.bfloat16, 13, 64),
    (32, 0, 1000, 16, 2, torch.float32, 13, 64),
    (32, 8, 127, 16, 2, torch.float32, 1, 64),
    (64, 0, 63, 16, 2, torch.bfloat16, 13, 64),  # W > n: every prompt token is a row
    (64, 8, 127, 16, 2, torch.bfloat16, 13, 64),  # 72 steps: 9 blocks of 8 steps x 8 heads
    (64, 8, 255, 9, 3, torch.float32, 13, 64),
    (5, 2, 63, 24, 1, torch.float16, 5, 16),  # group 24 in head blocks of 16, the second half padding
    (32, 0, 1000, 9, 3, torch.bfloat16, 31, 64),  # smollm2-135m's default: pool 31 (a 15-token halo per tile)
]


@needs_triton
@pytest.mark.parametrize(
    "window, lookahead, n, num_heads, num_kv_heads, dtype, pool, max_rows", WINDOWS,
    ids=[f"W{w}-A{a}-n{n}-H{h}-KVH{kv}-{str(dt)[6:]}-pool{p}-rows{r}" for w, a, n, h, kv, dt, p, r in WINDOWS],
)
def test_kernel_with_window_rows_matches_reference(score, window, lookahead, n, num_heads, num_kv_heads, dtype,
                                                   pool, max_rows):
    limits = window_limits(n, window, lookahead)  # int32 [S]
    queries, keys = make_inputs(2, num_heads, num_kv_heads, limits.numel(), n, 64, dtype, seed=n + window)
    ref = score.importance_reference(queries, keys, pool, limits)
    tri = run_kernel(score, queries, keys, pool, limits, max_rows)
    assert_close(f"W={window} look-ahead={lookahead} n={n} H={num_heads}/{num_kv_heads} {dtype}", ref, tri,
                 *TOLERANCES[dtype])


ROW_MAX = [  # rows="max": (window W, look-ahead rows, n, heads, KV heads, dtype, pool, max_rows)
    (1, 8, 63, 9, 3, torch.bfloat16, 13, 64),
    (17, 0, 127, 9, 3, torch.float32, 13, 64),
    (64, 8, 127, 16, 2, torch.bfloat16, 13, 64),  # 72 steps: several step blocks fold into the max
    (5, 2, 63, 24, 1, torch.float16, 5, 16),
    (32, 0, 1000, 9, 3, torch.bfloat16, 31, 64),  # smollm2-135m's window and pool
]


@needs_triton
@pytest.mark.parametrize(
    "window, lookahead, n, num_heads, num_kv_heads, dtype, pool, max_rows", ROW_MAX,
    ids=[f"W{w}-A{a}-n{n}-H{h}-KVH{kv}-{str(dt)[6:]}-pool{p}-rows{r}" for w, a, n, h, kv, dt, p, r in ROW_MAX],
)
def test_kernel_row_max_matches_reference(score, window, lookahead, n, num_heads, num_kv_heads, dtype, pool,
                                          max_rows):
    limits = window_limits(n, window, lookahead)
    queries, keys = make_inputs(2, num_heads, num_kv_heads, limits.numel(), n, 64, dtype, seed=n + window)
    ref = score.importance_reference(queries, keys, pool, limits, rows="max")
    tri = run_kernel(score, queries, keys, pool, limits, max_rows, rows="max")
    assert_close(f"rows=max W={window} look-ahead={lookahead} n={n} {dtype}", ref, tri, *TOLERANCES[dtype])
    mean = score.importance_reference(queries, keys, pool, limits)
    assert not torch.allclose(ref, mean)  # the option changes the scores, so the parity above means something


@needs_triton
def test_packed_row_max_matches_per_prompt(score):
    lens, rows = [63, 1, 130], [(17, 8), (1, 0), (32, 3)]
    limits = torch.cat([window_limits(n, w, a) for n, (w, a) in zip(lens, rows)])
    steps = [min(max(1, w), n) + a for n, (w, a) in zip(lens, rows)]
    queries, keys = make_inputs(2, 8, 2, sum(steps), sum(lens), 32, torch.bfloat16, seed=8)
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_steps = torch.tensor([0, *torch.tensor(steps).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    ref = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, impl="torch", row_limits=limits,
                                        rows="max")
    tri = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, impl="triton", row_limits=limits,
                                        rows="max")
    assert_close("packed rows=max", ref, tri, *TOLERANCES[torch.bfloat16])
    one = score.token_importance(queries[:, :, : steps[0]], [k[:, : lens[0]] for k in keys], impl="triton",
                                 row_limits=limits[: steps[0]], rows="max")
    assert_close("dispatcher rows=max", ref[: lens[0]], one, *TOLERANCES[torch.bfloat16])


@needs_triton
@pytest.mark.parametrize("dtype, max_rows", [(torch.float32, 64), (torch.bfloat16, 16)])
def test_kernel_with_any_row_limits_matches_reference(score, dtype, max_rows):
    # n=301: 3 key splits and 3 tiles; limit 1 leaves splits 1 and 2 without a key for that row
    n = 301
    limits = torch.tensor([1, 2, 7, 128, 129, 116, 117, 250, n, 60, n], dtype=torch.int32, device=DEVICE)
    queries, keys = make_inputs(2, 9, 3, limits.numel(), n, 32, dtype, seed=5)
    ref = score.importance_reference(queries, keys, 13, limits)
    assert_close(f"any limits, {max_rows}-row tiles", ref, run_kernel(score, queries, keys, 13, limits, max_rows),
                 *TOLERANCES[dtype])


@needs_triton
def test_dispatchers_take_int64_limits_and_offsets(score):
    lens, steps = [9, 5], [3, 2]
    limits = torch.tensor([7, 8, 9, 5, 5], device=DEVICE)  # int64, as speculate builds them
    queries, keys = make_inputs(2, 4, 2, sum(steps), sum(lens), 16, torch.float32, seed=6)
    cu_steps, cu_seqlens = torch.tensor([0, 3, 5], device=DEVICE), torch.tensor([0, 9, 14], device=DEVICE)
    ref = score.importance_reference_packed(queries, cu_steps, keys, cu_seqlens, 3, limits)
    tri = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, pool=3, impl="triton", row_limits=limits)
    assert_close("packed dispatcher", ref, tri, *TOLERANCES[torch.float32])
    one = score.token_importance(queries[:, :, :3], [k[:, :9] for k in keys], pool=3, impl="triton",
                                 row_limits=limits[:3])
    assert_close("dispatcher", ref[:9], one, *TOLERANCES[torch.float32])
    with pytest.raises(AssertionError, match=r"row limits must lie in \[1, n\]"):  # 6 > the second prompt's 5 keys
        score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, pool=3, impl="triton",
                                      row_limits=torch.tensor([7, 8, 9, 6, 5], device=DEVICE))


@needs_triton
def test_kernel_row_limits_of_n_equal_none(score):
    queries, keys = make_inputs(2, 16, 2, 9, 127, 64, torch.float32, seed=3)
    full = torch.full((9,), 127, dtype=torch.int32, device=DEVICE)
    assert_close("limits n vs None", run_kernel(score, queries, keys, 13), run_kernel(score, queries, keys, 13, full),
                 *TOLERANCES[torch.float32])


@needs_triton
@pytest.mark.parametrize("dtype, max_rows", [(torch.float32, 64), (torch.bfloat16, 16)])
def test_packed_window_rows_match_per_prompt(score, dtype, max_rows):
    lens = [63, 1, 130, 17, 5]
    rows = [(17, 8), (1, 0), (32, 3), (64, 0), (1, 8)]  # per prompt (window W, look-ahead)
    limits = torch.cat([window_limits(n, w, a) for n, (w, a) in zip(lens, rows)])  # [S_total], per prompt
    steps = [min(max(1, w), n) + a for n, (w, a) in zip(lens, rows)]
    gen = torch.Generator().manual_seed(4)
    queries = (2 * torch.randn(2, 8, sum(steps), 32, generator=gen)).to(DEVICE, dtype)  # [L, H, S_total, D]
    keys = [torch.randn(2, sum(lens), 32, generator=gen).to(DEVICE, dtype) for _ in range(2)]  # L x [KVH, N, D]
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_steps = torch.tensor([0, *torch.tensor(steps).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    per_prompt = torch.cat([
        score.importance_reference(queries[:, :, cu_steps[b] : cu_steps[b + 1]],
                                   [k[:, cu_seqlens[b] : cu_seqlens[b + 1]] for k in keys], 13,
                                   window_limits(n, w, a))
        for b, (n, (w, a)) in enumerate(zip(lens, rows))
    ])
    ref = score.token_importance_packed(queries, cu_steps, keys, cu_seqlens, impl="torch", row_limits=limits)
    assert_close("packed ref", per_prompt, ref, 0.0, 0.0)
    out = torch.full((sum(lens),), math.nan, device=DEVICE)
    tri = score.importance_triton(queries, cu_steps, keys, cu_seqlens, 13, max(lens), max(steps), limits,
                                  out=out, max_rows=max_rows)
    assert_close(f"packed tri, {max_rows}-row tiles", per_prompt, tri, *TOLERANCES[dtype])


# --- the kernel inside the real speculator pass ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [dict(lookahead=8, window=0, score_layers="all", pool=13, rows="mean", chunk=32),  # the paper's
                                    dict(lookahead=0, window=32, score_layers="14", pool=31, rows="mean", chunk=8)])  # the default
def test_kept_indices_equal_between_torch_and_triton_on_smollm2(score, smollm2_dir, monkeypatch, recipe):
    """On the real SmolLM2 and real prompts, selection from the kernel's scores equals the reference's."""
    import json

    from spcli.config.scoring import ScoreConfig, SelectConfig
    from spcli.stages import speculate as speculate_module
    from spcli.models.load import load_causal_lm
    from spcli.models.files import eos_token_ids, load_tokenizer
    from spcli.stages.select import select_tokens
    from spcli.stages.tokenize import tokenize
    from spcli.io.records import Record

    monkeypatch.setattr(speculate_module, "token_importance", score.token_importance)  # the (re)loaded kernels
    model = load_causal_lm(smollm2_dir, "float32", DEVICE).model
    tokenizer = load_tokenizer(smollm2_dir)
    eos = eos_token_ids(model, tokenizer)
    examples = Path(__file__).parent.parent / "examples" / "docs.jsonl"
    num_docs = 2 if DEVICE.type == "cuda" else 1  # 936 and 1312 tokens; the CPU interpreter took ~1 min per doc
    most = None if DEVICE.type == "cuda" else 512  # on the CPU the first 512 tokens of the real prompt
    for line in examples.read_text().splitlines()[:num_docs]:
        row = json.loads(line)
        ids = tokenize(Record(0, 0, row["id"], messages=row["messages"]), tokenizer, 8000, "error")[:most]
        score_recipe = {k: v for k, v in recipe.items() if k != "chunk"}
        ref = speculate_module.speculate(model, ids, ScoreConfig(**score_recipe, impl="torch"), eos, DEVICE).importance
        tri = speculate_module.speculate(model, ids, ScoreConfig(**score_recipe, impl="triton"), eos, DEVICE).importance
        assert_close(f"importance {row['id']}", ref, tri, atol=1e-7, rtol=2e-5)
        for keep in (0.1, 0.3):
            kept_ref, kept_tri = (select_tokens(x, SelectConfig(keep=keep, chunk=recipe["chunk"])).tolist() for x in (ref, tri))
            assert kept_ref == kept_tri
