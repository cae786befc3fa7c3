"""spcli/kernels/score.py: the reference against brute force, and the dispatcher (auto, fallback).

Also the helpers of tests/test_kernels_score_triton.py (the kernel `tri` against the reference `ref`):
on a machine without CUDA the kernel runs under Triton's CPU interpreter (the `score` fixture). Real
speculator shapes for comparison: SmolLM2-135M 30 layers, 9 heads, 3 KV heads, D=64; Llama-3.1-8B
32 layers, 32 heads, 8 KV heads, D=128; Llama-3.1-405B 128 heads, 8 KV heads; S = W window rows +
look-ahead (W = 32 and 8 in issue 11; the paper: 1 + 8).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import math
import os
import sys
import threading

import pytest
import torch

from spcli.errors import ConfigError
from spcli.kernels import score as score_module
from spcli.kernels import score_triton as score_triton_module

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    not score_module.HAS_TRITON, reason="triton cannot be imported: pip install triton==3.7.1 to run the kernel tests"
)

# (atol, rtol) per input dtype; scores are probabilities ~1/n, the kernel accumulates in fp32 like the reference
TOLERANCES = {torch.float32: (1e-7, 2e-5), torch.bfloat16: (1e-7, 1e-4), torch.float16: (1e-7, 1e-4)}


def _unload_triton() -> dict:
    """Drop triton's Python modules (its C extension stays loaded) so that the next import re-reads the env."""
    names = [k for k in sys.modules if k.split(".")[0] == "triton" and not k.startswith("triton._C")]
    return {k: sys.modules.pop(k) for k in names}


def _openblas_threads():
    """(get, set) for the thread count of the OpenBLAS that numpy loaded, or None where there is none."""
    if not os.path.exists("/proc/self/maps"):
        return None
    paths = {line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line}
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "")):
            get, set_ = (getattr(lib, f"{prefix}_{op}_num_threads{suffix}", None) for op in ("get", "set"))
            if get and set_:
                return get, set_
    return None


@contextlib.contextmanager
def _one_thread():
    """The interpreter's tl.dot is np.matmul: on a busy 2-core machine, OpenBLAS and torch threads spinning
    against each other made every small matmul cost milliseconds (the file took minutes instead of seconds)."""
    blas, num_torch = _openblas_threads(), torch.get_num_threads()
    num_blas = blas[0]() if blas else None
    torch.set_num_threads(1)
    if blas:
        blas[1](1)
    try:
        yield
    finally:
        torch.set_num_threads(num_torch)
        if blas:
            blas[1](num_blas)


@pytest.fixture(scope="module")
def score():
    """score.py (and score_triton.py) with kernels this machine can run: compiled on CUDA, Triton's interpreter on CPU.

    Triton reads TRITON_INTERPRET when each @triton.jit function is decorated, its own tl.sum and
    tl.zeros included, so at import; other test modules may have imported triton at collection. On
    CPU, triton, score_triton.py and score.py are imported afresh with the variable set, and the originals are put
    back afterwards, so neither the variable nor interpreted kernels leak into other test modules.
    """
    if DEVICE.type == "cuda" or not score_module.HAS_TRITON:
        yield score_module
        return
    with pytest.MonkeyPatch.context() as mp, _one_thread():
        mp.setenv("TRITON_INTERPRET", "1")
        saved = _unload_triton()
        importlib.reload(score_triton_module)
        yield importlib.reload(score_module)
    _unload_triton()
    sys.modules.update(saved)
    importlib.reload(score_triton_module)
    importlib.reload(score_module)


def assert_close(name: str, ref: torch.Tensor, tri: torch.Tensor, atol: float, rtol: float) -> None:
    assert ref.shape == tri.shape, f"{name}: shape {tuple(tri.shape)} != {tuple(ref.shape)}"
    ref, tri = ref.double().cpu(), tri.double().cpu()
    err = (ref - tri).abs().nan_to_num(math.inf)  # an unwritten (NaN) element is the worst
    excess = err - (atol + rtol * ref.abs())
    if err.numel() == 0:
        return
    i = int(excess.argmax())
    worst = f"{name}: worst [{i}] ref={ref[i]:.6e} tri={tri[i]:.6e} abs={err[i]:.3e} rel={err[i] / ref[i].abs():.3e}"
    print(worst)
    assert excess[i] <= 0, f"{worst} beyond atol={atol} rtol={rtol}"


