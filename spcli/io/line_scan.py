"""The first pass's line scanner, compiled with numba: per JSONL line, where it is, its group key and its own digest,
with no Python call per line (spcli.io.group_order's first pass).

`scan_lines` reads a byte range of a JSONL file line by line (in `threads` parts at once, each a run of whole lines).
For a line that is `{...}` (a trailing \\r allowed) the kernel reads the object's top level as JSON nests it (strings
and their escapes, objects and arrays): where it names the prompt field exactly once at its top level, names neither
the messages field nor custom_id there, and the prompt's value is a string, the line is `OK`: its key is `text_hash`
of the value's text (escapes decoded, as UTF-8) and its own digest is crc32 of the line from `{` to `}` (both
spcli.io.digests: zlib's crc32, the digest the first pass has always used, so the processing order of a directory
begun earlier does not move). Any other non-blank line is `PARSE`, left to the caller's JSON parser (a chat record, a
batch request line, a prompt that is not a string, a line with spaces around it or a BOM, a lone surrogate escape, text
that is not JSON; every line with `parse_all`, which --group-field asks for); a blank line is `BLANK` (not a record);
a line longer than the limit is `LONG`. The kernel does not validate JSON: a line it reads as `OK` that is not a
record is an error row when read, whose key can only put it in a group (the share stage finds a group's shared part
from its members' tokens, so a wrong group costs sharing, never an answer).

Cost (benches/group_order.py): ~1.3 ns a byte of a short-record shard on one core (a line's end and its strings
are found 8 bytes at a time; its crc32 is about 40% of it). `import numba` and loading the compiled kernels from
numba's cache (`__pycache__` beside the modules) cost ~0.5 s once in a process that scans; the first process after
an install compiles them (~3 s).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numba import uint64

from spcli.io.digests import CRC_TABLES, crc32, finish, has_byte, load8, mix, p1, s8
from spcli.io.jit import njit

OK, PARSE, BLANK, LONG = 0, 1, 2, 3  # a line's state
PART_BYTES = 16 << 20  # the least a thread's part of a range holds
_QUOTES, _SLASHES, _NEWLINES = (uint64(b * 0x0101010101010101) for b in (0x22, 0x5C, 0x0A))


@njit
def newline_at(a, i, n):
    """The index of the first newline at or after i, or n."""
    while i + 8 <= n and not has_byte(load8(a, i), _NEWLINES):
        i += 8
    while i < n and a[i] != 10:
        i += 1
    return i


@njit
def quote_or_slash_at(a, i, e):
    """The index of the first quote or backslash at or after i, or e."""
    while i + 8 <= e:
        w = load8(a, i)
        if has_byte(w, _QUOTES) or has_byte(w, _SLASHES):
            break
        i += 8
    while i < e and a[i] != 34 and a[i] != 92:
        i += 1
    return i


@njit
def hex_value(a, i):
    """The number of the 4 hex digits at a[i], -1 if they are not."""
    v = 0
    for k in range(4):
        c = np.int64(a[i + k])
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return -1
        v = v * 16 + d
    return v


@njit
def string_hash(a, i, e):
    """The hash of the JSON string whose text begins at i (after its quote), its escapes decoded into UTF-8:
    (hash, index of its closing quote), or (0, -1) where the kernel leaves it to the parser."""
    h, w, n = p1, uint64(0), 0
    buf = np.empty(4, dtype=np.uint8)
    while i < e:
        c = a[i]
        m = 1
        if c == 34:
            return finish(h, w, n), i
        if c == 92:
            if i + 1 >= e:
                return uint64(0), -1
            x = a[i + 1]
            i += 2
            if x == 117:  # \uXXXX
                if i + 4 > e:
                    return uint64(0), -1
                cp = hex_value(a, i)
                i += 4
                if cp < 0 or 0xDC00 <= cp <= 0xDFFF:
                    return uint64(0), -1
                if 0xD800 <= cp <= 0xDBFF:  # a surrogate pair, or a lone one (the parser's to judge)
                    if i + 6 > e or a[i] != 92 or a[i + 1] != 117:
                        return uint64(0), -1
                    lo = hex_value(a, i + 2)
                    if not 0xDC00 <= lo <= 0xDFFF:
                        return uint64(0), -1
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    i += 6
                if cp < 0x80:
                    buf[0], m = cp, 1
                elif cp < 0x800:
                    buf[0], buf[1], m = 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F), 2
                elif cp < 0x10000:
                    buf[0], buf[1], buf[2], m = 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F), 3
                else:
                    buf[0], buf[1], buf[2], buf[3], m = (0xF0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3F),
                                                         0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F), 4)
            elif x == 34 or x == 92 or x == 47:
                buf[0] = x
            elif x == 110:
                buf[0] = 10
            elif x == 116:
                buf[0] = 9
            elif x == 114:
                buf[0] = 13
            elif x == 98:
                buf[0] = 8
            elif x == 102:
                buf[0] = 12
            else:
                return uint64(0), -1
        else:
            buf[0] = c
            i += 1
        for k in range(m):
            w |= uint64(buf[k]) << uint64(8 * (n & 7))
            n += 1
            if n & 7 == 0:
                h, w = mix(h, w), uint64(0)
    return uint64(0), -1


@njit
def value_hash(a, i, e):
    """string_hash, in one pass where the string has no escape: words without a quote or backslash are hashed as
    they are found."""
    h, k = p1, i
    while k + 8 <= e:
        w = load8(a, k)
        if has_byte(w, _QUOTES) or has_byte(w, _SLASHES):
            break
        h = mix(h, w)
        k += 8
    j = quote_or_slash_at(a, k, e)
    if j >= e or a[j] == 92:
        return string_hash(a, i, e)
    w, shift = uint64(0), uint64(0)
    while k < j:
        w |= uint64(a[k]) << shift
        shift += s8
        k += 1
    return finish(h, w, j - i), j


@njit
def string_end(a, i, e):
    """The index of the closing quote of the string whose text begins at i, -1 if none before e; and whether
    it has escapes."""
    escaped = False
    while True:
        i = quote_or_slash_at(a, i, e)
        if i >= e:
            return -1, escaped
        if a[i] == 34:
            return i, escaped
        escaped = True
        i += 2


@njit
def same(a, i, j, name):
    """Whether a[i:j] is `name` (uint8)."""
    if j - i != len(name):
        return False
    for k in range(len(name)):
        if a[i + k] != name[k]:
            return False
    return True


@njit
def read_object(a, s, last, prompt, messages, custom_id):
    """The key of the object a[s..last] ({ at s, } at last): (OK, hash) or (PARSE, 0)."""
    depth, expect_key, found, key = 0, False, 0, uint64(0)
    i = s
    while i <= last:
        c = a[i]
        if c == 34:
            j, escaped = string_end(a, i + 1, last)
            if j < 0:
                return PARSE, uint64(0)
            if depth == 1 and expect_key:
                expect_key = False
                if escaped:
                    return PARSE, uint64(0)
                if same(a, i + 1, j, messages) or same(a, i + 1, j, custom_id):
                    return PARSE, uint64(0)
                if same(a, i + 1, j, prompt):
                    found += 1
                    v = j + 1
                    while v < last and (a[v] == 32 or a[v] == 9):
                        v += 1
                    if v >= last or a[v] != 58:
                        return PARSE, uint64(0)
                    v += 1
                    while v < last and (a[v] == 32 or a[v] == 9 or a[v] == 10 or a[v] == 13):
                        v += 1
                    if v >= last or a[v] != 34:
                        return PARSE, uint64(0)
                    key, j = value_hash(a, v + 1, last)
                    if j < 0:
                        return PARSE, uint64(0)
            i = j + 1
            continue
        if c == 123 or c == 91:
            depth += 1
            expect_key = depth == 1
        elif c == 125 or c == 93:
            depth -= 1
        elif c == 44 and depth == 1:
            expect_key = True
        i += 1
    if found != 1 or depth != 0:
        return PARSE, uint64(0)
    return OK, key


@njit
def scan_part(a, start, end, row, stop_row, limit, prompt, messages, custom_id, parse_all, t,
              rows, starts, lengths, states, keys, owns):
    """The lines of a[start:end] (whole lines), the first being row `row`, up to row stop_row (-1: all) or as many as
    the output arrays [L] hold; returns how many were written."""
    k = 0
    while start < end and k < len(starts) and (stop_row < 0 or row < stop_row):
        e = newline_at(a, start, end)
        rows[k], starts[k], lengths[k] = row, start, min(e + 1, end) - start  # with its newline
        keys[k], owns[k], states[k] = uint64(0), uint64(0), PARSE
        last = e - 1
        if last >= start and a[last] == 13:
            last -= 1
        if e - start > limit:
            states[k] = LONG
        elif a[start] == 123 and last > start and a[last] == 125:
            if not parse_all:
                state, key = read_object(a, start, last, prompt, messages, custom_id)
                if state == OK:
                    states[k], keys[k], owns[k] = OK, key, crc32(a, start, last + 1, t)
        else:
            blank = True
            for i in range(start, e):
                c = a[i]
                if not (c == 32 or 9 <= c <= 13):
                    blank = False
                    break
            if blank:
                states[k] = BLANK
        k += 1
        row += 1
        start = e + 1
    return k


@njit
def count_newlines(a, start, end):
    k = 0
    for i in range(uint64(start), uint64(end)):
        if a[i] == 10:
            k += 1
    return k


@dataclass(frozen=True)
class Lines:
    """What scan_lines read, per line [L] in file order: its row, where it starts and its length with its newline,
    its state (OK, PARSE, BLANK, LONG) and, for OK lines, its key and own digest (0 elsewhere)."""

    rows: np.ndarray  # int64 [L]
    starts: np.ndarray  # int64 [L]
    lengths: np.ndarray  # int64 [L]
    states: np.ndarray  # uint8 [L]
    keys: np.ndarray  # uint64 [L]
    owns: np.ndarray  # uint64 [L]


def scan_lines(a: np.ndarray, start: int, row: int, stop_row: int, limit: int, prompt: str, messages: str,
               parse_all: bool = False, threads: int | None = None) -> Lines:
    """The lines of `a` (uint8, a file's bytes) from byte `start`, the first being row `row`, up to row stop_row
    (-1: to the end); lines over `limit` bytes are LONG. `threads` parts at once (default: the cores this process
    may use, at most 8, and a part per PART_BYTES at least)."""
    n = len(a)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux: cpuset
    threads = threads or min(8, cores)
    num_parts = max(1, min(threads, (n - start) // PART_BYTES))
    cuts = [start] + [min(n, newline_at(a, start + (n - start) * p // num_parts, n) + 1) for p in range(1, num_parts)]
    cuts = sorted(set(cuts)) + [n]
    num_parts = len(cuts) - 1
    pool = ThreadPoolExecutor(num_parts) if num_parts > 1 else None
    run = (lambda f: list(pool.map(f, range(num_parts)))) if pool else (lambda f: [f(0)])
    lines_in = lambda p: count_newlines(a, cuts[p], cuts[p + 1]) + (cuts[p + 1] == n > cuts[p] and a[n - 1] != 10)
    try:
        firsts = row + np.concatenate([[0], np.cumsum(run(lines_in))]).astype(np.int64)
        total = int(firsts[-1] - row) if stop_row < 0 else max(0, min(int(firsts[-1]), stop_row) - row)
        out = Lines(np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64),
                    np.empty(total, np.uint8), np.empty(total, np.uint64), np.empty(total, np.uint64))
        names = [np.frombuffer(s.encode("utf-8"), dtype=np.uint8) for s in (prompt, messages, "custom_id")]

        def part(p: int) -> int:
            lo = int(firsts[p] - row)
            if lo >= total:
                return 0
            hi = min(total, int(firsts[p + 1] - row))
            arrays = [x[lo:hi] for x in (out.rows, out.starts, out.lengths, out.states, out.keys, out.owns)]
            return scan_part(a, cuts[p], cuts[p + 1], int(firsts[p]), stop_row, limit, *names, parse_all, CRC_TABLES,
                             *arrays)

        done = run(part)
    finally:
        if pool:
            pool.shutdown()
    assert sum(done) == total, (done, total)
    return out
