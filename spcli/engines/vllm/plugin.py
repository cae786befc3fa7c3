"""vLLM general plugin (entry point `vllm.general_plugins`: `spcli`): prefix caching that knows positions.

vLLM hashes a KV block by its token ids (chained over the blocks before it). A pruned request's kept tokens sit at
their original positions (worker/positions.py), so the same ids at other positions must not share a block. Without
this plugin every pruned request carries a `cache_salt` (driver/base_pass.py), which vLLM folds into its first
block's hash, so nothing of it is shared with any other kept set: not even a long system prompt every record keeps
whole. With it, vLLM's EngineCore process (which loads general plugins at start) adds to a block's hash the
positions its tokens run at, where they are not the block's natural ones (its indices in the request):

    natural p -> K[p] for p < m (kept prompt tokens), p + (n - m) for p >= m (generated)   (K ascending, m = len(K))

A block whose tokens all run at their natural positions holds the KV a plain prompt of the same ids would hold,
and hashes as that prompt's block: the protected head that every record keeps (the template, a system prompt) is
prefilled once and served from the cache to pruned and whole prompts alike. Every later block names its
positions, so a block is shared only by requests with the same ids at the same positions (a document group's
members, spcli.stages.share), and no salt is needed (driver/base_pass.py, where `is_active`).
"""

from __future__ import annotations

import hashlib
import os
from importlib.metadata import entry_points

import numpy as np

from spcli.engines.vllm.keys import HASH_POSITIONS_KEY, KEPT_KEY, LENGTH_KEY, REMAP_KEY

POSITIONS_KEY = "spcli_positions"  # the extra hash key's name
ENTRY_POINT = "spcli.engines.vllm.plugin:register"


def is_active() -> bool:
    """Whether vLLM's processes started from this one load the plugin: its entry point is installed (pyproject.toml)
    and VLLM_PLUGINS, where set, names it."""
    if not any(ep.name == "spcli" and ep.value == ENTRY_POINT for ep in entry_points(group="vllm.general_plugins")):
        return False
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is None or "spcli" in allowed.split(",")


def block_positions(kept: list[int], n: int, start: int, end: int) -> np.ndarray:
    """The positions natural indices start..end-1 of a pruned request run at (module docstring)."""
    m = len(kept)
    head = np.asarray(kept[start:min(end, m)], dtype=np.int64)
    tail = np.arange(max(start, m), end, dtype=np.int64) + (n - m)
    return np.concatenate([head, tail])


def positions_key(extra_args: dict | None, start: int, end: int) -> tuple[str, str] | None:
    """The extra hash key of a request's block start..end-1: None where it runs at its natural positions (a plain
    request, a pruned one's unpruned head, or one with the remap off), else the digest of its positions. (A test
    turns it off with HASH_POSITIONS_KEY False, to show what vLLM's own hashes would share.)"""
    if not extra_args or KEPT_KEY not in extra_args or not extra_args.get(REMAP_KEY, True):
        return None
    if not extra_args.get(HASH_POSITIONS_KEY, True):
        return None
    positions = block_positions(extra_args[KEPT_KEY], int(extra_args[LENGTH_KEY]), start, end)
    if np.array_equal(positions, np.arange(start, end)):
        return None
    return POSITIONS_KEY, hashlib.sha256(positions.tobytes()).hexdigest()[:32]


def register() -> None:
    """Wrap vLLM's block-hash extra keys (vllm.v1.core.kv_cache_utils, 0.32.0; block_pool's name for it, which
    reports KV cache events, too) with positions_key; idempotent."""
    from vllm.v1.core import block_pool, kv_cache_utils

    original = kv_cache_utils.generate_block_hash_extra_keys
    if getattr(original, "spcli_positions", False):
        return

    def extra_keys(request, start_token_idx: int, end_token_idx: int, start_mm_idx: int):
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, start_mm_idx)
        params = getattr(request, "sampling_params", None)
        key = positions_key(getattr(params, "extra_args", None), start_token_idx, end_token_idx)
        if key is not None:
            keys = (*(keys or ()), key)
        return keys, next_mm_idx

    extra_keys.spcli_positions = True
    kv_cache_utils.generate_block_hash_extra_keys = extra_keys
    block_pool.generate_block_hash_extra_keys = extra_keys
