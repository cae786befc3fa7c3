"""spcli/io/line_scan.py: the compiled JSONL line scanner. Its crc32 is zlib's, its key is the hash of the prompt's
decoded text (bytes_key), its parts on threads read what one part reads, and it leaves to the parser what it cannot
read exactly."""

import json
import random
import zlib

import numpy as np

from spcli.io import digests, line_scan
from spcli.io.digests import bytes_key
from spcli.io.line_scan import BLANK, LONG, OK, PARSE, scan_lines


def _lines(text: bytes, **kw):
    return scan_lines(np.frombuffer(text, dtype=np.uint8), 0, 0, -1, kw.pop("limit", 1 << 20), "prompt", "messages", **kw)


def test_crc32_is_zlibs_on_odd_sizes():
    rng = random.Random(0)
    for size in [*range(0, 70), 1023, 4097]:
        data = bytes(rng.randrange(256) for _ in range(size))
        a = np.frombuffer(b"xx" + data, dtype=np.uint8)  # off the 8-byte grid
        assert int(digests.crc32(a, 2, 2 + size, digests.CRC_TABLES)) == zlib.crc32(data), size


def test_the_key_is_the_hash_of_the_decoded_prompt_text():
    texts = ["", "a", "1234567", "12345678", "123456789", "é ü", "smile \U0001F600", 'say "hi"\n\tand \\ / back',
             "\x00\x1f control", "x" * 301]
    for text in texts:
        for ensure_ascii in (True, False):
            line = json.dumps({"id": 1, "prompt": text, "question": "q"}, ensure_ascii=ensure_ascii).encode()
            got = _lines(line)
            assert got.states.tolist() == [OK], (text, ensure_ascii)
            assert int(got.keys[0]) == bytes_key(text.encode()), (text, ensure_ascii)
            assert int(got.owns[0]) == zlib.crc32(line)
    assert len({bytes_key(t.encode()) for t in texts}) == len(texts)


def test_what_the_scanner_leaves_to_the_parser():
    lines = [b'{"prompt": "lone \\ud800"}', b'{"prompt": 7}', b'{"messages": [], "prompt": "x"}',
             b'{"custom_id": "a", "body": {"prompt": "x"}}', b'{"prompt": "a", "prompt": "b"}', b' {"prompt": "x"}',
             b'{"meta": {"prompt": "x"}}', b'{"pr\\u006fmpt": "x"}', b'{"prompt": "open', b'not json', b'{}',
             b'', b' \t\r', b'{"prompt": "' + b"y" * 50 + b'"}', b'{"meta": {"prompt": "x"}, "prompt": "ok"}']
    got = _lines(b"\n".join(lines), limit=48)
    assert got.states.tolist() == [PARSE] * 11 + [BLANK, BLANK, LONG, OK]
    assert got.rows.tolist() == list(range(len(lines)))


def test_parts_on_threads_read_what_one_part_reads(monkeypatch):
    rng = random.Random(1)
    rows = [json.dumps({"id": i, "prompt": "doc %d" % rng.randrange(9) + "é" * rng.randrange(3)}) if i % 7 else ""
            for i in range(3000)]
    text = "\n".join(rows).encode()
    monkeypatch.setattr(line_scan, "PART_BYTES", 1000)
    one = _lines(text, threads=1)
    for threads in (2, 3, 8):
        many = _lines(text, threads=threads)
        for name in ("rows", "starts", "lengths", "states", "keys", "owns"):
            assert getattr(many, name).tolist() == getattr(one, name).tolist(), (threads, name)
    a = np.frombuffer(text, dtype=np.uint8)
    start = one.starts[100]
    part = scan_lines(a, int(start), 100, 2500, 1 << 20, "prompt", "messages", threads=3)
    assert part.rows.tolist() == list(range(100, 2500))
    assert part.keys.tolist() == one.keys[100:2500].tolist()
