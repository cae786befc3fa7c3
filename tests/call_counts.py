"""Counting how often spcli's resolving functions run: each is wrapped where any spcli module holds it (its own
module and every `from ... import` of it), and still does what it did. Used by test_models_resolved.py and test_engines_vllm_run.py."""

from __future__ import annotations

import collections
import sys

import pytest

RESOLVERS = {  # what a run resolves once (spcli/models/resolved.py): name -> (module, attribute)
    "locate": ("spcli.models.lookup", "locate"),
    "default_speculator": ("spcli.models.lookup", "default_speculator"),
    "pick_device": ("spcli.models.device", "pick_device"),
    "resolve_dtype": ("spcli.models.dtype", "resolve_dtype"),
    "score_defaults": ("spcli.models.profiles", "score_defaults"),
}


def count_resolvers(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """A Counter of calls per RESOLVERS name, from now until the monkeypatch is undone."""
    import importlib

    counts: collections.Counter = collections.Counter()
    for name, (module, attr) in RESOLVERS.items():
        original = getattr(importlib.import_module(module), attr)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        for mod in [m for key, m in sys.modules.items() if key == "spcli" or key.startswith("spcli.")]:
            if getattr(mod, attr, None) is original:
                monkeypatch.setattr(mod, attr, counted)
    return counts
