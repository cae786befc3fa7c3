"""The speculator as a replica in each of vLLM's workers: what to load, each rank's share, what comes back.

`--speculator-placement workers` (the default on `--engine vllm`): every vLLM worker (one per GPU)
loads the speculator once on its own device and scores its share of a batch's pruned prompts with
the same `speculate_grouped` the hf engine runs (prepare.py: a document's questions go to one rank, which reads the
document once); importance comes back to the driver,
where selection stays. Nothing here imports vLLM: the worker method (vllm_worker.py) and the driver
(vllm_engine.py) call these functions, and their logic is tested on the CPU without vLLM.

Shares are balanced by tokens, longest prompt first (LPT): each prompt goes to the rank with the
fewest tokens so far, so the slowest rank holds at most the mean plus one prompt.

What crosses the RPC is plain data (vLLM's msgpack carries no custom objects): token ids as lists,
the score configuration as a dict, importance as float32 bytes.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig
from spcli.errors import RecordError
from spcli.models.load import SpeculatorSource
from spcli.stages.share import shared_len
from spcli.stages.speculate import Speculation


def balance(lengths: list[int], num_ranks: int) -> list[list[int]]:
    """Prompt indices per rank: longest first, each to the rank with the fewest tokens so far (ties: the
    lowest rank). Every index appears exactly once."""
    shares: list[list[int]] = [[] for _ in range(num_ranks)]
    tokens = [0] * num_ranks
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(num_ranks), key=lambda r: (tokens[r], r))
        shares[rank].append(i)
        tokens[rank] += lengths[i]
    return shares


def balance_groups(prompts: list[list[int]], groups: list[list[int]],
                   num_ranks: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """balance() with each group (indices into prompts: one document's questions) kept whole on one rank, weighed by
    the tokens its speculator reads (the shared prefix once, then each question's own); (prompt indices per rank,
    per rank the groups as indices into its share)."""
    grouped = {i for g in groups for i in g}
    items = [list(g) for g in groups] + [[i] for i in range(len(prompts)) if i not in grouped]
    weights = [len(prompts[item[0]]) if len(item) == 1  # a prompt alone: no prefix to share
               else sum(len(prompts[i]) for i in item) - (len(item) - 1) * shared_len([prompts[i] for i in item])
               for item in items]
    shares, share_groups = [], []
    for rank_items in balance(weights, num_ranks):
        share = [i for k in rank_items for i in items[k]]
        at = {i: j for j, i in enumerate(share)}
        shares.append(share)
        share_groups.append([[at[i] for i in items[k]] for k in rank_items if len(items[k]) > 1])
    return shares, share_groups


class Replica:
    """One worker's speculator, loaded on first use and kept until another source is asked for."""

    def __init__(self, device: torch.device):
        self.device = device
        self.source: SpeculatorSource | None = None
        self.model: nn.Module | None = None

    def speculate(self, source: dict, prompts: list[list[int]], score: dict, eos_ids: list[int],
                  chunk: int = SPECULATOR_CHUNK, with_unpooled: bool = False, groups: list[list[int]] = ()) -> dict:
        """Score this rank's prompts, each of `groups` (indices into them) reading its document once; {"wall_s",
        "results": one encoded Speculation or error per prompt}."""
        from spcli.stages.prepare import speculate_grouped

        t0 = time.perf_counter()
        wanted = SpeculatorSource(**source)
        if wanted != self.source:
            self.model, self.source = None, None
            self.model, self.source = wanted.load(self.device), wanted
        specs = (speculate_grouped(self.model, prompts, [list(g) for g in groups], ScoreConfig(**score), set(eos_ids),
                                   self.device, chunk, with_unpooled=with_unpooled, release_cache=False)
                 if prompts else [])
        return {"wall_s": time.perf_counter() - t0, "results": [encode(s) for s in specs]}


def encode(spec: Speculation | RecordError) -> dict:
    if isinstance(spec, RecordError):
        return {"error": str(spec)}
    return {"importance": _bytes(spec.importance), "rows": spec.num_query_rows,
            "lookahead": list(spec.lookahead_ids), "speculate_s": spec.speculate_s,
            "unpooled": None if spec.unpooled is None else _bytes(spec.unpooled)}


def _bytes(x: torch.Tensor) -> bytes:
    return x.numpy().astype(np.float32).tobytes()


def _tensor(raw: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())  # [n]


def decode(item: dict) -> Speculation | RecordError:
    if "error" in item:
        return RecordError(item["error"])
    unpooled = item.get("unpooled")
    return Speculation(_tensor(item["importance"]), int(item["rows"]), list(item["lookahead"]),
                       float(item["speculate_s"]), None if unpooled is None else _tensor(unpooled))


def gather(shares: list[list[int]], replies: list[dict], num_prompts: int, wall_s: float) -> list[Speculation | RecordError]:
    """Per prompt, in the driver's order, the rank's reply; each row's speculate_s scaled so that the
    slowest rank's rows add up to the driver's wall time of the call (transfers included)."""
    slowest = max((r["wall_s"] for r in replies), default=0.0)
    scale = wall_s / slowest if slowest > 0 else 1.0
    out: list[Speculation | RecordError | None] = [None] * num_prompts
    for share, reply in zip(shares, replies, strict=True):
        assert len(reply["results"]) == len(share), "one result per prompt of the share"
        for i, item in zip(share, reply["results"]):
            spec = decode(item)
            if isinstance(spec, Speculation):
                spec.speculate_s *= scale
            out[i] = spec
    assert all(s is not None for s in out), "every prompt was in one share"
    return out
