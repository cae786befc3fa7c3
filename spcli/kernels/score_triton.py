"""Triton kernels for token importance; the formula, row limits and packed layout: spcli/kernels/score.py.

A row is one (query head, step) pair. Per layer, two launches:

    _softmax_stats_kernel  grid (key split, row block, prompt): each row's running max and sum of 2^logit
                           over its split's keys below the row's limit -> part_max, part_sum [B, splits, H, S_max]
    _pooled_max_kernel     grid (tile, prompt): per block of steps, q.K^T again on a tile of n plus a pool // 2
                           halo, probabilities, pooling by a banded matmul, max over heads, folded into the
                           running max [S_max, N_total]; the last layer writes the mean (rows="mean") or
                           the max (rows="max") over steps instead.

Rows go through both kernels in blocks of BLOCK_G heads x BLOCK_S steps, at most _MAX_ROWS rows, so a
tile's size does not grow with the window, the look-ahead or the GQA group (Llama-405B: 16 heads per key
head; a 64-token window plus 8 look-ahead rows is 72 steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    IS_INTERPRETED = bool(triton.knobs.runtime.interpret)  # TRITON_INTERPRET=1 when the kernels below were built
except ImportError:
    HAS_TRITON = False
    IS_INTERPRETED = False

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if HAS_TRITON:

    @triton.jit
    def _query_rows(q_ptr, limits_ptr, stride_qh, stride_qs, kv_head, g0, step0, s0, num_steps, n,
                    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, HAS_LIMITS: tl.constexpr):
        """Heads kv_head * GROUP + g0 + [0, BLOCK_G) x steps s0 + [0, BLOCK_S): q [BLOCK_G * BLOCK_S, DIM_PAD]
        (row g * BLOCK_S + s), and per row its head, step, key limit (0 on padding rows) and is_row."""
        rows = tl.arange(0, BLOCK_G * BLOCK_S)
        group, step = g0 + rows // BLOCK_S, s0 + rows % BLOCK_S
        is_row = (group < GROUP) & (step < num_steps)
        head = kv_head * GROUP + group  # GQA by index: head h reads key head h // GROUP
        dims = tl.arange(0, DIM_PAD)
        ptrs = (q_ptr + head.to(tl.int64)[:, None] * stride_qh + (step0 + step).to(tl.int64)[:, None] * stride_qs
                + dims[None, :])
        q = tl.load(ptrs, mask=is_row[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
        if HAS_LIMITS:
            limit = tl.load(limits_ptr + step0 + step, mask=is_row, other=0)
        else:
            limit = tl.where(is_row, n, 0)
        return q, head, step, limit, is_row

    @triton.jit
    def _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, cols, n,
                HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, IS_FP32_DOT: tl.constexpr):
        """Unscaled q.K^T [rows, len(cols)] in fp32 for prompt positions cols (those outside [0, n) read 0)."""
        is_col = (cols >= 0) & (cols < n)
        dims = tl.arange(0, DIM_PAD)
        tok = (tok0 + cols).to(tl.int64)
        ptrs = k_ptr + tl.cast(kv_head, tl.int64) * stride_kh + tok[None, :] * stride_kn + dims[:, None]
        k = tl.load(ptrs, mask=is_col[None, :] & (dims < HEAD_DIM)[:, None], other=0.0)  # [DIM_PAD, len(cols)]
        if IS_FP32_DOT:
            return tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        return tl.dot(q, k)  # 16-bit inputs, fp32 accumulation

    @triton.jit
    def _softmax_stats_kernel(q_ptr, k_ptr, limits_ptr, cu_seqlens_ptr, cu_steps_ptr, part_max_ptr, part_sum_ptr,
                              stride_qh, stride_qs, stride_kh, stride_kn, qk_scale,
                              num_heads, max_steps, num_step_blocks,
                              GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                              HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                              HAS_LIMITS: tl.constexpr, IS_FP32_DOT: tl.constexpr):
        """Grid (split, row block, prompt): online max and sum of 2^logit over the key blocks of one split."""
        NUM_GROUP_BLOCKS: tl.constexpr = (GROUP + BLOCK_G - 1) // BLOCK_G
        split, block, prompt = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        num_splits = tl.num_programs(0)
        kv_head = block // (NUM_GROUP_BLOCKS * num_step_blocks)
        g0 = (block // num_step_blocks) % NUM_GROUP_BLOCKS * BLOCK_G
        s0 = block % num_step_blocks * BLOCK_S
        tok0 = tl.load(cu_seqlens_ptr + prompt)
        n = tl.load(cu_seqlens_ptr + prompt + 1) - tok0
        step0 = tl.load(cu_steps_ptr + prompt)
        num_steps = tl.load(cu_steps_ptr + prompt + 1) - step0
        if s0 >= num_steps:
            return
        q, head, step, limit, is_row = _query_rows(q_ptr, limits_ptr, stride_qh, stride_qs, kv_head, g0, step0, s0,
                                                   num_steps, n, GROUP, BLOCK_G, BLOCK_S, HEAD_DIM, DIM_PAD, HAS_LIMITS)
        row_max = tl.full([BLOCK_G * BLOCK_S], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_G * BLOCK_S], tl.float32)
        for start in range(split * BLOCK_N, n, num_splits * BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            logits = _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, cols, n, HEAD_DIM, DIM_PAD, IS_FP32_DOT)
            logits = tl.where(cols[None, :] < limit[:, None], logits * qk_scale, float("-inf"))  # log2 domain
            new_max = tl.maximum(row_max, tl.max(logits, axis=1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # no key below the limit yet: sum stays 0, no NaN
            row_sum = row_sum * tl.exp2(row_max - shift) + tl.sum(tl.exp2(logits - shift[:, None]), axis=1)
            row_max = new_max
        offs = ((prompt * num_splits + split) * num_heads + head) * max_steps + step
        tl.store(part_max_ptr + offs, row_max, mask=is_row)
        tl.store(part_sum_ptr + offs, row_sum, mask=is_row)

    @triton.jit
    def _pooled_max_kernel(q_ptr, k_ptr, limits_ptr, cu_seqlens_ptr, cu_steps_ptr, part_max_ptr, part_sum_ptr,
                           running_ptr, out_ptr,
                           stride_qh, stride_qs, stride_kh, stride_kn, stride_running, qk_scale,
                           num_kv_heads, num_splits, max_steps,
                           GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                           HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
                           POOL: tl.constexpr, BLOCK_W: tl.constexpr, POOL_PRECISION: tl.constexpr,
                           HAS_LIMITS: tl.constexpr, IS_FIRST_LAYER: tl.constexpr, IS_LAST_LAYER: tl.constexpr,
                           IS_FP32_DOT: tl.constexpr, IS_ROW_MAX: tl.constexpr):
        """Grid (tile, prompt): pooled probabilities of BLOCK_W - 2 * HALO positions, max over heads, into running."""
        HALO: tl.constexpr = POOL // 2
        tile, prompt = tl.program_id(0), tl.program_id(1)
        tok0 = tl.load(cu_seqlens_ptr + prompt)
        n = tl.load(cu_seqlens_ptr + prompt + 1) - tok0
        step0 = tl.load(cu_steps_ptr + prompt)
        num_steps = tl.load(cu_steps_ptr + prompt + 1) - step0
        if tile * (BLOCK_W - 2 * HALO) >= n:
            return
        j = tl.arange(0, BLOCK_W)
        cols = tile * (BLOCK_W - 2 * HALO) - HALO + j  # prompt positions, halo included; outside [0, n) count as 0
        band = tl.where(tl.abs(j[:, None] - j[None, :]) <= HALO, 1.0, 0.0)  # [W, W]: (p @ band)[i] = sum p[i +- HALO]
        splits = tl.arange(0, SPLITS_PAD)
        is_out = (j >= HALO) & (j < BLOCK_W - HALO) & (cols < n)
        out_cols = (tok0 + cols).to(tl.int64)
        total = tl.zeros([BLOCK_W], tl.float32)  # last layer: sum (or max) over steps of the max over layers, heads
        for s0 in range(0, num_steps, BLOCK_S):
            best = tl.zeros([BLOCK_S, BLOCK_W], tl.float32)  # probabilities are >= 0, so 0 is the max's identity
            for kv_head in range(num_kv_heads):
                for g0 in range(0, GROUP, BLOCK_G):
                    q, head, step, limit, is_row = _query_rows(q_ptr, limits_ptr, stride_qh, stride_qs, kv_head, g0,
                                                               step0, s0, num_steps, n, GROUP, BLOCK_G, BLOCK_S,
                                                               HEAD_DIM, DIM_PAD, HAS_LIMITS)
                    offs = ((prompt * num_splits + splits[:, None]) * (num_kv_heads * GROUP) + head[None, :]) \
                        * max_steps + step[None, :]  # [SPLITS_PAD, rows] of part_max / part_sum
                    is_part = (splits < num_splits)[:, None] & is_row[None, :]
                    part_max = tl.load(part_max_ptr + offs, mask=is_part, other=float("-inf"))
                    part_sum = tl.load(part_sum_ptr + offs, mask=is_part, other=0.0)
                    row_max = tl.where(is_row, tl.max(part_max, axis=0), 0.0)  # padding rows: finite, masked below
                    row_sum = tl.sum(part_sum * tl.exp2(part_max - row_max[None, :]), axis=0)
                    row_sum = tl.where(is_row, row_sum, 1.0)
                    logits = _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, cols, n,
                                     HEAD_DIM, DIM_PAD, IS_FP32_DOT)
                    probs = tl.exp2(logits * qk_scale - row_max[:, None]) / row_sum[:, None]
                    is_key = (cols[None, :] >= 0) & (cols[None, :] < limit[:, None])  # limit is 0 on padding rows
                    probs = tl.where(is_key, probs, 0.0)  # [rows, W]
                    if POOL > 1:
                        probs = tl.dot(probs, band, input_precision=POOL_PRECISION) / POOL
                    best = tl.maximum(best, tl.max(tl.reshape(probs, (BLOCK_G, BLOCK_S, BLOCK_W)), axis=0))
            steps = s0 + tl.arange(0, BLOCK_S)
            is_step = steps < num_steps
            ptrs = running_ptr + steps.to(tl.int64)[:, None] * stride_running + out_cols[None, :]
            is_running = is_step[:, None] & is_out[None, :]
            if not IS_FIRST_LAYER:  # NaN propagates, so a position no earlier layer wrote shows up
                best = tl.maximum(best, tl.load(ptrs, mask=is_running, other=0.0), propagate_nan=tl.PropagateNan.ALL)
            if IS_LAST_LAYER:
                best = tl.where(is_step[:, None], best, 0.0)  # 0: the identity of both, probabilities are >= 0
                if IS_ROW_MAX:
                    total = tl.maximum(total, tl.max(best, axis=0), propagate_nan=tl.PropagateNan.ALL)
                else:
                    total += tl.sum(best, axis=0)
            else:
                tl.store(ptrs, best, mask=is_running)
        if IS_LAST_LAYER:
            tl.store(out_ptr + out_cols, total if IS_ROW_MAX else total / num_steps, mask=is_out)


_BLOCK_N = 128  # keys per step of the statistics pass
_MAX_SPLITS = 16  # statistics programs per (prompt, row block): enough to fill the GPU at one prompt
_MAX_ROWS = 64  # (head, step) rows per tile: the [rows, BLOCK_W] fp32 probabilities stay in registers
_POOL_PRECISION = "tf32x3"  # fp32-accurate banded matmul on tensor cores (band entries are exact 0/1)


def row_blocks(group: int, max_steps: int, max_rows: int = _MAX_ROWS) -> tuple[int, int]:
    """(BLOCK_G, BLOCK_S): heads and steps per tile, powers of 2 with BLOCK_G * BLOCK_S <= max(16, max_rows)."""
    assert max_rows >= 16 and max_rows & (max_rows - 1) == 0, "max_rows: a power of 2, at least 16"
    block_g = min(triton.next_power_of_2(group), max_rows)
    block_s = min(triton.next_power_of_2(max_steps), max_rows // block_g)
    return block_g, max(block_s, triton.cdiv(16, block_g))  # tl.dot needs >= 16 rows


def importance_triton(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor,
    pool: int, max_len: int, max_steps: int, row_limits: torch.Tensor | None = None,
    out: torch.Tensor | None = None, max_rows: int = _MAX_ROWS, rows: str = "mean",
) -> torch.Tensor:
    """Launch the kernels, two per layer. queries [L, H, S_total, D]; keys L x [KVH, N_total, D] with any
    strides but a contiguous last dim (cache views are read in place); cu_steps, cu_seqlens int32 [B+1] and
    row_limits int32 [S_total] (or None: all keys) on the same device; max_len, max_steps: the longest prompt
    and step count; rows: "mean" or "max" over the query rows. Returns out [N_total] fp32. Raises TypeError for dtypes the kernel does not take."""
    num_layers, num_heads, _, head_dim = queries.shape
    num_kv_heads, total_len, _ = keys[0].shape
    num_prompts = cu_seqlens.numel() - 1
    group = num_heads // num_kv_heads
    if queries.dtype not in SUPPORTED_DTYPES or keys[0].dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"the triton scoring kernel takes float32, bfloat16 or float16, not {queries.dtype} "
                        f"queries and {keys[0].dtype} keys")
    assert len(keys) == num_layers, f"{len(keys)} key layers for {num_layers} query layers"
    assert group * num_kv_heads == num_heads, "query heads must be a multiple of key heads"
    assert pool >= 1 and pool % 2 == 1, "pool must be odd"
    assert queries.stride(-1) == 1, "query rows must be contiguous in D"
    for k in keys:
        assert k.shape == keys[0].shape and k.dtype == keys[0].dtype, "every key layer must match the first"
        assert k.stride(-1) == 1 and k.device == queries.device, "keys must be contiguous in D, on the queries' device"
    assert cu_seqlens.dtype == cu_steps.dtype == torch.int32 and cu_steps.numel() == num_prompts + 1
    assert row_limits is None or (row_limits.dtype == torch.int32 and row_limits.shape == queries.shape[2:3])
    assert max_steps >= 1, "at least one query row per prompt"
    assert rows in ("mean", "max"), f"rows must be mean or max, got {rows!r}"
    if out is None:
        out = torch.empty(total_len, dtype=torch.float32, device=queries.device)
    assert out.shape == (total_len,) and out.dtype == torch.float32 and out.is_contiguous()
    if total_len == 0:
        return out

    block_g, block_s = row_blocks(group, max_steps, max_rows)
    num_step_blocks = triton.cdiv(max_steps, block_s)
    num_row_blocks = num_kv_heads * triton.cdiv(group, block_g) * num_step_blocks
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    halo = pool // 2
    block_w = max(128, triton.next_power_of_2(4 * halo))  # at least half of each tile is output, not halo
    num_splits = min(_MAX_SPLITS, triton.cdiv(max_len, _BLOCK_N))
    num_tiles = triton.cdiv(max_len, block_w - 2 * halo)
    # NaN-filled scratch: whatever a kernel fails to write reaches the output as NaN
    part_max = torch.full((num_prompts, num_splits, num_heads, max_steps), math.nan, device=queries.device)
    part_sum = torch.full_like(part_max, math.nan)
    running = torch.full((max_steps, total_len), math.nan, device=queries.device)  # [S_max, N_total]
    limits = cu_steps if row_limits is None else row_limits  # any int32 pointer when unused
    qk_scale = head_dim**-0.5 * math.log2(math.e)  # softmax in base 2
    # fp32 dot for fp32 or mixed inputs; also for bf16 under the interpreter, whose tl.dot multiplies
    # bf16 bit patterns as uint16 (triton 3.7.1). bf16 products are exact in fp32 either way.
    is_fp32_dot = queries.dtype != keys[0].dtype or queries.dtype == torch.float32 or (
        IS_INTERPRETED and queries.dtype == torch.bfloat16
    )
    has_limits = row_limits is not None
    for layer, (q, k) in enumerate(zip(queries, keys)):
        _softmax_stats_kernel[(num_splits, num_row_blocks, num_prompts)](
            q, k, limits, cu_seqlens, cu_steps, part_max, part_sum,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), qk_scale, num_heads, max_steps, num_step_blocks,
            group, block_g, block_s, head_dim, dim_pad, _BLOCK_N, has_limits, is_fp32_dot,
        )
        _pooled_max_kernel[(num_tiles, num_prompts)](
            q, k, limits, cu_seqlens, cu_steps, part_max, part_sum, running, out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), running.stride(0), qk_scale,
            num_kv_heads, num_splits, max_steps,
            group, block_g, block_s, head_dim, dim_pad, triton.next_power_of_2(num_splits),
            pool, block_w, _POOL_PRECISION, has_limits, layer == 0, layer == num_layers - 1, is_fp32_dot,
            rows == "max", num_warps=8,
        )
    return out
