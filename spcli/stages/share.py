"""Several questions about one document: a group's records share what the base prefills of the document.

A group (the records of one document: wherever they stand in a shard under --groups shard, spcli.io.group_order;
one after another under --groups consecutive, spcli.io.groups) whose members are all pruned at one keep shares
the longest token prefix of their prompts, `L` tokens (the document in its template; each record's own tokens
after it are its question). Each question selects from its own importance, as a record alone does; the group
keeps the union of their selections inside the shared part, `U`, and every question keeps all of its own tokens
after it (DESIGN.md, "Several questions about one document"). With --group-rule document, U is instead one
selection of the shared part at the group's keep, from all the questions' scores together. So a question's answer
depends on its own text and, through U, on the other questions of its group; never on batches, windows, workers or
resume points. The base then prefills U once per group (vLLM: its prefix cache, whose block hashes name U's
positions; hf: one KV cache copied per question).

Whether sharing pays is judged for the group as a whole, against full prefill with the document prefilled once
(prefix caching): before the speculator runs, with the union at its smallest (one question's target), and again
once U is known; a group that does not pay keeps every token, and the base still prefills its document once.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

import torch

from spcli.config.scoring import AUTO, ScoreConfig, SelectConfig
from spcli.io.groups import assign
from spcli.plan.flops import prefill_flops, speculator_flops
from spcli.stages.request import PrunedRequest
from spcli.stages.select import is_pruned, num_forced, select_tokens, target


# What a group did with each of its records (PrunedRequest.sharing, then Record.sharing): the run's end counts them
# (spcli.job.batch.sharing_line). "together": pruned with its group; "whole: ...": its group prefilled whole, the
# document once (prefix caching), and why; "alone: ...": a record run alone, and why ("one question": its document's
# only record in the shard, which could share with none); "error": an error row (the rest of its group stays grouped).
SHARING = {
    "whole: short": "the document is under --min-tokens",
    "whole: pays": "pruning would not pay (--max-prune-cost)",
    "whole: keep": "nothing to prune at its keep",
    "alone: one question": "the only record of its document",
    "alone: no key": "no group key (no prompt text, one message, or no --group-field value)",
    "alone: keeps differ": "its document's records ask for different keeps",
    "alone: speculator tokenizer": "its speculator reads another tokenizer's tokens",
    "alone: restated": "its instruction is restated for the speculator (--restate)",
    "alone: no common prefix": "its document's prompts share no token prefix",
    "alone: short prefix": "the shared part is under --min-tokens (--groups consecutive)",
    "alone: own part long": "the shared part is under --min-tokens and its own part has more to drop than it keeps alone",
    "alone: rest pruned alone": "its short document's other records have long own parts and were pruned alone",
    "alone: error in group": "an error row in its group (--groups consecutive)",
    "alone: speculator error": "the speculator failed on a record of its group",
}


@dataclass
class Group:
    """Requests of one document, by index into a window's requests."""

    members: list[int]  # indices of its requests, in read order
    name: str  # the group's first record's id (--groups shard: the least id of its members)
    shared_len: int  # L: tokens every member's prompt starts with
    is_shared: bool = True  # pruned together (False: every token kept, the document still prefilled once)
    rule: str = "union"  # --group-rule: union (unite) or document (unite_document)
    whole: str | None = None  # why it keeps every token ("short", "pays", "keep": SHARING)


def shared_len(prompts: list[list[int]]) -> int:
    """The longest common token prefix of `prompts`."""
    return len(os.path.commonprefix(prompts))


def find_groups(records: list, requests: list, group_max: int | None, select: SelectConfig,
                rule: str = "union", order_free: bool = False) -> list[Group]:
    """The groups of a window whose members are requests of one keep, not across tokenizers or restated (those stay
    alone). --groups shard (`order_free`): an error row leaves the rest of its group grouped, and a document under
    --min-tokens is a group kept whole (prefilled once) but for the records whose own parts are long enough to prune
    alone (has_long_own; a lone record left of it runs alone too); --groups consecutive: an error row, or a shared prefix under
    select.min_tokens, leaves every record of its group alone. Each request's `sharing` says which (SHARING)."""
    if group_max is None:
        return []
    found = []
    for members in assign(records, group_max):
        good = [i for i in members if isinstance(requests[i], PrunedRequest)]
        for i in members:
            if not isinstance(requests[i], PrunedRequest):
                records[i].sharing = "error"
        alone = lambda why: [setattr(requests[i], "sharing", why) for i in good]
        if len(members) < 2:
            alone("alone: one question" if records[members[0]].group_key is not None else "alone: no key")
            continue
        if len(good) < len(members) and not order_free:
            alone("alone: error in group")
            continue
        if len(good) < 2:
            alone("alone: one question")
            continue
        reqs = [requests[i] for i in good]
        if len({str(r.keep) for r in reqs}) > 1:
            alone("alone: keeps differ")
            continue
        if any(r.speculator_ids is not None for r in reqs) or any(r.restated for r in reqs):
            alone("alone: speculator tokenizer" if reqs[0].speculator_ids is not None else "alone: restated")
            continue
        n = shared_len([r.token_ids for r in reqs])
        name = min(records[i].id for i in good) if order_free else records[good[0]].id
        if n >= select.min_tokens:
            found.append(Group(good, name, n, rule=rule))
        elif not order_free:
            alone("alone: short prefix")
        elif n == 0:
            alone("alone: no common prefix")
        else:  # a short document: prefilled once, whole, but for records with long own parts
            short = [i for i in good if not has_long_own(requests[i], n, select)]
            for i in good:
                if i not in short:
                    requests[i].sharing = "alone: own part long"
            if len(short) > 1:
                found.append(Group(short, min(records[i].id for i in short), n, is_shared=False, rule=rule,
                                   whole="short"))
            elif short:
                requests[short[0]].sharing = "alone: rest pruned alone"
    return found