def make_inputs(num_layers, num_heads, num_kv_heads, num_steps, n, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # x2 on the queries: peaked softmax rows, so max over heads and pooling both matter
    queries = 2 * torch.randn(num_layers, num_heads, num_steps, head_dim, generator=gen)  # [L, H, S, D]
    keys = [torch.randn(num_kv_heads, n, head_dim, generator=gen) for _ in range(num_layers)]  # L x [KVH, n, D]
    return queries.to(DEVICE, dtype), [k.to(DEVICE, dtype) for k in keys]


def window_limits(n, window, lookahead):
    """Row limits int32 [S]: the last max(1, min(window, n)) prompt tokens (row of position t sees t + 1 keys),
    then `lookahead` rows that see all n."""
    rows = max(1, min(window, n))
    return torch.tensor([*range(n - rows + 1, n + 1), *[n] * lookahead], dtype=torch.int32, device=DEVICE)


# --- the reference ------------------------------------------------------------------------------


def test_reference_by_hand():
    # one layer, 2 query heads on 1 key head, D=4 (scale 1/2), 2 steps, n=3, pool 3
    log2, log3 = math.log(2), math.log(3)
    keys = [torch.tensor([[[0.0, 0, 0, 0], [log2, 0, 0, 0], [log3, 0, 0, 0]]])]  # [1, 3, 4]
    queries = torch.zeros(1, 2, 2, 4)
    queries[0, 0, 0, 0] = 2.0  # logits 0, ln2, ln3 -> p = [1, 2, 3] / 6 -> pooled [1/6, 1/3, 5/18]
    queries[0, 0, 1, 0] = -2.0  # p = [6, 3, 2] / 11 -> pooled [9/33, 1/3, 5/33]
    # head 1 queries are 0: uniform p = 1/3 -> pooled [2/9, 1/3, 2/9] at both steps
    step0 = torch.tensor([2 / 9, 1 / 3, 5 / 18])
    step1 = torch.tensor([9 / 33, 1 / 3, 2 / 9])
    expected = (step0 + step1) / 2
    assert_close("hand", expected, score_module.importance_reference(queries, keys, pool=3), 1e-7, 1e-6)
    assert_close("hand pool 1", torch.tensor([(1 / 3 + 6 / 11) / 2, 1 / 3, (1 / 2 + 1 / 3) / 2]),
                 score_module.importance_reference(queries, keys, pool=1), 1e-7, 1e-6)
    # step 0 sees keys [0, 2): head 0 p = [1, 2, 0] / 3, head 1 [1/2, 1/2, 0]; step 1 sees only key 0: p = [1, 0, 0]
    limited = torch.tensor([(1 / 2 + 1) / 2, (2 / 3 + 0) / 2, 0.0])
    assert_close("hand limits", limited, score_module.importance_reference(queries, keys, 1, torch.tensor([2, 1])),
                 1e-7, 1e-6)
    # rows="max": per token the larger of the two steps' maxima over heads
    assert_close("hand rows max", torch.maximum(step0, step1),
                 score_module.importance_reference(queries, keys, pool=3, rows="max"), 1e-7, 1e-6)
    assert_close("hand rows max, limits", torch.tensor([1.0, 2 / 3, 0.0]),
                 score_module.importance_reference(queries, keys, 1, torch.tensor([2, 1]), rows="max"), 1e-7, 1e-6)


def brute_force(queries, keys, pool, row_limits=None, rows="mean"):
    """Loops over every (layer, head, step) row: logits beyond the row's limit are -inf; pooling is an explicit
    window sum; rows: the mean or the max over steps."""
    num_layers, num_heads, num_steps, head_dim = queries.shape
    n, group, halo = keys[0].shape[1], num_heads // keys[0].shape[0], pool // 2
    limits = [n] * num_steps if row_limits is None else row_limits.tolist()
    best = torch.zeros(num_steps, n, dtype=torch.float64)
    for l in range(num_layers):
        for h in range(num_heads):
            for s in range(num_steps):
                logits = keys[l][h // group].double() @ queries[l, h, s].double() / math.sqrt(head_dim)  # [n]
                logits[limits[s]:] = -math.inf
                p = torch.softmax(logits, 0)
                pooled = torch.stack([p[max(0, i - halo) : i + halo + 1].sum() / pool for i in range(n)])
                best[s] = torch.maximum(best[s], pooled)
    return best.mean(0) if rows == "mean" else best.amax(0)


@pytest.mark.parametrize("pool", [1, 5, 13])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_reference_matches_brute_force_and_naive(n, pool):
    queries, keys = make_inputs(2, 6, 2, 3, n, 16, torch.float32)
    ref = score_module.importance_reference(queries, keys, pool)
    assert ref.dtype == torch.float32 and ref.shape == (n,)
    assert_close("brute force", brute_force(queries.cpu(), [k.cpu() for k in keys], pool), ref, 1e-7, 1e-5)
    assert_close("naive", score_module.importance_naive(queries, keys, pool), ref, 1e-8, 1e-6)


@pytest.mark.parametrize("rows", ["mean", "max"])
@pytest.mark.parametrize("pool", [1, 13])
@pytest.mark.parametrize("n, window, lookahead", [(1, 1, 0), (7, 3, 2), (40, 17, 0), (40, 40, 3), (41, 64, 1)])
def test_reference_with_row_limits_matches_brute_force(n, window, lookahead, pool, rows):
    limits = window_limits(n, window, lookahead)
    queries, keys = make_inputs(2, 6, 2, limits.numel(), n, 16, torch.float32, seed=n + window)
    ref = score_module.importance_reference(queries, keys, pool, row_limits=limits, rows=rows)
    expected = brute_force(queries.cpu(), [k.cpu() for k in keys], pool, limits.cpu(), rows)
    assert_close(f"brute force W={window} rows={rows}", expected, ref, 1e-7, 1e-5)
    assert_close("naive", score_module.importance_naive(queries, keys, pool, limits, rows), ref, 1e-8, 1e-6)


def test_reference_rows_max_differs_from_mean_and_packs():
    lens, steps = [40, 7], [5, 3]
    queries, keys = make_inputs(2, 6, 2, sum(steps), sum(lens), 16, torch.float32, seed=9)
    cu_steps, cu_seqlens = torch.tensor([0, 5, 8]), torch.tensor([0, 40, 47])
    mean = score_module.importance_reference_packed(queries, cu_steps, keys, cu_seqlens, 5)
    best = score_module.importance_reference_packed(queries, cu_steps, keys, cu_seqlens, 5, rows="max")
    assert (best >= mean - 1e-7).all() and not torch.allclose(best, mean)  # a max is at least the mean
    one = score_module.token_importance(queries[:, :, :5], [k[:, :40] for k in keys], pool=5, impl="torch",
                                        rows="max")
    assert torch.equal(one, best[:40])
    with pytest.raises(AssertionError, match="rows must be one of"):
        score_module.importance_reference(queries, keys, 5, rows="median")


def test_reference_row_limits_cut_exactly():
    queries, keys = make_inputs(1, 4, 2, 3, 10, 16, torch.float32)
    probs = score_module.layer_probs(queries[0], keys[0], torch.tensor([1, 4, 10]))  # [H, S, n]
    assert (probs[:, 0, 1:] == 0).all() and (probs[:, 0, 0] == 1).all() and (probs[:, 1, 4:] == 0).all()
    assert (probs[:, 2] > 0).all()
    full = torch.full((3,), 10)
    assert torch.equal(score_module.importance_reference(queries, keys, 5, full),
                       score_module.importance_reference(queries, keys, 5))
    with pytest.raises(AssertionError, match=r"row limits must lie in \[1, n\]"):
        score_module.importance_reference(queries, keys, 5, torch.tensor([0, 4, 10]))
    with pytest.raises(AssertionError, match=r"row limits must lie in \[1, n\]"):
        score_module.importance_reference(queries, keys, 5, torch.tensor([1, 4, 11]))


# --- the dispatcher -----------------------------------------------------------------------------


def test_dispatcher_rejects_unknown_impl():
    queries, keys = make_inputs(1, 2, 1, 1, 5, 16, torch.float32)
    with pytest.raises(ValueError, match="unknown scoring impl 'cuda'"):
        score_module.token_importance(queries, keys, pool=3, impl="cuda")


def test_dispatcher_without_triton(monkeypatch):
    monkeypatch.setattr(score_module, "HAS_TRITON", False)
    queries, keys = make_inputs(1, 2, 1, 2, 5, 16, torch.float32)
    with pytest.raises(ConfigError, match="needs the triton package"):
        score_module.token_importance(queries, keys, pool=3, impl="triton")
    limits = torch.tensor([4, 5])
    ref = score_module.importance_reference(queries, keys, 3, limits)
    assert torch.equal(score_module.token_importance(queries, keys, pool=3, impl="auto", row_limits=limits), ref)


@needs_triton
def test_dispatcher_auto_picks_kernel_on_cuda_or_interpreter(score, monkeypatch):
    calls = []
    monkeypatch.setattr(score, "importance_triton", lambda *args, **kw: calls.append(1) or torch.zeros(5))
    queries, keys = make_inputs(1, 2, 1, 1, 5, 16, torch.float32)
    score.token_importance(queries, keys, pool=3, impl="auto")
    assert calls == [1]  # under this module's fixture: CUDA, or TRITON_INTERPRET=1
    score.token_importance(queries, keys, pool=3, impl="torch")
    assert calls == [1]
    if DEVICE.type == "cpu":
        monkeypatch.setattr(score, "IS_INTERPRETED", False)
        score.token_importance(queries, keys, pool=3, impl="auto")
        assert calls == [1]  # plain CPU: the reference
        with pytest.raises(ConfigError, match="needs a CUDA device"):
            score.token_importance(queries, keys, pool=3, impl="triton")


@pytest.fixture()
def spcli_warnings(monkeypatch):
    """The warnings logged on the "spcli" logger, with the once-per-process fallback flag reset."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("spcli")
    logger.addHandler(handler)
    monkeypatch.setattr(score_module, "_FALLBACK_WARNED", threading.Event())
    yield records
    logger.removeHandler(handler)


@needs_triton
def test_auto_falls_back_to_reference_with_one_warning(score, spcli_warnings, monkeypatch):
    # float64: a dtype the kernel really refuses
    queries, keys = make_inputs(2, 4, 2, 3, 20, 16, torch.float64)
    limits = window_limits(20, 2, 1)
    ref = score.importance_reference(queries, keys, 5, limits)
    with pytest.raises(TypeError, match="takes float32, bfloat16 or float16"):
        score.token_importance(queries, keys, pool=5, impl="triton", row_limits=limits)
    assert torch.equal(score.token_importance(queries, keys, pool=5, impl="auto", row_limits=limits), ref)
    cu = torch.tensor([0, 3], device=DEVICE), torch.tensor([0, 20], device=DEVICE)
    packed = score.token_importance_packed(queries, cu[0], keys, cu[1], pool=5, impl="auto", row_limits=limits)
    assert torch.equal(packed, ref)
    # a launch failure (as out of shared memory on a small GPU) after the first: no second warning
    def fail(*args, **kw):
        raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")

    monkeypatch.setattr(score, "importance_triton", fail)
    queries, keys = make_inputs(2, 4, 2, 3, 20, 16, torch.float32)
    ref = score.importance_reference(queries, keys, 5, limits)
    assert torch.equal(score.token_importance(queries, keys, pool=5, impl="auto", row_limits=limits), ref)
    with pytest.raises(RuntimeError, match="out of resource"):
        score.token_importance(queries, keys, pool=5, impl="triton", row_limits=limits)
    assert len(spcli_warnings) == 1, [r.getMessage() for r in spcli_warnings]
    message = spcli_warnings[0].getMessage()
    assert message.startswith("the triton scoring kernel failed (TypeError: the triton scoring kernel takes")
    assert "scoring with the torch reference instead" in message


@needs_triton
def test_auto_does_not_hide_out_of_memory(score, spcli_warnings, monkeypatch):
    def oom(*args, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(score, "importance_triton", oom)
    queries, keys = make_inputs(1, 2, 1, 1, 5, 16, torch.float32)
    with pytest.raises(torch.OutOfMemoryError):
        score.token_importance(queries, keys, pool=3, impl="auto")
    assert spcli_warnings == []
