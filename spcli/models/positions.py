"""Which position schemes pruning can keep: kept tokens prefill at their original positions (refused before anything loads)."""

from __future__ import annotations

from spcli.errors import ConfigError


def rope_type(config) -> str | None:
    """config.json's RoPE scaling type (`rope_parameters`, or the older `rope_scaling`), None without one."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, key, None)
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")):
            return str(rope.get("rope_type") or rope.get("type"))
    return None


def uses_alibi(config) -> bool:
    """ALiBi position biases (BLOOM, MPT, Falcon with alibi): no RoPE at all."""
    attn = getattr(config, "attn_config", None)
    attn_alibi = attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False)
    return getattr(config, "model_type", None) == "bloom" or bool(getattr(config, "alibi", False)) or bool(attn_alibi)


def check_position_scheme(config, name: str, role: str) -> None:
    """Refuse positions the speculator's scoring cannot reproduce: longrope switches its RoPE factors by sequence
    length (a kept-token prefill would rotate by other factors than the full prompt), and ALiBi biases attention by
    distance in the sequence, not by position id (kept tokens at their original positions would sit closer)."""
    if rope_type(config) == "longrope":
        raise ConfigError(f"{role} {name!r} uses longrope (config.json rope type 'longrope'): its RoPE factors "
                          "depend on the sequence length, so attention scores and kept-position prefill would use "
                          "other rotations than the full prompt's. Use a model with plain or llama3/yarn RoPE, or --keep 1.0")
    if uses_alibi(config):
        raise ConfigError(f"{role} {name!r} uses ALiBi position biases: they follow the distance in the packed "
                          "sequence, not the position ids, so kept tokens cannot keep their original positions. "
                          "Use a RoPE model, or --keep 1.0")


def sliding_window(config, max_prompt_tokens: int) -> tuple[int, str] | None:
    """(window, the config.json field that sets it) where a prompt of up to `max_prompt_tokens` can exceed a
    sliding attention window some layer uses; None for full attention (or a window no prompt exceeds)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and "sliding_attention" not in layer_types:
        return None
    if max_prompt_tokens <= window:
        return None  # every prompt fits in the window
    return window, "sliding_window" + (" (layer_types has sliding_attention layers)" if isinstance(layer_types, list) else "")


def check_positions(config, max_prompt_tokens: int, name: str, role: str, window_why: str) -> None:
    """Refuse a model whose positions pruning cannot keep: a position scheme (check_position_scheme), or a sliding
    window a prompt of up to `max_prompt_tokens` can exceed; `window_why` says what that window would do to it."""
    check_position_scheme(config, name, role)
    found = sliding_window(config, max_prompt_tokens)
    if found is None:
        return
    window, field = found
    raise ConfigError(f"{role} {name!r} uses sliding-window attention (config.json {field} = {window} < the "
                      f"{max_prompt_tokens} positions a prompt may have): {window_why.format(window=window)}")


def check_full_attention(config, max_prompt_tokens: int, name: str, role: str) -> None:
    """A speculator's cache must hold all n keys of every layer: refuse a sliding-window model (Mistral,
    Gemma 2/3), whose cache keeps only the last window, unless no prompt can exceed that window; and a position
    scheme scoring cannot reproduce (check_position_scheme)."""
    check_positions(config, max_prompt_tokens, name, role,
                    "its cache keeps only the last {window} keys, so scoring would see the wrong tokens. Use a "
                    "full-attention speculator (--speculator NAME|FOLDER) or --keep 1.0")


def check_base_positions(config, max_prompt_tokens: int, name: str) -> None:
    """The base prefills the kept tokens at their original positions: refuse what cannot (issue 40), on either
    engine and before anything loads. longrope and ALiBi as for a speculator (check_position_scheme); a sliding
    window counts kept tokens, not positions (vLLM's and transformers' windows are over the cache), so a pruned
    prompt would attend over a wider span of the document than its full prefill does."""
    check_positions(config, max_prompt_tokens, name, "base model",
                    "its window counts the kept tokens, not their positions, so a pruned prompt would attend further "
                    "back than the full prompt does. Use a full-attention base model, or --keep 1.0 (no pruning)")
