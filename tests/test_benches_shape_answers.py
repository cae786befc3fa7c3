"""benches/shape_answers.py's scoring: a row is right when an answer is in its output; kept is over prompt tokens."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from test_benches import REPO

sys.path.insert(0, str(REPO / "benches"))
import shape_answers  # noqa: E402


def test_rows_read_back_and_scored(tmp_path):
    rows = [{"id": "a", "output": "It is May 24, 2024.", "num_prompt_tokens": 100, "num_kept_tokens": 20, "error": None},
            {"id": "b", "output": "2027", "num_prompt_tokens": 100, "num_kept_tokens": 30, "error": None},
            {"id": "c", "output": None, "num_prompt_tokens": None, "num_kept_tokens": None, "error": "x.jsonl:row 2: bad"}]
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "part-00000-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[2:]), tmp_path / "part-00000-00001.parquet")
    got = shape_answers.score(shape_answers.read_rows(tmp_path), {"a": ("may 24, 2024",), "b": ("May 24",), "c": ("x",)})
    assert (got["right"], got["rows"], got["kept"]) == (1, 3, 0.25)
    assert got["misses"] == [("b", "May 24", "2027"), ("c", "x", "x.jsonl:row 2: bad")]
