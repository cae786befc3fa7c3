"""Token importance from speculator attention (Speculative Prefill, arXiv:2502.02789, Sec. 3).

For one prompt of n tokens, L layers, H query heads sharing KVH key heads (GQA), S query rows (all
post-RoPE) and head dim D. Row s sees the keys [0, limit[s]) only, 1 <= limit[s] <= n:

    logit[l, h, s, i] = q[l, h, s] . K[l, h // (H / KVH), i] / sqrt(D)      for i < limit[s], else -inf
    p[l, h, s, :]  = softmax(logit[l, h, s, :])                               over the n prompt keys, fp32
    p'[l, h, s, :] = avgpool(p[l, h, s, :], kernel=pool, stride=1, zero padding counted)  same length n
    importance[i]  = mean_s max_{l, h} p'[l, h, s, i]      rows="mean" (the paper's)
                   = max_s  max_{l, h} p'[l, h, s, i]      rows="max": a token one row attends to strongly counts

Rows: an observation window (the last W prompt tokens' queries, row of prompt position t has limit
t + 1; SnapKV, GemFilter) and look-ahead tokens (the paper's rows, limit n). row_limits=None: every
row sees all n keys.

The reference streams over layers, so it never holds more than one layer's [H, S, n]. The Triton
kernels (spcli/kernels/score_triton.py) never hold more than a [S, n] running max. The dispatchers
run the kernels on CUDA (or under TRITON_INTERPRET=1), else the reference; impl="auto" also takes the
reference, with one warning per process, where the kernels fail to compile or launch.

Packed layout (several prompts in one call): prompt b owns key positions
cu_seqlens[b]:cu_seqlens[b+1] and query rows cu_steps[b]:cu_steps[b+1], both int [B+1]; its
row_limits (int [S_total]) count from its own first key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from spcli.config.scoring import ROWS
from spcli.errors import ConfigError
from spcli.kernels.score_triton import HAS_TRITON, IS_INTERPRETED, importance_triton

log = logging.getLogger("spcli")
# Process-wide on purpose: a run that cannot launch the kernel warns once, not once per prompt.
_FALLBACK_WARNED = threading.Event()


def smooth(probs: torch.Tensor, pool: int) -> torch.Tensor:
    """Average-pool along the last axis, stride 1, same length; padding zeros are counted."""
    if pool == 1:
        return probs
    assert pool % 2 == 1, "pool must be odd"
    shape = probs.shape
    flat = probs.reshape(-1, 1, shape[-1])  # [rows, 1, n]
    out = F.avg_pool1d(flat, kernel_size=pool, stride=1, padding=pool // 2, count_include_pad=True)
    return out.reshape(shape)


def layer_probs(query: torch.Tensor, key: torch.Tensor, row_limits: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q.K^T/sqrt(D)) of one layer in fp32, row s over keys [0, row_limits[s]) only.

    query: [H, S, D]; key: [KVH, n, D] (H divisible by KVH); row_limits: int [S] or None (all n).
    Returns [H, S, n] float32, exactly 0 beyond each row's limit.
    """
    num_heads, num_steps, head_dim = query.shape
    num_kv_heads, n, _ = key.shape
    group = num_heads // num_kv_heads
    assert group * num_kv_heads == num_heads, "query heads must be a multiple of key heads"
    q = query.float().reshape(num_kv_heads, group * num_steps, head_dim)  # [KVH, G*S, D]
    logits = torch.bmm(q, key.float().transpose(1, 2)) * head_dim**-0.5  # [KVH, G*S, n]
    logits = logits.reshape(num_heads, num_steps, n)
    if row_limits is not None:
        beyond = torch.arange(n, device=logits.device) >= row_limits.to(logits.device)[:, None]  # [S, n]
        logits = logits.masked_fill(beyond, float("-inf"))
    return torch.softmax(logits, dim=-1)


def check_row_limits(row_limits: torch.Tensor, num_keys: torch.Tensor) -> None:
    """row_limits, num_keys: int [S] (num_keys: the keys of each row's prompt). Needs 1 <= limit <= n."""
    assert not row_limits.is_floating_point() and row_limits.shape == num_keys.shape, "row_limits: int [S]"
    bad = (row_limits < 1) | (row_limits > num_keys.to(row_limits.device))
    assert not bool(bad.any()), f"row limits must lie in [1, n]: {row_limits[bad][:4].tolist()} ..."


def reduce_rows(best: torch.Tensor, rows: str) -> torch.Tensor:
    """best: [..., S, n], the max over layers and heads per row -> [..., n], the mean or max over the rows."""
    assert rows in ROWS, f"rows must be one of {ROWS}, got {rows!r}"
    return best.mean(dim=-2) if rows == "mean" else best.amax(dim=-2)


def importance_reference(
    queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int, row_limits: torch.Tensor | None = None,
    rows: str = "mean",
) -> torch.Tensor:
    """Reference importance for one prompt.

    queries: [L, H, S, D] query rows per layer; keys: L tensors [KVH, n, D] (views into a cache are
    fine); row_limits: int [S] or None; rows: mean | max over the rows. Returns [n] float32.
    """
    num_layers, _, num_steps, _ = queries.shape
    assert len(keys) == num_layers, f"{len(keys)} key layers for {num_layers} query layers"
    n = keys[0].shape[1]
    if row_limits is not None:
        check_row_limits(row_limits, torch.full((num_steps,), n))
    best = torch.zeros(num_steps, n, dtype=torch.float32, device=queries.device)  # [S, n]
    for layer in range(num_layers):
        probs = smooth(layer_probs(queries[layer], keys[layer], row_limits), pool)  # [H, S, n]
        best = torch.maximum(best, probs.amax(dim=0))
    return reduce_rows(best, rows)


