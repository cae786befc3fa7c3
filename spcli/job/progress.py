"""Progress and log lines of a run.

- On a terminal: a live tqdm bar (rows done/total, rows/s, ETA, prompt tokens/s, mean kept %, failed).
- Otherwise (Slurm logs, pipes): a plain `progress:` line after the first batch, every `interval_s`
  and at the end.
- One INFO line per committed batch: "scored N tokens, kept M (x%), speculator a s, base b s".
- `--log-json`: every log line, progress included, is one JSON object (time, level, logger, message
  and the numbers as fields); no redrawn bar.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import orjson

from spcli.errors import ConfigError
from spcli.io.commit import batch_prefill_s

if TYPE_CHECKING:
    from spcli.io.schema import RowResult

log = logging.getLogger("spcli")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; numbers passed as `extra={"fields": {...}}` become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (test runners swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(level: str = "INFO", quiet: bool = False, json_lines: bool = False) -> None:
    """spcli's own loggers at `level` (WARNING with quiet); other libraries' at WARNING; one stderr handler."""
    level = "WARNING" if quiet else level.upper()
    if level not in LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    root = logging.getLogger()
    from tqdm.contrib.logging import _TqdmLoggingHandler  # left behind by a bar that was never closed

    root.handlers[:] = [h for h in root.handlers if not isinstance(h, (_StderrHandler, _TqdmLoggingHandler))]
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    log.setLevel(level)
    if quiet or not sys.stderr.isatty():  # loading bars only on a terminal: in a log file they are noise
        quiet_third_party_bars()


def quiet_third_party_bars() -> None:
    """No loading bars from huggingface_hub and transformers ("Loading weights"), imported yet or not."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when huggingface_hub is imported
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def is_json_logging() -> bool:
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def keep_pct(kept_tokens: int, prompt_tokens: int) -> str:
    """The one keep percentage of every line: kept / prompt tokens over the rows without error."""
    return f"{100.0 * kept_tokens / prompt_tokens:.1f}%" if prompt_tokens else "-"


class FailedRows:
    """One WARNING per failed row, naming where and why, for the first `max_shown`; close() counts the rest."""

    def __init__(self, max_shown: int = 10):
        self.max_shown, self.count = max_shown, 0

    def add(self, rows: list[RowResult]) -> None:
        for r in rows:
            if r.error is not None:
                self.count += 1
                if self.count <= self.max_shown:
                    log.warning("failed row %r: %s", r.id, r.error,
                                extra={"fields": {"event": "failed_row", "id": r.id, "error": r.error}})

    def close(self) -> None:
        if self.count > self.max_shown:
            hidden = self.count - self.max_shown
            log.warning("%d more failed row%s not shown (the first %d are above)", hidden, "" if hidden == 1 else "s",
                        self.max_shown)
        self.count = 0


def batch_line(rows: list[RowResult]) -> tuple[str, dict]:
    """The per-batch INFO message and its numbers. prefill_s is per batch (the same on each row)."""
    ok = [r for r in rows if r.error is None]
    # a group's document counts once: its other members add only their own tokens (and kept positions) after it
    own = lambda r, n, shared: n - (shared if r.group is not None and not r.leads else 0)
    is_scored = lambda r: r.speculate_s > 0 or r.num_kept_tokens < r.num_prompt_tokens
    scored_rows = [r for r in ok if is_scored(r)]
    whole = sum(own(r, r.num_prompt_tokens, r.shared_len) for r in ok if not is_scored(r))
    scored = sum(own(r, r.num_prompt_tokens, r.shared_len) for r in scored_rows)
    kept = sum(own(r, r.num_kept_tokens, r.shared_kept) for r in scored_rows)
    speculate_s = sum(r.speculate_s for r in ok)
    prefill_s = batch_prefill_s(rows)
    failed = len(rows) - len(ok)
    rate = 100.0 * kept / scored if scored else 0.0
    msg = f"scored {scored} tokens, kept {kept} ({keep_pct(kept, scored)})"
    msg += (f", {whole} tokens prefilled whole" if whole else "") + f", speculator {speculate_s:.1f} s, base {prefill_s:.1f} s"
    msg += f"; {len(rows)} row{'' if len(rows) == 1 else 's'}" + (f", {failed} failed" if failed else "")
    fields = {"event": "batch", "rows": len(rows), "failed": failed, "prompt_tokens": scored, "kept_tokens": kept,
              "kept_pct": round(rate, 2), "speculate_s": round(speculate_s, 4), "prefill_s": round(prefill_s, 4)}
    if whole:
        fields["whole_tokens"] = whole
    return msg, fields


