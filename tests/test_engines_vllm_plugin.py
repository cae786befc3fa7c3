"""spcli's vLLM plugin (spcli/engines/vllm/plugin.py): which blocks of a pruned request name their positions in
vLLM's prefix-cache hash. The logic, without vLLM; tests/test_engines_vllm_run.py counts the cache hits on vLLM."""

from __future__ import annotations

import numpy as np

from spcli.engines.vllm import plugin
from spcli.engines.vllm.keys import HASH_POSITIONS_KEY, KEPT_KEY, LENGTH_KEY, REMAP_KEY


def test_a_block_runs_at_its_kept_positions_then_past_the_prompt():
    kept = [0, 1, 2, 3, 10, 11, 20]  # m = 7 of n = 30
    assert plugin.block_positions(kept, 30, 0, 4).tolist() == [0, 1, 2, 3]
    assert plugin.block_positions(kept, 30, 4, 8).tolist() == [10, 11, 20, 30]  # generated token 7 runs at 30
    assert plugin.block_positions(kept, 30, 8, 10).tolist() == [31, 32]


def test_only_blocks_off_their_natural_positions_are_keyed_and_by_those_positions():
    args = {KEPT_KEY: [*range(8), 12, 13, 14, 15], LENGTH_KEY: 40}  # a kept head of 8, then a gap
    assert plugin.positions_key(args, 0, 4) is None and plugin.positions_key(args, 4, 8) is None  # the head: plain
    key = plugin.positions_key(args, 8, 12)
    assert key is not None and key[0] == plugin.POSITIONS_KEY
    other = {KEPT_KEY: [*range(8), 16, 17, 18, 19], LENGTH_KEY: 40}  # the same head, other positions after it
    assert plugin.positions_key(other, 4, 8) is None and plugin.positions_key(other, 8, 12) != key
    assert plugin.positions_key({**args}, 8, 12) == key  # the same positions: the same key (a group's members)
    assert plugin.positions_key(None, 8, 12) is None and plugin.positions_key({"other": 1}, 8, 12) is None  # plain
    assert plugin.positions_key({**args, REMAP_KEY: False}, 8, 12) is None  # runs at natural positions
    assert plugin.positions_key({**args, HASH_POSITIONS_KEY: False}, 8, 12) is None  # the test switch
    np.testing.assert_array_equal(plugin.block_positions(args[KEPT_KEY], 40, 8, 12), [12, 13, 14, 15])


def test_the_plugin_is_active_where_installed_and_vllm_plugins_allows_it(monkeypatch):
    """spcli's entry point is installed with it (pyproject.toml; `make` installs spcli editable)."""
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert plugin.is_active()
    monkeypatch.setenv("VLLM_PLUGINS", "other,spcli")
    assert plugin.is_active()
    monkeypatch.setenv("VLLM_PLUGINS", "other")
    assert not plugin.is_active()
