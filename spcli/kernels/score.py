"""Token importance from speculator attention (Speculative Prefill, arXiv:2502.02789, Sec. 3).

For one prompt of n tokens, L layers, H query heads sharing KVH key heads (GQA), S query rows
(the last prompt token plus each look-ahead token, all post-RoPE) and head dim D:

    p[l, h, s, :] = softmax(q[l, h, s] . K[l, h // (H / KVH)]^T / sqrt(D))   over the n prompt keys, fp32
    p'[l, h, s, :] = avgpool(p[l, h, s, :], kernel=pool, stride=1, zero padding counted)  same length n
    importance[i] = mean_s max_{l, h} p'[l, h, s, i]

The reference streams over layers, so it never holds more than one layer's [H, S, n]. The Triton
kernel never holds more than a [S, n] running max: per layer, one pass gathers each query row's
softmax max/sum over key splits, a second recomputes q.K^T on tiles of n plus a pool // 2 halo,
pools by a banded matmul, and folds the max over heads into the running max.

Packed layout (several prompts in one call): prompt b owns key positions
cu_seqlens[b]:cu_seqlens[b+1] and query rows cu_steps[b]:cu_steps[b+1]; both are int32 [B+1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from spcli.errors import ConfigError

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    IS_INTERPRETED = bool(triton.knobs.runtime.interpret)  # TRITON_INTERPRET=1 when the kernels below were built
except ImportError:
    HAS_TRITON = False
    IS_INTERPRETED = False


def smooth(probs: torch.Tensor, pool: int) -> torch.Tensor:
    """Average-pool along the last axis, stride 1, same length; padding zeros are counted."""
    if pool == 1:
        return probs
    assert pool % 2 == 1, "pool must be odd"
    shape = probs.shape
    flat = probs.reshape(-1, 1, shape[-1])  # [rows, 1, n]
    out = F.avg_pool1d(flat, kernel_size=pool, stride=1, padding=pool // 2, count_include_pad=True)
    return out.reshape(shape)


def layer_probs(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """softmax(q.K^T/sqrt(D)) of one layer in fp32.

    query: [H, S, D]; key: [KVH, n, D] (H divisible by KVH). Returns [H, S, n] float32.
    """
    num_heads, num_steps, head_dim = query.shape
    num_kv_heads, n, _ = key.shape
    group = num_heads // num_kv_heads
    assert group * num_kv_heads == num_heads, "query heads must be a multiple of key heads"
    q = query.float().reshape(num_kv_heads, group * num_steps, head_dim)  # [KVH, G*S, D]
    logits = torch.bmm(q, key.float().transpose(1, 2)) * head_dim**-0.5  # [KVH, G*S, n]
    return torch.softmax(logits, dim=-1).reshape(num_heads, num_steps, n)


def importance_reference(queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int) -> torch.Tensor:
    """Reference importance for one prompt.

    queries: [L, H, S, D] query rows per layer; keys: L tensors [KVH, n, D] (views into a cache are
    fine). Returns [n] float32.
    """
    num_layers, _, num_steps, _ = queries.shape
    assert len(keys) == num_layers, f"{len(keys)} key layers for {num_layers} query layers"
    n = keys[0].shape[1]
    best = torch.zeros(num_steps, n, dtype=torch.float32, device=queries.device)  # [S, n]
    for layer in range(num_layers):
        probs = smooth(layer_probs(queries[layer], keys[layer]), pool)  # [H, S, n]
        best = torch.maximum(best, probs.amax(dim=0))
    return best.mean(dim=0)


def importance_naive(queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int) -> torch.Tensor:
    """The materialising version (the paper's code path): builds [L, H, S, n] at once. Benchmarks only."""
    probs = torch.stack([layer_probs(queries[l], keys[l]) for l in range(len(keys))])  # [L, H, S, n]
    return smooth(probs, pool).amax(dim=(0, 1)).mean(dim=0)


def importance_reference_packed(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor, pool: int
) -> torch.Tensor:
    """Reference for the packed layout: importance_reference on each prompt. Returns [N_total] float32."""
    steps, lens = cu_steps.tolist(), cu_seqlens.tolist()
    parts = [
        importance_reference(queries[:, :, steps[b] : steps[b + 1]], [k[:, lens[b] : lens[b + 1]] for k in keys], pool)
        for b in range(len(lens) - 1)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=queries.device)


if HAS_TRITON:

    @triton.jit
    def _query_rows(q_ptr, stride_qh, stride_qs, kv_head, step0, num_steps,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, STEPS_PAD: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
        """The GROUP query heads on key head kv_head: [GROUP_PAD * STEPS_PAD, DIM_PAD], row g * STEPS_PAD + s."""
        rows = tl.arange(0, GROUP_PAD * STEPS_PAD)
        group, step = rows // STEPS_PAD, rows % STEPS_PAD
        is_row = (group < GROUP) & (step < num_steps)
        head = (kv_head * GROUP + group).to(tl.int64)  # GQA by index: head h reads key head h // GROUP
        dims = tl.arange(0, DIM_PAD)
        ptrs = q_ptr + head[:, None] * stride_qh + (step0 + step).to(tl.int64)[:, None] * stride_qs + dims[None, :]
        return tl.load(ptrs, mask=is_row[:, None] & (dims < HEAD_DIM)[None, :], other=0.0), is_row

    @triton.jit
    def _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, cols, n,
                HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, IS_FP32_DOT: tl.constexpr):
        """Unscaled q.K^T [rows, len(cols)] in fp32 for prompt positions cols; is_col marks those in [0, n)."""
        is_col = (cols >= 0) & (cols < n)
        dims = tl.arange(0, DIM_PAD)
        tok = (tok0 + cols).to(tl.int64)
        ptrs = k_ptr + tl.cast(kv_head, tl.int64) * stride_kh + tok[None, :] * stride_kn + dims[:, None]
        k = tl.load(ptrs, mask=is_col[None, :] & (dims < HEAD_DIM)[:, None], other=0.0)  # [DIM_PAD, len(cols)]
        if IS_FP32_DOT:
            logits = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            logits = tl.dot(q, k)  # 16-bit inputs, fp32 accumulation
        return logits, is_col

    @triton.jit
    def _softmax_stats_kernel(q_ptr, k_ptr, cu_seqlens_ptr, cu_steps_ptr, part_max_ptr, part_sum_ptr,
                              stride_qh, stride_qs, stride_kh, stride_kn, qk_scale,
                              GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, STEPS_PAD: tl.constexpr,
                              HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                              IS_FP32_DOT: tl.constexpr):
        """Grid (split, key head, prompt): online max and sum of 2^logit over the key blocks of one split."""
        split, kv_head, prompt = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        num_splits, num_kv_heads = tl.num_programs(0), tl.num_programs(1)
        tok0 = tl.load(cu_seqlens_ptr + prompt)
        n = tl.load(cu_seqlens_ptr + prompt + 1) - tok0
        step0 = tl.load(cu_steps_ptr + prompt)
        num_steps = tl.load(cu_steps_ptr + prompt + 1) - step0
        q, is_row = _query_rows(q_ptr, stride_qh, stride_qs, kv_head, step0, num_steps,
                                GROUP, GROUP_PAD, STEPS_PAD, HEAD_DIM, DIM_PAD)
        row_max = tl.full([GROUP_PAD * STEPS_PAD], float("-inf"), tl.float32)
        row_sum = tl.zeros([GROUP_PAD * STEPS_PAD], tl.float32)
        for start in range(split * BLOCK_N, n, num_splits * BLOCK_N):
            logits, is_col = _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, start + tl.arange(0, BLOCK_N), n,
                                     HEAD_DIM, DIM_PAD, IS_FP32_DOT)
            logits = tl.where(is_col[None, :], logits * qk_scale, float("-inf"))  # log2 domain
            new_max = tl.maximum(row_max, tl.max(logits, axis=1))
            row_sum = row_sum * tl.exp2(row_max - new_max) + tl.sum(tl.exp2(logits - new_max[:, None]), axis=1)
            row_max = new_max
        offs = ((prompt * num_kv_heads + kv_head) * num_splits + split) * (GROUP_PAD * STEPS_PAD)
        rows = tl.arange(0, GROUP_PAD * STEPS_PAD)
        tl.store(part_max_ptr + offs + rows, row_max)
        tl.store(part_sum_ptr + offs + rows, row_sum)

    @triton.jit
    def _pooled_max_kernel(q_ptr, k_ptr, cu_seqlens_ptr, cu_steps_ptr, part_max_ptr, part_sum_ptr, running_ptr, out_ptr,
                           stride_qh, stride_qs, stride_kh, stride_kn, stride_running, qk_scale,
                           num_kv_heads, num_splits,
                           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, STEPS_PAD: tl.constexpr,
                           HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
                           POOL: tl.constexpr, BLOCK_W: tl.constexpr, POOL_PRECISION: tl.constexpr,
                           IS_FIRST_LAYER: tl.constexpr, IS_LAST_LAYER: tl.constexpr, IS_FP32_DOT: tl.constexpr):
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
        rows = tl.arange(0, GROUP_PAD * STEPS_PAD)
        best = tl.zeros([STEPS_PAD, BLOCK_W], tl.float32)  # probabilities are >= 0, so 0 is the max's identity
        for kv_head in range(num_kv_heads):
            q, is_row = _query_rows(q_ptr, stride_qh, stride_qs, kv_head, step0, num_steps,
                                    GROUP, GROUP_PAD, STEPS_PAD, HEAD_DIM, DIM_PAD)
            split_rows = ((prompt * num_kv_heads + kv_head) * num_splits + splits) * (GROUP_PAD * STEPS_PAD)
            offs = split_rows[:, None] + rows[None, :]  # [SPLITS_PAD, rows] of part_max / part_sum
            is_split = (splits < num_splits)[:, None]
            part_max = tl.load(part_max_ptr + offs, mask=is_split, other=float("-inf"))  # [SPLITS_PAD, rows]
            part_sum = tl.load(part_sum_ptr + offs, mask=is_split, other=0.0)
            row_max = tl.max(part_max, axis=0)
            row_sum = tl.sum(part_sum * tl.exp2(part_max - row_max[None, :]), axis=0)
            logits, is_col = _logits(q, k_ptr, stride_kh, stride_kn, kv_head, tok0, cols, n,
                                     HEAD_DIM, DIM_PAD, IS_FP32_DOT)
            probs = tl.exp2(logits * qk_scale - row_max[:, None]) / row_sum[:, None]
            probs = tl.where(is_row[:, None] & is_col[None, :], probs, 0.0)  # [rows, W]
            if POOL > 1:
                probs = tl.dot(probs, band, input_precision=POOL_PRECISION) / POOL
            best = tl.maximum(best, tl.max(tl.reshape(probs, (GROUP_PAD, STEPS_PAD, BLOCK_W)), axis=0))
        steps = tl.arange(0, STEPS_PAD)
        is_step = steps < num_steps
        is_out = (j >= HALO) & (j < BLOCK_W - HALO) & (cols < n)
        ptrs = running_ptr + steps[:, None] * stride_running + (tok0 + cols).to(tl.int64)[None, :]
        if not IS_FIRST_LAYER:  # NaN propagates, so a position no earlier layer wrote shows up
            best = tl.maximum(best, tl.load(ptrs, mask=is_step[:, None] & is_out[None, :], other=0.0),
                              propagate_nan=tl.PropagateNan.ALL)
        if IS_LAST_LAYER:
            mean = tl.sum(tl.where(is_step[:, None], best, 0.0), axis=0) / num_steps
            tl.store(out_ptr + (tok0 + cols).to(tl.int64), mean, mask=is_out)
        else:
            tl.store(ptrs, best, mask=is_step[:, None] & is_out[None, :])