class Progress:
    def __init__(self, total: int | None = None, stream=None, interval_s: float = 10.0, quiet: bool = False):
        self._stream = stream
        self.total = total
        self.interval_s = interval_s
        self.quiet = quiet
        self.rows = self.failed = self.prompt_tokens = self.kept_tokens = self.output_tokens = 0
        self.done_before = 0  # rows committed by an earlier (resumed) run
        self.failures = FailedRows()
        self._bar = None
        self._redirect = None
        self._lines = 0
        self._rows_at_line = 0
        self._t0 = self._last = time.perf_counter()

    @property
    def stream(self):
        return self._stream or sys.stderr

    def start(self, total: int | None, done: int = 0) -> None:
        """total: rows this run will process (None = unknown); done: rows already committed before it."""
        self.total, self.done_before = total, done
        self._t0 = self._last = time.perf_counter()
        if self.quiet or is_json_logging() or not self.stream.isatty():
            return
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        try:
            size = os.get_terminal_size(self.stream.fileno())
            has_size = size.columns > 0 and size.lines > 0
        except (OSError, ValueError, AttributeError):
            has_size = False  # a pty without a size (e.g. under `script`): tqdm would draw nothing
        self._bar = tqdm(total=total, unit="row", file=self.stream, smoothing=0.1, dynamic_ncols=has_size,
                         ncols=None if has_size else 100, nrows=None if has_size else 40)
        self._redirect = logging_redirect_tqdm(tqdm_class=tqdm)  # log lines print above the bar
        self._redirect.__enter__()

    def numbers(self) -> dict:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        eta = (self.total - self.rows) * elapsed / self.rows if self.total is not None and self.rows else None
        return {
            "event": "progress", "rows": self.rows, "total": self.total, "failed": self.failed,
            "rows_per_s": round(self.rows / elapsed, 3), "prompt_tokens_per_s": round(self.prompt_tokens / elapsed, 1),
            "kept_pct": round(100.0 * self.kept_tokens / self.prompt_tokens, 2) if self.prompt_tokens else None,
            "eta_s": round(eta, 1) if eta is not None else None, "elapsed_s": round(elapsed, 1),
        }

    def stats(self) -> str:
        n = self.numbers()
        of = f"/{n['total']}" if n["total"] is not None else ""
        kept = keep_pct(self.kept_tokens, self.prompt_tokens)
        eta = f", ETA {_duration(n['eta_s'])}" if n["eta_s"] is not None else ""
        return (f"{n['rows']}{of} rows, {n['rows_per_s']:.2f} rows/s, {n['prompt_tokens_per_s']:.0f} prompt tok/s, "
                f"kept {kept}, failed {n['failed']}{eta}")

    def update(self, rows: list[RowResult]) -> None:
        """Called after each committed batch with its rows."""
        self.rows += len(rows)
        self.failed += sum(r.error is not None for r in rows)
        self.prompt_tokens += sum(r.num_prompt_tokens for r in rows if r.error is None)
        self.kept_tokens += sum(r.num_kept_tokens for r in rows if r.error is None)
        self.output_tokens += sum(r.num_output_tokens for r in rows if r.error is None)
        msg, fields = batch_line(rows)
        log.info(msg, extra={"fields": fields})
        self.failures.add(rows)
        if self.quiet:
            return
        if self._bar is not None:
            n = self.numbers()
            kept = keep_pct(self.kept_tokens, self.prompt_tokens)
            self._bar.set_postfix_str(f"{_si(n['prompt_tokens_per_s'])} tok/s, kept {kept}, failed {self.failed}",
                                      refresh=False)
            self._bar.update(len(rows))
        elif self._lines == 0 or time.perf_counter() - self._last >= self.interval_s:
            self._line()

    def stage(self, text: str) -> None:
        """Where the batch in flight is ("speculating 3/8 prompts"): on the bar, or as a plain line
        when the last line is older than interval_s."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.set_description_str(text, refresh=True)
        elif time.perf_counter() - self._last >= self.interval_s:
            self._last = time.perf_counter()
            log.info("progress: %s; %s", text, self.stats(), extra={"fields": {**self.numbers(), "stage": text}})

    def _line(self) -> None:
        self._last = time.perf_counter()
        self._lines += 1
        self._rows_at_line = self.rows
        if is_json_logging():
            log.info("progress: %s", self.stats(), extra={"fields": self.numbers()})
        else:
            print(f"progress: {self.stats()}", file=self.stream, flush=True)

    def close(self) -> None:
        self.failures.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        elif not self.quiet and self.rows > self._rows_at_line:
            self._line()  # the final numbers


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def _si(x: float) -> str:
    return f"{x / 1e6:.1f}M" if x >= 1e6 else (f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}")