def importance_naive(
    queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int, row_limits: torch.Tensor | None = None,
    rows: str = "mean",
) -> torch.Tensor:
    """The materialising version (the paper's code path): builds [L, H, S, n] at once. Benchmarks only."""
    probs = torch.stack([layer_probs(queries[l], keys[l], row_limits) for l in range(len(keys))])  # [L, H, S, n]
    return reduce_rows(smooth(probs, pool).amax(dim=(0, 1)), rows)


def importance_reference_packed(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor, pool: int,
    row_limits: torch.Tensor | None = None, rows: str = "mean",
) -> torch.Tensor:
    """Reference for the packed layout: importance_reference on each prompt. Returns [N_total] float32."""
    steps, lens = cu_steps.tolist(), cu_seqlens.tolist()
    parts = [
        importance_reference(queries[:, :, steps[b] : steps[b + 1]], [k[:, lens[b] : lens[b + 1]] for k in keys], pool,
                             None if row_limits is None else row_limits[steps[b] : steps[b + 1]], rows)
        for b in range(len(lens) - 1)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=queries.device)


def _use_triton(impl: str, device: torch.device) -> bool:
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown scoring impl {impl!r}")
    if impl == "triton" and not HAS_TRITON:
        raise ConfigError("--score-impl triton needs the triton package (pip install triton); use auto or torch")
    if impl == "triton" and device.type != "cuda" and not IS_INTERPRETED:
        raise ConfigError("--score-impl triton needs a CUDA device (or TRITON_INTERPRET=1); use auto or torch")
    return impl == "triton" or (impl == "auto" and HAS_TRITON and (device.type == "cuda" or IS_INTERPRETED))


def _kernel_or_reference(impl: str, kernel: Callable[[], torch.Tensor],
                         reference: Callable[[], torch.Tensor]) -> torch.Tensor:
    """impl="triton": the kernel, errors raised. impl="auto": the reference where the kernel does not compile
    or launch (out of shared memory, an unsupported GPU or dtype), with one warning per process."""
    if impl == "triton":
        return kernel()
    try:
        return kernel()
    except torch.OutOfMemoryError:
        raise  # the reference needs more memory, not less
    except Exception as error:
        if not _FALLBACK_WARNED.is_set():
            _FALLBACK_WARNED.set()
            log.warning("the triton scoring kernel failed (%s: %s); scoring with the torch reference instead "
                        "(--score-impl torch skips the attempt, --score-impl triton shows the error)",
                        type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return reference()


def _int32(x: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if x is None else x.to(device=device, dtype=torch.int32).contiguous()


def token_importance(
    queries: torch.Tensor, keys: Sequence[torch.Tensor], pool: int = 13, impl: str = "auto",
    row_limits: torch.Tensor | None = None, rows: str = "mean",
) -> torch.Tensor:
    """Dispatcher: importance [n] float32 for one prompt. impl: auto | torch | triton; rows: mean | max.

    queries [L, H, S, D]; keys L x [KVH, n, D] (any strides, contiguous D); row_limits int [S] or None."""
    def reference() -> torch.Tensor:
        return importance_reference(queries, keys, pool, row_limits, rows)

    if not _use_triton(impl, queries.device):
        return reference()
    num_steps, n = queries.shape[2], keys[0].shape[1]
    limits = _int32(row_limits, queries.device)
    if limits is not None:
        check_row_limits(limits, torch.full((num_steps,), n, device=queries.device))
    cu_steps = torch.tensor([0, num_steps], dtype=torch.int32, device=queries.device)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=queries.device)
    return _kernel_or_reference(
        impl, lambda: importance_triton(queries, cu_steps, keys, cu_seqlens, pool, n, num_steps, limits, rows=rows),
        reference)


def token_importance_packed(
    queries: torch.Tensor, cu_steps: torch.Tensor, keys: Sequence[torch.Tensor], cu_seqlens: torch.Tensor,
    pool: int = 13, impl: str = "auto", row_limits: torch.Tensor | None = None, rows: str = "mean",
) -> torch.Tensor:
    """Dispatcher for the packed layout: queries [L, H, S_total, D], keys L x [KVH, N_total, D], row_limits
    int [S_total] (each relative to its prompt's first key) or None. Returns [N_total] float32; no padding
    is scored."""
    def reference() -> torch.Tensor:
        return importance_reference_packed(queries, cu_steps, keys, cu_seqlens, pool, row_limits, rows)

    if not _use_triton(impl, queries.device):
        return reference()
    num_prompts = cu_seqlens.numel() - 1
    lens, steps = torch.diff(cu_seqlens), torch.diff(cu_steps)
    sizes = torch.cat([lens, steps]).tolist()  # one small copy to the host
    max_len, max_steps = max(sizes[:num_prompts], default=0), max(sizes[num_prompts:], default=1)
    cu_steps32, cu_seqlens32 = _int32(cu_steps, queries.device), _int32(cu_seqlens, queries.device)
    limits = _int32(row_limits, queries.device)
    if limits is not None:
        check_row_limits(limits, torch.repeat_interleave(lens, steps).to(queries.device))
    return _kernel_or_reference(
        impl,
        lambda: importance_triton(queries, cu_steps32, keys, cu_seqlens32, pool, max_len, max_steps, limits,
                                  rows=rows),
        reference,
    )
