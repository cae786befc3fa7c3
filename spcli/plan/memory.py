"""Per-GPU memory of a vLLM base with a speculator beside it: pure functions of the model shapes.

`speculator_share` is what the vLLM engine calls to set `gpu_memory_utilization`; `spcli plan`
prints the same numbers. GB = 10^9 B, GiB = 2^30 B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from spcli.config.scoring import MASK_ELEMENTS, SPECULATOR_BATCH_TOKENS, SPECULATOR_CHUNK, ScoreConfig
from spcli.errors import ConfigError
from spcli.plan.shapes import ModelShape

GB = 10**9
GiB = 1 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's own default, used when the GPU is not shared
MIN_GPU_MEMORY_UTILIZATION = 0.1
CONTEXT_BYTES = 1 * GiB  # the speculator process's CUDA context and allocator slack
VLLM_RUNTIME_BYTES = 3 * GB  # vLLM's activations, CUDA graphs and NCCL buffers per GPU: an estimate, not measured
VLLM_BLOCK_SIZE = 16  # tokens per KV-cache block
KV_CACHE_BYTES = {"fp8": 1}  # --kv-cache-dtype; "auto" = the base's dtype


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    """vLLM splits the KV heads over the ranks; with fewer heads than ranks each rank holds a copy of one."""
    return max(1, shape.num_kv_heads // tp)


def base_weight_bytes_per_gpu(shape: ModelShape, tp: int, quantization: str | None) -> int:
    """Weights one rank holds: every tensor's stored bytes, split over tp ranks, except the 1-D ones
    (norms), which every rank holds whole; k_proj/v_proj are split by KV heads (copied when KVH < tp).

        W_gpu = sum_matrices(bytes) / tp + sum_norms(bytes)

    quantization "fp8" on a checkpoint not stored quantized (vLLM quantizes while loading): each
    decoder layer's projection counts 1 B per weight; embeddings, LM head and norms keep their dtype.
    A checkpoint stored quantized counts what its headers say (its scales included).
    """
    quantize = quantization == "fp8" and not shape.is_quantized
    total = 0
    for t in shape.tensors:
        nbytes = t.numel if quantize and t.is_layer_linear else t.nbytes
        if "norm" in t.name:  # input_layernorm, post_attention_layernorm, model.norm
            total += nbytes * tp
        elif t.name.endswith(("k_proj.weight", "v_proj.weight")):
            total += nbytes * kv_heads_per_gpu(shape, tp) * tp // shape.num_kv_heads
        else:
            total += nbytes
    return total // tp


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int, kv_cache_bytes: int) -> int:
    """L layers x 2 (K and V) x KV heads per GPU x D x bytes per element."""
    return shape.num_layers * 2 * kv_heads_per_gpu(shape, tp) * shape.head_dim * kv_cache_bytes


@dataclass(frozen=True)
class Reserve:
    """The speculator's bytes on one GPU, term by term (`speculator_reserve`)."""

    weights: int
    kv: int
    repeated_kv: int
    queries: int
    activations: int
    mask: int
    scoring: int
    context: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def layers_run(shape: ModelShape, score: ScoreConfig) -> int:
    """Layers the speculator runs: all of them with look-ahead (it decodes), else up to the last scored one."""
    return shape.num_layers if score.lookahead else score.layers(shape.num_layers)[-1] + 1


