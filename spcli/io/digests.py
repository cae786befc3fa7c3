"""Digests the first pass computes in compiled loops (numba): `text_hash`, a 64-bit hash of bytes, and zlib's crc32.

`text_hash` (hash_range, hash_bytes, hash_strings; `bytes_key` from Python) reads 8 bytes at a time as xxHash64 does
(multiply, rotate, multiply), then mixes in the length and avalanches; it is the group key of a prompt's text, so the
JSONL line scanner (spcli.io.line_scan), Parquet's string columns and Python give equal texts equal keys. Keys are
only compared with the other keys of one pass, never stored: the function may change between versions.

`crc32` is zlib's CRC-32 (reflected, polynomial 0xEDB88320), 8 bytes at a time by slicing by 8: the digest a JSONL
record's group members are ordered by, as it always was (a directory begun earlier resumes in the same order).

Loads of 8 bytes index through unsigned integers: numba wraps a negative signed index, which keeps LLVM from making
the 8 byte loads one.
"""

from __future__ import annotations

import numpy as np
from numba import uint64

from spcli.io.jit import njit

p1, p2, p3 = uint64(0x9E3779B185EBCA87), uint64(0xC2B2AE3D27D4EB4F), uint64(0x165667B19E3779F9)  # xxHash64's
s8, s27, s29, s32, s33, s37 = (uint64(k) for k in (8, 27, 29, 32, 33, 37))
u1, u2, u3, u4, u5, u6, u7 = (uint64(k) for k in range(1, 8))
ONES, HIGHS = uint64(0x0101010101010101), uint64(0x8080808080808080)


def _crc_tables() -> np.ndarray:
    """Slicing-by-8 tables of CRC-32 (reflected, polynomial 0xEDB88320: zlib's) [8, 256] uint64."""
    t = np.zeros((8, 256), dtype=np.uint64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> np.uint64(8)) ^ t[0][t[k - 1] & np.uint64(0xFF)]
    return t


CRC_TABLES = _crc_tables().astype(np.uint32)  # 8 kB: in L1 beside the line


@njit(inline="always")
def mix(h, w):
    h = h ^ (w * p2)
    return ((h << s27) | (h >> s37)) * p1 + p3


@njit(inline="always")
def finish(h, w, n):
    h = mix(h, w) ^ uint64(n)
    h = (h ^ (h >> s33)) * p2
    h = (h ^ (h >> s29)) * p3
    return h ^ (h >> s32)


@njit(inline="always")
def load8(a, i):
    """a[i .. i + 7] as one little-endian word (i >= 0)."""
    j = uint64(i)
    return (uint64(a[j]) | (uint64(a[j + u1]) << s8) | (uint64(a[j + u2]) << uint64(16))
            | (uint64(a[j + u3]) << uint64(24)) | (uint64(a[j + u4]) << s32) | (uint64(a[j + u5]) << uint64(40))
            | (uint64(a[j + u6]) << uint64(48)) | (uint64(a[j + u7]) << uint64(56)))


@njit(inline="always")
def has_byte(w, pattern):
    """Whether a byte of w is pattern's byte (pattern: that byte 8 times)."""
    v = w ^ pattern
    return ((v - ONES) & ~v & HIGHS) != uint64(0)


@njit
def hash_range(a, i, j):
    """text_hash of a[i:j]."""
    h, k = p1, i
    while k + 8 <= j:
        h = mix(h, load8(a, k))
        k += 8
    w, shift = uint64(0), uint64(0)
    while k < j:
        w |= uint64(a[k]) << shift
        shift += s8
        k += 1
    return finish(h, w, j - i)


@njit
def hash_bytes(a):
    return hash_range(a, 0, len(a))


@njit
def hash_strings(offsets, data):
    """text_hash of each string of an Arrow string array: offsets [n + 1], data (its values' bytes)."""
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    for i in range(len(out)):
        out[i] = hash_range(data, offsets[i], offsets[i + 1])
    return out


@njit
def crc32(a, s, e, t):
    """zlib.crc32(a[s:e]), slicing by 8 (t: CRC_TABLES)."""
    crc, m8 = uint64(0xFFFFFFFF), uint64(0xFF)
    i = s
    while i + 8 <= e:
        w = load8(a, i)
        one = crc ^ (w & uint64(0xFFFFFFFF))
        crc = (t[7, one & m8] ^ t[6, (one >> s8) & m8] ^ t[5, (one >> uint64(16)) & m8] ^ t[4, one >> uint64(24)]
               ^ t[3, (w >> s32) & m8] ^ t[2, (w >> uint64(40)) & m8] ^ t[1, (w >> uint64(48)) & m8]
               ^ t[0, w >> uint64(56)])
        i += 8
    while i < e:
        crc = t[0, (crc ^ uint64(a[i])) & m8] ^ (crc >> s8)
        i += 1
    return crc ^ uint64(0xFFFFFFFF)


def bytes_key(data: bytes) -> int:
    """text_hash of `data` (a text's UTF-8 bytes), as the kernel hashes a prompt's value."""
    return int(hash_bytes(np.frombuffer(data, dtype=np.uint8)))
