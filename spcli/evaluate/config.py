"""`spcli eval` configuration: a frozen dataclass validated on construction (flags map one-to-one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spcli.config import DTYPES, ScoreConfig, SelectConfig, _check
from spcli.errors import ConfigError
from spcli.evaluate.selectors import SELECTORS, check_selectors
from spcli.evaluate.tasks import TASKS


def split_list(text: str, kind: type, flag: str) -> tuple:
    """'0.1,0.3' -> (0.1, 0.3); a clear error naming the flag otherwise."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    try:
        return tuple(kind(s) for s in items)
    except ValueError:
        raise ConfigError(f"{flag} takes a comma-separated list of {kind.__name__} values, got {text!r}") from None


@dataclass(frozen=True)
class EvalConfig:
    out: str
    inputs: tuple[str, ...] = ()  # JSONL/Parquet shards (an optional `answer` field: string or list of alternatives)
    tasks: tuple[str, ...] = ()  # built-in tasks, generated from `seed`
    lengths: tuple[int, ...] = (2048,)  # target prompt tokens of built-in tasks
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default
    keeps: tuple[float, ...] = (0.1, 0.3, 0.5, 1.0)
    selectors: tuple[str, ...] = SELECTORS
    samples: int = 20  # per task and length (built-in), or the first N records of the inputs
    seed: int = 0  # task generation and random selection
    max_tokens: int | None = None  # None = each example's own: the task's (32-64) or the record's (else 24)
    compare_tokens: int = 16  # greedy tokens compared with full prefill for exact match
    bootstrap: int = 2000  # resamples per confidence interval
    dtype: str | None = None
    device: str = "auto"
    html: bool = False
    select: SelectConfig = field(default_factory=lambda: SelectConfig(keep=1.0))  # keep is per run: `keeps`
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def __post_init__(self) -> None:
        _check(bool(self.inputs) or bool(self.tasks), "give INPUT files or at least one --task")
        for t in self.tasks:
            _check(t in TASKS, f"unknown task {t!r}: use one of {', '.join(TASKS)}")
        _check(bool(self.keeps) and all(0.0 < k <= 1.0 for k in self.keeps), f"--keep values must be in (0, 1], got {self.keeps}")
        _check(bool(self.selectors), f"--selector needs at least one of {', '.join(SELECTORS)}")
        check_selectors(self.selectors)
        _check(all(256 <= n <= 32768 for n in self.lengths), f"--lengths must be in [256, 32768] tokens, got {self.lengths}")
        _check(self.samples >= 1, f"--samples must be >= 1, got {self.samples}")
        _check(self.max_tokens is None or self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(self.compare_tokens >= 1, f"--compare-tokens must be >= 1, got {self.compare_tokens}")
        _check(self.bootstrap >= 100, f"--bootstrap must be >= 100 resamples, got {self.bootstrap}")
        _check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def pruned_keeps(self) -> tuple[float, ...]:
        return tuple(sorted({k for k in self.keeps if k < 1.0}))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