_BLOCK_N = 128  # keys per step of the statistics pass
_MAX_SPLITS = 16  # statistics programs per (prompt, key head): enough to fill the GPU at one prompt
_POOL_PRECISION = "tf32x3"  # fp32-accurate banded matmul on tensor cores (band entries are exact 0/1)


def importance_triton(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor,
    pool: int, max_len: int, max_steps: int, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the kernels, two per layer. queries [L, H, S_total, D]; keys L x [KVH, N_total, D] with any
    strides but a contiguous last dim (cache views are read in place); cu_steps, cu_seqlens int32 [B+1]
    on the same device; max_len, max_steps: the longest prompt and step count. Returns out [N_total] fp32."""
    num_layers, num_heads, _, head_dim = queries.shape
    num_kv_heads, total_len, _ = keys[0].shape
    num_prompts = cu_seqlens.numel() - 1
    group = num_heads // num_kv_heads
    assert len(keys) == num_layers, f"{len(keys)} key layers for {num_layers} query layers"
    assert group * num_kv_heads == num_heads, "query heads must be a multiple of key heads"
    assert pool >= 1 and pool % 2 == 1, "pool must be odd"
    assert queries.stride(-1) == 1, "query rows must be contiguous in D"
    assert queries.dtype in (torch.float32, torch.bfloat16, torch.float16), queries.dtype
    for k in keys:
        assert k.shape == keys[0].shape and k.dtype == keys[0].dtype, "every key layer must match the first"
        assert k.stride(-1) == 1 and k.device == queries.device, "keys must be contiguous in D, on the queries' device"
    assert cu_seqlens.dtype == cu_steps.dtype == torch.int32 and cu_steps.numel() == num_prompts + 1
    assert max_steps >= 1, "at least one query row per prompt"
    if out is None:
        out = torch.empty(total_len, dtype=torch.float32, device=queries.device)
    assert out.shape == (total_len,) and out.dtype == torch.float32 and out.is_contiguous()
    if total_len == 0:
        return out

    group_pad = triton.next_power_of_2(group)
    steps_pad = max(triton.next_power_of_2(max_steps), triton.cdiv(16, group_pad))  # tl.dot needs >= 16 rows
    rows = group_pad * steps_pad
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    halo = pool // 2
    block_w = max(128, triton.next_power_of_2(4 * halo))  # at least half of each tile is output, not halo
    num_splits = min(_MAX_SPLITS, triton.cdiv(max_len, _BLOCK_N))
    num_tiles = triton.cdiv(max_len, block_w - 2 * halo)
    # NaN-filled scratch: whatever a kernel fails to write reaches the output as NaN
    part_max = torch.full((num_prompts, num_kv_heads, num_splits, rows), math.nan, device=queries.device)
    part_sum = torch.full_like(part_max, math.nan)
    running = torch.full((max_steps, total_len), math.nan, device=queries.device)  # [S_max, N_total]
    qk_scale = head_dim**-0.5 * math.log2(math.e)  # softmax in base 2
    # fp32 dot for fp32 or mixed inputs; also for bf16 under the interpreter, whose tl.dot multiplies
    # bf16 bit patterns as uint16 (triton 3.7.1). bf16 products are exact in fp32 either way.
    is_fp32_dot = queries.dtype != keys[0].dtype or queries.dtype == torch.float32 or (
        IS_INTERPRETED and queries.dtype == torch.bfloat16
    )
    for layer, (q, k) in enumerate(zip(queries, keys)):
        _softmax_stats_kernel[(num_splits, num_kv_heads, num_prompts)](
            q, k, cu_seqlens, cu_steps, part_max, part_sum,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), qk_scale,
            group, group_pad, steps_pad, head_dim, dim_pad, _BLOCK_N, is_fp32_dot,
        )
        _pooled_max_kernel[(num_tiles, num_prompts)](
            q, k, cu_seqlens, cu_steps, part_max, part_sum, running, out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), running.stride(0), qk_scale, num_kv_heads, num_splits,
            group, group_pad, steps_pad, head_dim, dim_pad, triton.next_power_of_2(num_splits),
            pool, block_w, _POOL_PRECISION, layer == 0, layer == num_layers - 1, is_fp32_dot,
            num_warps=8,
        )
    return out


def _use_triton(impl: str, device: torch.device) -> bool:
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown scoring impl {impl!r}")
    if impl == "triton" and not HAS_TRITON:
        raise ConfigError("--score-impl triton needs the triton package (pip install triton); use auto or torch")
    if impl == "triton" and device.type != "cuda" and not IS_INTERPRETED:
        raise ConfigError("--score-impl triton needs a CUDA device (or TRITON_INTERPRET=1); use auto or torch")
    return impl == "triton" or (impl == "auto" and HAS_TRITON and (device.type == "cuda" or IS_INTERPRETED))


def token_importance(
    queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int = 13, impl: str = "auto"
) -> torch.Tensor:
    """Dispatcher: importance [n] float32 for one prompt. impl: auto | torch | triton."""
    if not _use_triton(impl, queries.device):
        return importance_reference(queries, keys, pool)
    num_steps, n = queries.shape[2], keys[0].shape[1]
    cu_steps = torch.tensor([0, num_steps], dtype=torch.int32, device=queries.device)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=queries.device)
    return importance_triton(queries, cu_steps, keys, cu_seqlens, pool, n, num_steps)


def token_importance_packed(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor,
    pool: int = 13, impl: str = "auto",
) -> torch.Tensor:
    """Dispatcher for the packed layout: queries [L, H, S_total, D], keys L x [KVH, N_total, D].
    Returns [N_total] float32; no padding is scored."""
    if not _use_triton(impl, queries.device):
        return importance_reference_packed(queries, cu_steps, keys, cu_seqlens, pool)
    num_prompts = cu_seqlens.numel() - 1
    sizes = torch.cat([torch.diff(cu_seqlens), torch.diff(cu_steps)]).tolist()  # one small copy to the host
    max_len, max_steps = max(sizes[:num_prompts], default=0), max(sizes[num_prompts:], default=1)
    cu_steps, cu_seqlens = cu_steps.to(torch.int32), cu_seqlens.to(torch.int32)
    return importance_triton(queries, cu_steps, keys, cu_seqlens, pool, max_len, max_steps)
