"""Document groups: records that share a document, fixed by the input alone.

This module is the consecutive rule (`--groups consecutive`, and what `--groups auto` resumes a directory made
before `--groups shard` with); the default finds a document's records wherever they stand in their shard
(spcli.io.group_order), and marks each record's group on it (`group_id`), which `same_group` then follows.

A record's group key is `--group-field`'s value where one is named; otherwise (`--groups auto`) a digest of its
prompt-field text, or of its messages but the last, as read before its instruction is put beside it. Consecutive
records of one shard with equal keys form a group, at most `--group-max` records (a longer run is cut into groups
at every row that is a multiple of it, so the cut is the input's, not a batch's, and a reader finds a group's
start by reading back at most group_max - 1 rows). A record's output may
depend on its group's other records (their questions choose what of the shared document is kept: DESIGN.md,
"Several questions about one document"), never on batches, windows, workers, tasks or resume points: readers
take whole groups (`take`), and a resume point is always a group edge, since parts commit whole batches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

from spcli.config.run import GROUP_MAX



def text_key(value) -> str:
    """A short digest of a prompt text, or of a list of messages."""
    # ASCII JSON escapes what UTF-8 cannot carry (a lone surrogate), so every text has a key
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def group_key(obj: dict, prompt_field: str, messages_field: str, group_field: str | None) -> str | None:
    """The key a raw record (a JSON object or Parquet row, before its instruction is placed) is grouped by."""
    if group_field is not None:
        value = obj.get(group_field)
        return None if value is None else f"field:{value}"
    prompt = obj.get(prompt_field)
    if isinstance(prompt, str):
        return "text:" + text_key(prompt)
    messages = obj.get(messages_field)
    if isinstance(messages, list) and len(messages) > 1:
        return "messages:" + text_key(messages[:-1])
    return None



def assign(records: list, group_max: int = GROUP_MAX) -> list[list[int]]:
    """Indices of `records` (each with .shard, .row and .group_key) cut into groups: runs of consecutive equal keys
    within one shard, cut at every row that is a multiple of group_max; a record without a key or with an error is
    alone."""
    groups: list[list[int]] = []
    for i, rec in enumerate(records):
        if groups and same_group(records[groups[-1][-1]], rec, group_max):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def after(rec) -> int:
    """The shard's next_row once `rec` is committed: the row after it, or with --groups shard its place in the shard's
    processing order, plus one (spcli.io.group_order)."""
    return rec.row + 1 if rec.order_pos is None else rec.order_pos + 1


def window_start(row: int, group_max: int = GROUP_MAX) -> int:
    """The first row a reader must read for the group of `row`: a group never crosses a multiple of group_max."""
    return row - row % group_max


class Whole:
    """An iterator of records whose `take(n)` returns at least n records (fewer at the end) and never cuts a group."""

    def __init__(self, records: Iterator, group_max: int = GROUP_MAX, is_on: bool = True):
        self.records, self.group_max, self.is_on = iter(records), group_max, is_on
        self.peeked = None

    def _next(self):
        if self.peeked is not None:
            rec, self.peeked = self.peeked, None
            return rec
        return next(self.records, None)

    def take(self, n: int) -> list:
        out = []
        while (rec := self._next()) is not None:
            if len(out) >= n and not (self.is_on and same_group(out[-1], rec, self.group_max)):
                self.peeked = rec
                break
            out.append(rec)
        return out


def same_group(prev, rec, group_max: int = GROUP_MAX) -> bool:
    """Whether `rec` continues the group of the record read just before it: the same shard and key, both without
    error, and no multiple of group_max between them (where every group is cut, whatever reads it). With --groups
    shard (spcli.io.group_order) the reader names each record's group: the same group_id, error rows included."""
    if rec.group_id is not None:
        return prev.group_id == rec.group_id and prev.shard == rec.shard
    return (rec.group_key is not None and prev.group_key == rec.group_key and prev.shard == rec.shard
            and prev.error is None and rec.error is None and rec.row == prev.row + 1 and rec.row % group_max != 0)


def own_rows(records: list, rows: list) -> tuple[list, list]:
    """The records and rows of a batch without its context records (read only for their group's shared part)."""
    kept = [(rec, row) for rec, row in zip(records, rows) if not rec.is_context]
    return [rec for rec, _ in kept], [row for _, row in kept]