def batched_chunk_tokens(num_tokens: int, chunk: int, min_prompt: int = 1) -> int:
    """Tokens one speculator forward holds in flight for prompts of min_prompt .. N = num_tokens tokens.

    speculate.prefill runs `chunk` columns across all B rows of a group at once, and a group holds up to
    T_b = SPECULATOR_BATCH_TOKENS padded tokens (spcli/stages/prepare.py; a longer prompt goes alone). Rows of
    width w: B(w) = max(1, T_b // w) of them, min(C, w) columns each, so

        c = max over min_prompt <= w <= N of  B(w) * min(C, w)

    (about T_b where prompts of C tokens or fewer can be batched: many short prompts fill one group whole),
    not min(C, N), which counts one row.
    """

    lo, hi = max(1, min(min_prompt, num_tokens)), num_tokens
    widths = range(lo, min(hi, SPECULATOR_BATCH_TOKENS) + 1)  # w > T_b goes alone: min(C, w) <= min(C, N)
    return max([min(chunk, hi), *(max(1, SPECULATOR_BATCH_TOKENS // w) * min(chunk, w) for w in widths)])


def speculator_reserve(shape: ModelShape, num_tokens: int, score: ScoreConfig, dtype_bytes: int,
                       chunk: int = SPECULATOR_CHUNK, min_prompt: int = 1) -> Reserve:
    """GPU bytes the speculator (`shape`: the layers it loads; `score` resolved) holds for prompts of
    min_prompt .. N = num_tokens tokens (N: --max-prompt-len), prefilled C = chunk columns per forward.

    T = max(N, SPECULATOR_BATCH_TOKENS) padded tokens of one batched pass, c = batched_chunk_tokens(N, C)
    of them in flight (C columns across all the group's rows), L_r layers run (`layers_run`), S scored
    layers, R = W + A query rows (W window rows, A look-ahead), b bytes per element:

        W      = P * b                                weights (P parameters of the layers loaded)
        KV     = 2 * L_r * KVH * D * (T + A) * b      the cache: later chunks (and the look-ahead) attend to it; a
                                                      single pass (one chunk) fills the same DynamicCache layer by
                                                      layer as it runs, so it holds as much before early exit drops it
        REP    = 2 * H * D * T * b                    one layer's K, V repeated to every query head (sdpa with a mask)
        Q      = S * H * R * D * b                    the scored query rows
        ACT    = c * (3 * I + 4 * h) * b              one decoder layer's peak: 3 MLP intermediates, 4 hidden-size tensors
        MASK   = min(c * T, M) * (1 + b)              one block of a chunk's attention mask (M = MASK_ELEMENTS,
                                                      spcli/models/capture.py): booleans and sdpa's additive copy
        SC     = 2 * H * R * N * 4                    scoring: one layer's softmax and its pooled copy, fp32
        CTX    = 1 GiB                                the CUDA context and allocator slack
        reserve = W + KV + REP + Q + ACT + MASK + SC + CTX

    Activations scale with c, the cache with N: the prompt cap is --max-prompt-len (default the base's
    positions), not the base's max_model_len (which bounds kept + generated tokens only).
    Llama-3.1-8B in bf16 at N = 32768, C = 8192, the paper's recipe (A = 8, every layer, R = 9): c = 32768
    (four 8192-token prompts in one group), 16.06 + 4.30 + 0.54 + 0.00 + 3.89 + 0.05 + 0.08 + 1.07 = 25.99 GB.
    """

    n, b = num_tokens, dtype_bytes
    t = max(n, SPECULATOR_BATCH_TOKENS)
    c = batched_chunk_tokens(n, chunk, min_prompt)
    a = score.lookahead or 0
    rows = score.num_prompt_rows + a
    scored = len(score.layers(shape.num_layers))
    kvh, d, h = shape.num_kv_heads, shape.head_dim, shape.num_heads
    return Reserve(
        weights=shape.num_params * b, kv=2 * layers_run(shape, score) * kvh * d * (t + a) * b, repeated_kv=2 * h * d * t * b if h > kvh else 0,
        queries=scored * h * rows * d * b, activations=c * (3 * shape.intermediate_size + 4 * shape.hidden_size) * b,
        mask=min(c * t, MASK_ELEMENTS) * (1 + b), scoring=2 * h * rows * n * 4, context=CONTEXT_BYTES,
    )


def gpu_memory_utilization(total_bytes: int, reserve_bytes: int) -> float:
    """vLLM's share of each GPU when a speculator shares it (one value for every rank):

        gpu_memory_utilization = min(0.9, floor(100 * (T - reserve) / T) / 100)

    T = the GPU's total memory. vLLM takes that fraction of T for weights, activations and KV
    cache on every rank; the speculator lives in the rest.
    """
    share = math.floor(100 * (total_bytes - reserve_bytes) / total_bytes) / 100
    if share < MIN_GPU_MEMORY_UTILIZATION:
        raise ConfigError(
            f"the speculator needs {reserve_bytes / GiB:.1f} GiB of the GPU's {total_bytes / GiB:.1f} GiB, "
            "leaving too little for the base model: lower --max-prompt-len (it bounds the speculator's "
            "prompt) or --speculator-chunk, or use a smaller speculator"
        )
    return min(DEFAULT_GPU_MEMORY_UTILIZATION, share)


def prompt_len_within(free_bytes: int, shape: ModelShape, score: ScoreConfig, dtype_bytes: int, chunk: int,
                      upper: int) -> int:
    """The longest prompt (<= upper) whose speculator reserve fits in free_bytes, 0 where none does: what a
    replica can take beside vLLM, measured (`torch.cuda.mem_get_info` in each worker once vLLM is up) rather
    than planned (the reserve holds more as prompts grow, so this is a bisection)."""
    fits = lambda n: speculator_reserve(shape, n, score, dtype_bytes, chunk).total <= free_bytes
    if fits(upper):
        return upper
    lo, hi = 0, upper  # fits(lo) assumed (0: nothing), fits(hi) false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def measured_prompt_len(free_bytes: int, planned: int, shape: ModelShape, score: ScoreConfig, dtype_bytes: int,
                        chunk: int) -> tuple[int, str | None]:
    """(the speculator's prompt bound, a note saying why it is lower than planned or None): `planned` where the
    reserve for it fits in what vLLM left free on every GPU, else the longest prompt that fits (longer ones become
    error rows instead of running out of memory beside vLLM's steps). None fits: ConfigError."""
    fits = prompt_len_within(free_bytes, shape, score, dtype_bytes, chunk, planned)
    if fits == planned:
        return planned, None
    need = speculator_reserve(shape, planned, score, dtype_bytes, chunk).total
    what = (f"vLLM left {free_bytes / GiB:.2f} GiB free on a GPU where the speculator's reserve for {planned}-token "
            f"prompts is {need / GiB:.2f} GiB")
    if fits == 0:
        raise ConfigError(f"{what}: no prompt fits; lower --gpu-memory-utilization or --speculator-chunk, or free "
                          "the GPU of other processes")
    return fits, (f"{what}: the speculator takes prompts up to {fits} tokens (longer ones become error rows naming "
                  "--max-prompt-len; lower --gpu-memory-utilization to give it more)")


@dataclass(frozen=True)
class SpeculatorShare:
    reserve: Reserve
    gpu_memory_utilization: float


def speculator_share(speculator: ModelShape, score: ScoreConfig, max_prompt_len: int, chunk: int,
                     gpu_total_bytes: int, dtype_bytes: int, min_prompt: int = 1) -> SpeculatorShare:
    """The engine's entry point, placement workers: one speculator replica on every GPU, sized for
    prompts up to max_prompt_len (--max-prompt-len) prefilled `chunk` columns at a time; the same
    utilization on every rank. (Placement driver reserves the same on GPU 0, and vLLM takes that
    utilization on every rank too.)"""
    reserve = speculator_reserve(speculator, max_prompt_len, score, dtype_bytes, chunk, min_prompt)
    return SpeculatorShare(reserve, gpu_memory_utilization(gpu_total_bytes, reserve.total))


def kv_cache_bytes_per_gpu(gpu_total_bytes: int, utilization: float, weights_per_gpu: int) -> int:
    """What vLLM has left for the KV cache: utilization * T - weights - runtime (activations, graphs, NCCL)."""
    return int(utilization * gpu_total_bytes) - weights_per_gpu - VLLM_RUNTIME_BYTES


def kv_capacity_tokens(kv_bytes: int, kv_per_token: int) -> int:
    """Whole blocks of VLLM_BLOCK_SIZE tokens that fit in kv_bytes (0 when nothing fits)."""
    return max(0, kv_bytes // (kv_per_token * VLLM_BLOCK_SIZE)) * VLLM_BLOCK_SIZE


PROMPT_LEN_STEP = 1024  # the default --max-prompt-len is searched in steps of this


def kv_tokens_beside(reserve_bytes: int, total_bytes: int, weights_per_gpu: int, kv_per_token: int) -> int:
    """KV capacity per GPU (tokens) with a speculator reserve of reserve_bytes; 0 where vLLM gets too little."""
    try:
        util = gpu_memory_utilization(total_bytes, reserve_bytes)
    except ConfigError:
        return 0
    return kv_capacity_tokens(kv_cache_bytes_per_gpu(total_bytes, util, weights_per_gpu), kv_per_token)


def default_prompt_len(max_positions: int, max_model_len: int, kv_tokens_for) -> int:
    """The default --max-prompt-len: the base's positions where a reserve sized for them still leaves vLLM the KV
    cache for one request of max_model_len (else vLLM refuses to start); otherwise the longest multiple of
    PROMPT_LEN_STEP that does (0: none). kv_tokens_for(n): the KV capacity with the reserve sized for n tokens,
    which falls as n grows."""
    fits = lambda n: kv_tokens_for(n) >= max_model_len
    if fits(max_positions):
        return max_positions
    lo, hi = 0, max_positions // PROMPT_LEN_STEP  # fits(lo * STEP) assumed, fits(hi * STEP) unknown
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * PROMPT_LEN_STEP) else (lo, mid - 1)
    return lo * PROMPT_LEN_STEP
