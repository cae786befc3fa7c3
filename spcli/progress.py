"""Progress of a run: a live bar on a terminal, plain periodic lines otherwise (Slurm logs)."""

from __future__ import annotations

import sys
import time

from spcli.io.schema import RowResult


class Progress:
    def __init__(self, total: int | None = None, stream=None, interval_s: float = 10.0, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.total = total
        self.interval_s = interval_s
        self.quiet = quiet
        self.rows = self.failed = self.prompt_tokens = self.kept_tokens = 0
        self._bar = None
        self._t0 = self._last = time.perf_counter()

    def start(self, total: int | None, done: int = 0) -> None:
        self.total = total
        self._t0 = self._last = time.perf_counter()
        if not self.quiet and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="row", file=self.stream, dynamic_ncols=True)

    def stats(self) -> str:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        kept = 100.0 * self.kept_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        eta = ""
        if self.total and self.rows:
            eta = f", ETA {(self.total - self.rows) * elapsed / self.rows:.0f} s"
        of = f"/{self.total}" if self.total is not None else ""
        return (f"{self.rows}{of} rows, {self.rows / elapsed:.2f} rows/s, {self.prompt_tokens / elapsed:.0f} prompt tok/s, "
                f"kept {kept:.1f}%, failed {self.failed}{eta}")

    def update(self, rows: list[RowResult]) -> None:
        self.rows += len(rows)
        self.failed += sum(r.error is not None for r in rows)
        self.prompt_tokens += sum(r.num_prompt_tokens for r in rows)
        self.kept_tokens += sum(r.num_kept_tokens for r in rows)
        if self.quiet:
            return
        if self._bar is not None:
            kept = 100.0 * self.kept_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            self._bar.set_postfix_str(f"kept {kept:.1f}%, failed {self.failed}", refresh=False)
            self._bar.update(len(rows))
        elif time.perf_counter() - self._last >= self.interval_s:
            self._last = time.perf_counter()
            print(f"progress: {self.stats()}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
