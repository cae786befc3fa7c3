"""The processing order of a scanned shard, compiled with numba (spcli.io.group_order.order's rule, in O(N) passes
after one sort of the keys).

`order_kernel` gets the records' key digests, own digests and rows (per record [N]) and which have a key:

- keyed records sorted by key (numpy's argsort), each run of one key then sorted by (own digest, row) in place
  (`sort_runs`: insertion sort for a few members, two stable sorts for many);
- a run cut into groups of at most group_max, in that order; a record without a key is a group alone;
- groups in the order of their last row (rows are distinct, so no two groups tie).
"""

from __future__ import annotations

import numpy as np

from spcli.io.jit import njit

FEW = 32  # a run of at most this many members is sorted by insertion


@njit
def sort_runs(keys, own, rows, p):
    """Sort each run of equal keys (keys, own, rows: the records' values in the order p, which is sorted by key) by
    (own digest, row), all four in place."""
    n, i = len(p), 0
    while i < n:
        j = i + 1
        while j < n and keys[j] == keys[i]:
            j += 1
        if j - i <= FEW:
            for x in range(i + 1, j):
                v, o, r, y = p[x], own[x], rows[x], x - 1
                while y >= i and (o < own[y] or (o == own[y] and r < rows[y])):
                    p[y + 1], own[y + 1], rows[y + 1] = p[y], own[y], rows[y]
                    y -= 1
                p[y + 1], own[y + 1], rows[y + 1] = v, o, r
        else:
            by = np.argsort(rows[i:j], kind="mergesort")
            by = by[np.argsort(own[i:j][by], kind="mergesort")]
            p[i:j], own[i:j], rows[i:j] = p[i:j][by], own[i:j][by], rows[i:j][by]
        i = j


@njit
def cut_groups(keys, rows, alone_rows, group_max):
    """Groups of the sorted keyed records (their keys and rows in that order), then one per record without a key
    (alone_rows): (starts [G] into the keyed records then the others, each group's last row [G], documents,
    questions, documents cut)."""
    n, m = len(keys), len(alone_rows)
    starts = np.empty(n + m, dtype=np.int64)
    last = np.empty(n + m, dtype=np.int64)
    g, documents, questions, cut, i = 0, 0, 0, 0, 0
    while i < n:
        j = i + 1
        while j < n and keys[j] == keys[i]:
            j += 1
        documents += 1
        if j - i > 1:
            questions += j - i
        if j - i > group_max:
            cut += 1
        for a in range(i, j, group_max):
            starts[g], last[g] = a, rows[a:min(j, a + group_max)].max()
            g += 1
        i = j
    for x in range(m):
        starts[g], last[g] = n + x, alone_rows[x]
        g += 1
    return starts[:g], last[:g], documents, questions, cut


@njit
def place(members, starts, by_last):
    """members regrouped so that group by_last[j] comes j-th: (members [N], starts [G + 1])."""
    n, g = len(members), len(starts)
    out = np.empty(n, dtype=np.int64)
    new_starts = np.empty(g + 1, dtype=np.int64)
    at = 0
    for j in range(g):
        a = starts[by_last[j]]
        b = starts[by_last[j] + 1] if by_last[j] + 1 < g else n
        new_starts[j] = at
        out[at:at + b - a] = members[a:b]
        at += b - a
    new_starts[g] = at
    return out, new_starts


def reference(keys: np.ndarray, own: np.ndarray, rows: np.ndarray, has_key: np.ndarray, group_max: int):
    """order_kernel in plain numpy (the first pass's order before it was compiled): one lexsort, then array ops."""
    n = len(rows)
    keyed = np.flatnonzero(has_key)
    by_key = keyed[np.lexsort((rows[keyed], own[keyed], keys[keyed]))]
    k = keys[by_key]
    new_key = np.ones(len(by_key), dtype=bool)
    new_key[1:] = k[1:] != k[:-1]
    key_starts = np.flatnonzero(new_key)
    rank = np.arange(len(by_key)) - key_starts[np.cumsum(new_key) - 1]
    sizes = np.diff(np.append(key_starts, len(by_key)))
    alone = np.flatnonzero(~has_key)
    members = np.concatenate([by_key, alone]).astype(np.int64)
    starts = np.concatenate([np.flatnonzero(new_key | (rank % group_max == 0)),
                             len(by_key) + np.arange(len(alone))]).astype(np.int64)
    if not n:
        return members, np.zeros(1, dtype=np.int64), 0, 0, 0, 0
    by_last = np.argsort(np.maximum.reduceat(rows[members], starts), kind="stable")
    lengths = np.diff(np.append(starts, n))[by_last]
    new_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    take = np.repeat(starts[by_last] - new_starts[:-1], lengths) + np.arange(n)  # group by_last[j] at new_starts[j]
    return (members[take], new_starts, len(key_starts), int(sizes[sizes > 1].sum()), len(alone),
            int((sizes > group_max).sum()))


def order_kernel(keys: np.ndarray, own: np.ndarray, rows: np.ndarray, has_key: np.ndarray, group_max: int):
    """(members [N], starts [G + 1], documents, questions, no_key, cut): module docstring."""
    every = bool(has_key.all())
    p = np.argsort(keys) if every else (lambda keyed: keyed[np.argsort(keys[keyed])])(np.flatnonzero(has_key))
    sorted_keys, sorted_own, sorted_rows = keys[p], own[p], rows[p]  # contiguous: the runs are sorted in place
    sort_runs(sorted_keys, sorted_own, sorted_rows, p)
    del sorted_own
    alone = np.zeros(0, dtype=np.int64) if every else np.flatnonzero(~has_key)
    starts, last, documents, questions, cut = cut_groups(sorted_keys, sorted_rows, rows[alone], group_max)
    del sorted_keys, sorted_rows
    members, starts = place(p if every else np.concatenate([p, alone]), starts, np.argsort(last))
    return members, starts, documents, questions, len(alone), cut
