"""`spcli plan`'s text: every number with the formula or the facts it comes from."""

from __future__ import annotations

from spcli.plan import memory
from spcli.plan.memory import GB
from spcli.plan.plan import Plan


def _gb(nbytes: int) -> str:
    return f"{nbytes / GB:.2f} GB"


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n > 1 else "")


def _weights_note(p: Plan) -> str:
    base = p.base
    if p.quantization == "fp8" and not base.is_quantized:
        linear = sum(t.numel for t in base.tensors if t.is_layer_linear)
        return (f"{base.num_params / 1e9:.2f}e9 params: {linear / 1e9:.2f}e9 in the decoder layers' matmuls at 1 B (fp8), "
                f"{(base.num_params - linear) / 1e9:.2f}e9 embeddings, LM head, norms at 2 B; / {_gpus(p.tp)} (norms on each)")
    total = sum(t.nbytes for t in base.tensors)
    return f"{base.num_params / 1e9:.3f}e9 params, {_gb(total)} as stored; / {_gpus(p.tp)} (norms on each)"


def _reserve_lines(p: Plan) -> list[str]:
    if p.reserve is None:
        return ["  speculator reserve     none (keep 1.0: no speculator runs)"]
    r = p.reserve
    terms = ", ".join(f"{name} {getattr(r, name) / GB:.2f}" for name in
                      ("weights", "kv", "repeated_kv", "activations", "mask", "scoring", "context") if getattr(r, name))
    return [f"  speculator reserve     {_gb(r.total)}   {terms} (spcli/plan/memory.py: speculator_reserve); "
            f"prompts up to {p.max_model_len}, chunk {p.cfg.speculator_chunk}"]


def plan_lines(p: Plan) -> list[str]:
    cfg, base, spec = p.cfg, p.base, p.speculator
    total_gb = p.gpu_total_bytes / GB
    kv_dtype = "fp8" if cfg.kv_cache_dtype == "fp8" else p.dtype
    s = p.score
    spec_text = "none" if spec is None else (
        f"{p.speculator_name} ({spec.num_layers} layers loaded, {spec.source}); look-ahead {s.lookahead}, "
        f"window {s.window}, layers {s.score_layers}")
    lines = [
        f"base        {cfg.model} ({base.num_layers} layers, {base.source}), {p.dtype}"
        + (f"/{p.quantization}" if p.quantization else "") + f", tp {p.tp}",
        f"speculator  {spec_text}",
        f"GPUs        {p.tp} x {cfg.gpu_memory_gib:g} GiB = {total_gb:.2f} GB each (GB = 10^9 B)",
        f"prompts     {cfg.batch} x {cfg.length} tokens, keep {cfg.keep:g}: {p.kept_tokens} kept + {cfg.max_tokens} "
        f"generated = {p.kept_tokens + cfg.max_tokens} KV tokens each; max_model_len {p.max_model_len}",
        "",
        "memory per GPU (the same on every rank)",
        f"  base weights           {_gb(p.base_weights)}   {_weights_note(p)}",
        *_reserve_lines(p),
        f"  gpu_memory_utilization {p.gpu_memory_utilization:.2f}      "
        + (f"floor(100 x ({total_gb:.2f} - {p.reserve.total / GB:.2f}) / {total_gb:.2f}) / 100, at most 0.9; "
           "one value for every rank" if p.reserve else "vLLM's default"),
        f"  vLLM runtime           {_gb(memory.VLLM_RUNTIME_BYTES)}    activations, CUDA graphs, NCCL (an estimate, not measured)",
        f"  KV cache               {_gb(p.kv_bytes)}   {p.gpu_memory_utilization:.2f} x {total_gb:.2f} - "
        f"{p.base_weights / GB:.2f} - {memory.VLLM_RUNTIME_BYTES / GB:.2f}",
        f"  KV per token           {p.kv_per_token:,} B   {base.num_layers} layers x 2 (K, V) x "
        f"{memory.kv_heads_per_gpu(base, p.tp)} KV heads x {base.head_dim} x {p.kv_bytes_per_element} B ({kv_dtype})",
        f"  KV capacity            {p.kv_tokens:,} tokens",
        f"  prompts at once        {p.prompts_at_once} at keep {cfg.keep:g} ({p.kept_tokens + cfg.max_tokens} tokens each); "
        f"full prefill {p.full_prompts_at_once} ({cfg.length + cfg.max_tokens} each)",
        f"  longest max_model_len  {p.longest_max_model_len:,} tokens (one request of it fits the KV cache, the reserve "
        "sized for it)",
    ]
    if p.reserve is not None and p.tp > 1:
        lines.append(f"  (the driver placement leaves the reserve unused on GPUs 1-{p.tp - 1}; with workers every GPU uses it)")
    if not p.limits:
        return lines
    one = p.limits[0]
    lines += [
        "",
        f"TTFT speed-up limit from FLOPs ({cfg.batch} prompts; spcli/plan/flops.py)",
        f"  full prefill           {one.full_flops:.3e} FLOPs   {cfg.batch} x F_base({cfg.length})",
        f"  pruned base            {one.pruned_flops:.3e} FLOPs   {cfg.batch} x F_base({p.kept_tokens}), kept tokens "
        "attend to kept tokens",
        f"  speculator             {one.speculator_flops:.3e} FLOPs   {cfg.batch} x F_s({cfg.length}), "
        f"{100 * one.speculator_flops / one.full_flops:.1f}% of full prefill",
    ]
    for lim in p.limits:
        if lim.placement == "driver":
            how = f"full / (pruned + {p.tp} x speculator): it runs on GPU 0 alone" + (
                f" while {_gpus(p.tp - 1)} wait" if p.tp > 1 else "")
        else:
            how = (f"full / (pruned + {lim.speculator_wall_flops / one.speculator_flops:g} x speculator): "
                   f"each of {p.tp} ranks scores {-(-cfg.batch // p.tp)} of the {cfg.batch} prompts" if p.tp > 1
                   else "one rank: the same as driver")
        lines.append(f"  placement {lim.placement:<8} {lim.limit:.2f}x   {how}")
    return lines
