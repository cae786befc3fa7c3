"""Two runs side by side (`--compare DIR2`): rows joined by id, outputs matched, kept sets diffed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spcli.errors import OutputError
from spcli.inspect.outputs import RunOutputs
from spcli.inspect.tokens import TokenView, load_view, split_runs

BOTH, ONLY_A, ONLY_B, NEITHER = "both", "only_a", "only_b", "neither"
COLUMNS = ["id", "output", "error", "num_prompt_tokens", "num_kept_tokens", "keep_rate", "kept_indices"]


@dataclass
class ComparedRow:
    id: str
    a: dict  # the row in run A (COLUMNS)
    b: dict

    @property
    def is_match(self) -> bool:
        return self.a["error"] is None and self.b["error"] is None and self.a["output"] == self.b["output"]

    @property
    def num_only_a(self) -> int:
        """Tokens run A kept that run B dropped."""
        return len(set(self.a["kept_indices"] or []) - set(self.b["kept_indices"] or []))

    @property
    def num_only_b(self) -> int:
        return len(set(self.b["kept_indices"] or []) - set(self.a["kept_indices"] or []))


@dataclass
class RunTiming:
    wall_s: float  # the run's wall time (every resumed run summed)
    ttft_p50_s: float | None  # median time to first token over rows without error
    speculate_s: float  # speculator time summed over rows


def run_timing(run: RunOutputs) -> RunTiming:
    from spcli.inspect.summary import summarize

    s = summarize(run)
    return RunTiming(s.wall_s, s.ttft_quantiles.get("p50"), s.speculate_s)


@dataclass
class Comparison:
    out_a: str
    out_b: str
    keep_a: float | None  # the runs' --keep
    keep_b: float | None
    rows: list[ComparedRow]  # ids in both runs, in run A's order
    num_only_in_a: int  # ids committed in A but not (yet) in B
    num_only_in_b: int
    timing_a: RunTiming | None = None
    timing_b: RunTiming | None = None

    @property
    def num_match(self) -> int:
        return sum(r.is_match for r in self.rows)


def compare_runs(a: RunOutputs, b: RunOutputs) -> Comparison:
    rows_a = a.table(COLUMNS).to_pylist()
    rows_b = {r["id"]: r for r in b.table(COLUMNS).to_pylist()}
    ids_a = {r["id"] for r in rows_a}
    both = [ComparedRow(r["id"], r, rows_b[r["id"]]) for r in rows_a if r["id"] in rows_b]
    return Comparison(str(a.out), str(b.out), a.config.get("select", {}).get("keep"), b.config.get("select", {}).get("keep"),
                      both, len(ids_a - rows_b.keys()), len(rows_b.keys() - ids_a), run_timing(a), run_timing(b))


@dataclass
class DiffRun:
    start: int
    end: int
    state: str  # BOTH | ONLY_A | ONLY_B | NEITHER
    text: str


def diff_view(a: RunOutputs, b: RunOutputs, row_id: str, tokenizer=None) -> tuple[TokenView, dict, list[DiffRun]]:
    """Run A's view of one row, run B's row, and the prompt split into runs by which run kept each token."""
    view = load_view(a, a.find(row_id=row_id), tokenizer)
    row_b = b.find(row_id=row_id)
    n = view.num_tokens
    if row_b.get("num_prompt_tokens") not in (None, 0, n):
        raise OutputError(f"row {row_id!r} has {n} prompt tokens in {a.out} but {row_b['num_prompt_tokens']} in {b.out}: "
                          "the runs used different inputs or tokenizers")
    is_kept_b = np.zeros(n, dtype=bool)
    kept_b = np.asarray(row_b.get("kept_indices") or [], dtype=np.int64)
    is_kept_b[kept_b[kept_b < n]] = True
    return view, row_b, diff_runs(view.pieces, view.is_kept, is_kept_b)


def diff_runs(pieces: list[str], is_kept_a: np.ndarray, is_kept_b: np.ndarray) -> list[DiffRun]:
    states = {(True, True): BOTH, (True, False): ONLY_A, (False, True): ONLY_B, (False, False): NEITHER}
    keys = [states[ka, kb] for ka, kb in zip(is_kept_a.tolist(), is_kept_b.tolist())]
    return [DiffRun(start, end, keys[start], "".join(pieces[start:end])) for start, end in split_runs(keys)]
