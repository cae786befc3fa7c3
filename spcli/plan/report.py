"""`spcli plan`'s text: every number with the formula or the facts it comes from."""

from __future__ import annotations

from spcli.plan import memory
from spcli.plan.memory import GB
from spcli.plan.plan import Plan

RESERVE_TERMS = ("weights", "kv", "repeated_kv", "activations", "mask", "scoring", "context")


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<22} {value:>16}   {note}".rstrip()


def _gb(nbytes: int) -> str:
    return f"{nbytes / GB:.2f} GB"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n > 1 else "")


def _weights_note(p: Plan) -> str:
    base = p.base
    if p.quantization == "fp8" and not base.is_quantized:
        linear = sum(t.numel for t in base.tensors if t.is_layer_linear)
        return (f"{base.num_params / 1e9:.2f}e9 params: {linear / 1e9:.2f}e9 in the layers' matmuls at 1 B (fp8), "
                f"{(base.num_params - linear) / 1e9:.2f}e9 embeddings, LM head, norms at 2 B; / {_gpus(p.tp)}, norms on each")
    return (f"{base.num_params / 1e9:.3f}e9 params, {_gb(sum(t.nbytes for t in base.tensors))} as stored; "
            f"/ {_gpus(p.tp)}, norms on each")


def _memory_lines(p: Plan) -> list[str]:
    cfg, base, r = p.cfg, p.base, p.reserve
    total_gb = p.gpu_total_bytes / GB
    kv_dtype = "fp8" if cfg.kv_cache_dtype == "fp8" else p.dtype
    runtime = memory.VLLM_RUNTIME_BYTES
    if r is None:
        reserve = [_row("speculator reserve", "none", "keep 1.0: no speculator runs")]
        util_note = "vLLM's default"
    else:
        terms = ", ".join(f"{name} {getattr(r, name) / GB:.2f}" for name in RESERVE_TERMS if getattr(r, name))
        reserve = [_row("speculator reserve", _gb(r.total), f"{terms}; prompts up to {p.max_prompt_len} (--max-prompt-len), "
                        f"chunk {cfg.speculator_chunk}")]
        util_note = f"floor(100 x ({total_gb:.2f} - {r.total / GB:.2f}) / {total_gb:.2f}) / 100, at most 0.9; one value for every rank"
    kept = p.kept_tokens + cfg.max_tokens
    lines = [
        "memory per GPU (the same on every rank; spcli/plan/memory.py)",
        _row("base weights", _gb(p.base_weights), _weights_note(p)),
        *reserve,
        _row("gpu_memory_utilization", f"{p.gpu_memory_utilization:.2f}", util_note),
        _row("vLLM runtime", _gb(runtime), "activations, CUDA graphs, NCCL (an estimate, not measured)"),
        _row("KV cache", _gb(p.kv_bytes), f"{p.gpu_memory_utilization:.2f} x {total_gb:.2f} - {p.base_weights / GB:.2f} "
             f"- {runtime / GB:.2f}"),
        _row("KV per token", f"{p.kv_per_token:,} B", f"{base.num_layers} layers x 2 (K, V) x "
             f"{memory.kv_heads_per_gpu(base, p.tp)} KV heads x {base.head_dim} x {p.kv_bytes_per_element} B ({kv_dtype})"),
        _row("KV capacity", f"{p.kv_tokens:,} tokens", f"whole blocks of {memory.VLLM_BLOCK_SIZE}"),
        _row("prompts at once", f"{p.prompts_at_once}", f"at keep {cfg.keep:g}, {kept} tokens each; full prefill "
             f"{p.full_prompts_at_once} ({cfg.length + cfg.max_tokens} each)"),
        _row("longest max_model_len", f"{p.longest_max_model_len:,} tokens",
             "one request of it fits the KV cache beside the reserve"),
    ]
    if p.kv_tokens < p.max_model_len:
        lines.append(f"  DOES NOT FIT: max_model_len {p.max_model_len:,} > KV capacity {p.kv_tokens:,} tokens "
                     "(vLLM refuses to start): lower --max-model-len or the speculator's reserve")
    if r is not None and p.tp > 1:
        lines.append(f"  (the driver placement leaves the reserve unused on GPUs 1-{p.tp - 1}; with workers every GPU uses it)")
    return lines


def _limit_lines(p: Plan) -> list[str]:
    cfg, one = p.cfg, p.limits[0]
    lines = [
        f"TTFT speed-up limit from FLOPs ({cfg.batch} prompts; spcli/plan/flops.py)",
        _row("full prefill", f"{one.full_flops:.3e} FLOPs", f"{cfg.batch} x F_base({cfg.length})"),
        _row("pruned base", f"{one.pruned_flops:.3e} FLOPs",
             f"{cfg.batch} x F_base({p.kept_tokens}), kept tokens attend to kept tokens"),
        _row("speculator", f"{one.speculator_flops:.3e} FLOPs",
             f"{cfg.batch} x F_s({cfg.length}), {100 * one.speculator_flops / one.full_flops:.1f}% of full prefill"),
    ]
    for lim in p.limits:
        if lim.placement == "driver":
            how = f"full / (pruned + {p.tp} x speculator): it runs on GPU 0 alone" + (
                f" while {_gpus(p.tp - 1)} wait" if p.tp > 1 else "")
        elif p.tp > 1:
            how = (f"full / (pruned + {lim.speculator_wall_flops / one.speculator_flops:g} x speculator): "
                   f"each of {p.tp} ranks scores {-(-cfg.batch // p.tp)} of the {cfg.batch} prompts")
        else:
            how = "one rank: the same as driver"
        lines.append(_row(f"placement {lim.placement}", f"{lim.limit:.2f}x", how))
    return lines


def plan_lines(p: Plan) -> list[str]:
    cfg, base, spec, s = p.cfg, p.base, p.speculator, p.score
    spec_text = "none" if spec is None else (
        f"{p.speculator_name} ({spec.num_layers} layers loaded, {spec.source}); look-ahead {s.lookahead}, "
        f"window {s.window}, layers {s.score_layers}")
    lines = [
        f"base        {cfg.model} ({base.num_layers} layers, {base.source}), {p.dtype}"
        + (f"/{p.quantization}" if p.quantization else "") + f", tp {p.tp}",
        f"speculator  {spec_text}",
        f"GPUs        {p.tp} x {cfg.gpu_memory_gib:g} GiB = {p.gpu_total_bytes / GB:.2f} GB each (GB = 10^9 B)",
        f"prompts     {cfg.batch} x {cfg.length} tokens, keep {cfg.keep:g}: {p.kept_tokens} kept + {cfg.max_tokens} "
        f"generated = {p.kept_tokens + cfg.max_tokens} KV tokens each; max_model_len {p.max_model_len}",
        "",
        *_memory_lines(p),
    ]
    return lines + ["", *_limit_lines(p)] if p.limits else lines
