"""The haystack side of the built-in tasks: words to make names and things from, and putting needles at depths in a text."""

from __future__ import annotations

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