def has_long_own(req: PrunedRequest, num_shared: int, select: SelectConfig) -> bool:
    """Whether a record of a group whose shared part (num_shared tokens) is under --min-tokens is pruned alone rather
    than prefilled whole with its group: selection would prune it alone (is_pruned: at least --min-tokens, its target
    below its length) and its own part, the tokens after the shared part that selection may drop (not protected),
    outnumbers that target (at keep auto: keep_min's). Such a record alone drops some of its own tokens whatever it
    scores; prefilled whole with the group it would spare only the short shared part. A record whose own part is short
    (a question after a short document) or protected (its instruction field) keeps about as much alone as with the
    group, which prefills the document once and runs no speculator."""
    n, keep = req.num_prompt_tokens, req.keep
    if not is_pruned(n, select, keep):
        return False
    free = n - num_shared if req.protected is None else int((~req.protected[num_shared:]).sum())
    return free > target(n, select, select.keep_min if keep == AUTO else keep, num_forced(n, select))


def group_cost(pair, score: ScoreConfig, num_shared: int, own: list[int], num_kept_shared: int) -> float:
    """FLOPs of a shared group (the speculator over the document once and each question's own tokens: speculate_shared,
    wherever it runs; the base over the kept shared part once and each question's own tokens) over full prefill of the
    document once plus the questions."""
    base, spec = pair
    full = prefill_flops(base, num_shared + sum(own))
    spent = speculator_flops(spec, num_shared + sum(own), score) + prefill_flops(base, num_kept_shared + sum(own))
    return spent / full


def group_pays(pair, score: ScoreConfig, select: SelectConfig, group: Group, requests: list[PrunedRequest],
               num_kept_shared: int | None = None) -> bool:
    """Whether pruning the group beats its full prefill with the document prefilled once; before scoring
    (num_kept_shared None) with the union at its smallest, one question's target."""
    reqs = [requests[i] for i in group.members]
    keep = reqs[0].keep
    if keep == AUTO or not is_pruned(group.shared_len, select, keep):
        return keep == AUTO
    if pair is None or math.isinf(select.max_prune_cost):
        return True
    if num_kept_shared is None:
        num_kept_shared = min(group.shared_len, target(group.shared_len, select, keep, num_forced(group.shared_len, select)))
    own = [r.num_prompt_tokens - group.shared_len for r in reqs]
    return group_cost(pair, score, group.shared_len, own, num_kept_shared) < select.max_prune_cost


def unite(group: Group, requests: list[PrunedRequest]) -> int:
    """Every member keeps the union of the members' kept positions inside the shared part, then all of its own
    tokens; returns the union's size."""
    reqs = [requests[i] for i in group.members]
    n = group.shared_len
    union = torch.unique(torch.cat([r.kept[r.kept < n] for r in reqs]))  # sorted
    for r in reqs:
        r.kept = torch.cat([union, torch.arange(n, r.num_prompt_tokens)])
    return int(union.numel())


def unite_document(group: Group, requests: list[PrunedRequest], select: SelectConfig, rows: str) -> int:
    """--group-rule document: one selection of the shared part at the group's keep, from the questions' importance
    over it taken together as their query rows would be (`rows` max: the largest, mean: the mean; exact at pool 1),
    with the first member's units, protected and forced tokens there; every member keeps it, then all of its own
    tokens. Returns its size."""
    reqs = [requests[i] for i in group.members]
    n = group.shared_len

    def together(name: str) -> torch.Tensor | None:
        parts = [getattr(r, name) for r in reqs]
        if parts[0] is None:
            return None
        stacked = torch.stack([t[:n].float() for t in parts])  # [Q, n]
        return stacked.amax(dim=0) if rows == "max" else stacked.mean(dim=0)

    first = reqs[0]
    cut = lambda t: None if t is None else t[:n]
    kept = select_tokens(together("importance"), select, first.keep, cut(first.forced), together("unpooled"),
                         cut(first.units), cut(first.protected))
    for r in reqs:
        r.kept = torch.cat([kept, torch.arange(n, r.num_prompt_tokens)])
    return int(kept.numel())


def keep_whole(group: Group, requests: list[PrunedRequest], why: str = "pays") -> None:
    group.is_shared = False
    group.whole = group.whole or why
    for i in group.members:
        requests[i].kept = torch.arange(requests[i].num_prompt_tokens)


def mark(group: Group, requests: list[PrunedRequest]) -> None:
    """The group's name, size and shared part on each member (the output row's group columns, the base pass)."""
    kept_shared = int((requests[group.members[0]].kept < group.shared_len).sum())
    for i in group.members:
        r = requests[i]
        r.group, r.group_size, r.shared_len, r.shared_kept = group.name, len(group.members), group.shared_len, kept_shared
        r.sharing, r.leads = ("together" if group.is_shared else f"whole: {group.whole or 'pays'}"), i == group.members[0]


def shared_salt(req: PrunedRequest) -> str:
    """A prefix-cache salt naming the group's kept shared positions: every member of the group hits the same
    cached blocks; no other kept set (or a whole prompt) does. Sent only where spcli's vLLM plugin, whose block hashes
    name positions, is not loaded (spcli/engines/vllm/plugin.py)."""
    digest = hashlib.sha256(req.kept[: req.shared_kept].numpy().astype("int64").tobytes())
    return f"spcli-shared:{req.shared_len}:{digest.hexdigest()[:32]}"
