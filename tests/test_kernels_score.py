"""spcli/kernels/score.py: the reference against brute force, the Triton kernel (`tri`) against the reference (`ref`).

On a machine without CUDA the kernel runs under Triton's CPU interpreter. Real speculator shapes
for comparison: SmolLM2-135M 30 layers, 9 heads, 3 KV heads, D=64; Llama-3.1-8B 32 layers,
32 heads, 8 KV heads, D=128; S = 1 + look-ahead (default 9).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from spcli.errors import ConfigError
from spcli.kernels import score as score_module

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
    """score.py with kernels this machine can run: compiled on CUDA, Triton's interpreter on CPU.

    Triton reads TRITON_INTERPRET when each @triton.jit function is decorated, its own tl.sum and
    tl.zeros included, so at import; other test modules may have imported triton at collection. On
    CPU, triton and score.py are imported afresh with the variable set, and the originals are put
    back afterwards, so neither the variable nor interpreted kernels leak into other test modules.
    """
    if DEVICE.type == "cuda" or not score_module.HAS_TRITON:
        yield score_module
        return
    with pytest.MonkeyPatch.context() as mp, _one_thread():
        mp.setenv("TRITON_INTERPRET", "1")
        saved = _unload_triton()
        yield importlib.reload(score_module)
    _unload_triton()
    sys.modules.update(saved)
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


def run_kernel(score, queries, keys, pool):
    """The launcher on one prompt, writing into a NaN-poisoned output so an unwritten element fails."""
    num_steps, n = queries.shape[2], keys[0].shape[1]
    cu_steps = torch.tensor([0, num_steps], dtype=torch.int32, device=DEVICE)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    out = torch.full((n,), math.nan, device=DEVICE)
    return score.importance_triton(queries, cu_steps, keys, cu_seqlens, pool, n, num_steps, out=out)


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


def brute_force(queries, keys, pool):
    """Loops over every (layer, head, step) row; pooling as an explicit window sum."""
    num_layers, num_heads, num_steps, head_dim = queries.shape
    n, group, halo = keys[0].shape[1], num_heads // keys[0].shape[0], pool // 2
    best = torch.zeros(num_steps, n, dtype=torch.float64)
    for l in range(num_layers):
        for h in range(num_heads):
            for s in range(num_steps):
                p = torch.softmax(keys[l][h // group].double() @ queries[l, h, s].double() / math.sqrt(head_dim), 0)
                pooled = torch.stack([p[max(0, i - halo) : i + halo + 1].sum() / pool for i in range(n)])
                best[s] = torch.maximum(best[s], pooled)
    return best.mean(0)


@pytest.mark.parametrize("pool", [1, 5, 13])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_reference_matches_brute_force_and_naive(n, pool):
    queries, keys = make_inputs(2, 6, 2, 3, n, 16, torch.float32)
    ref = score_module.importance_reference(queries, keys, pool)
    assert ref.dtype == torch.float32 and ref.shape == (n,)
    assert_close("brute force", brute_force(queries.cpu(), [k.cpu() for k in keys], pool), ref, 1e-7, 1e-5)
    assert_close("naive", score_module.importance_naive(queries, keys, pool), ref, 1e-8, 1e-6)


# --- the kernel ---------------------------------------------------------------------------------

SHAPES = [  # (n, head dim, steps, pool, dtype, layers): odd n around the 128-wide tiles
    *[(n, d, s, p, torch.bfloat16, 3) for n in (1, 31, 33) for d in (64, 128) for s in (1, 8) for p in (1, 13)],
    *[(1000, d, s, p, torch.bfloat16, 2) for d, s, p in ((64, 8, 13), (128, 1, 13), (64, 1, 1), (128, 8, 1))],
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


# --- the dispatcher -----------------------------------------------------------------------------


def test_dispatcher_rejects_unknown_impl():
    queries, keys = make_inputs(1, 2, 1, 1, 5, 16, torch.float32)
    with pytest.raises(ValueError, match="unknown scoring impl 'cuda'"):
        score_module.token_importance(queries, keys, pool=3, impl="cuda")


def test_dispatcher_without_triton(monkeypatch):
    monkeypatch.setattr(score_module, "HAS_TRITON", False)
    queries, keys = make_inputs(1, 2, 1, 1, 5, 16, torch.float32)
    with pytest.raises(ConfigError, match="needs the triton package"):
        score_module.token_importance(queries, keys, pool=3, impl="triton")
    ref = score_module.importance_reference(queries, keys, 3)
    assert torch.equal(score_module.token_importance(queries, keys, pool=3, impl="auto"), ref)


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


# --- the kernel inside the real speculator pass ---------------------------------------------------


@pytest.mark.slow
def test_kept_indices_equal_between_torch_and_triton_on_smollm2(score, smollm2_dir, monkeypatch):
    """On the real SmolLM2 and real prompts, selection from the kernel's scores equals the reference's."""
    import json

    from spcli.config import ScoreConfig, SelectConfig
    from spcli.engine import speculate as speculate_module
    from spcli.engine.load import eos_token_ids, load_causal_lm, load_tokenizer
    from spcli.engine.select import select_tokens
    from spcli.engine.tokenize import tokenize
    from spcli.io.records import Record

    monkeypatch.setattr(speculate_module, "token_importance", score.token_importance)  # the (re)loaded kernels
    model = load_causal_lm(smollm2_dir, "float32", DEVICE).model
    tokenizer = load_tokenizer(smollm2_dir)
    eos = eos_token_ids(model, tokenizer)
    examples = Path(__file__).parent.parent / "examples" / "docs.jsonl"
    for line in examples.read_text().splitlines()[:2]:  # 936 and 1312 tokens
        row = json.loads(line)
        ids = tokenize(Record(0, 0, row["id"], messages=row["messages"]), tokenizer, 8000, "error")
        ref = speculate_module.speculate(model, ids, ScoreConfig(impl="torch"), eos, DEVICE).importance
        tri = speculate_module.speculate(model, ids, ScoreConfig(impl="triton"), eos, DEVICE).importance
        assert_close(f"importance {row['id']}", ref, tri, atol=1e-7, rtol=2e-5)
        for keep in (0.1, 0.3):
            assert select_tokens(ref, SelectConfig(keep=keep)).tolist() == select_tokens(tri, SelectConfig(keep=keep)).tolist()
