"""`spcli bench` configuration: a frozen dataclass validated on construction (flags map one-to-one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spcli.config.run import DTYPES
from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig, SelectConfig, check, check_speculator_chunk


@dataclass(frozen=True)
class BenchConfig:
    model: str = "smollm2-135m"  # or random-405b: the random pair with the 8B/405B cost ratio
    speculator: str | None = None  # None = the model's default (random-8b for random-405b)
    keeps: tuple[float, ...] = (0.1, 0.3, 0.5)
    lengths: tuple[int, ...] = (2048,)
    batch: int = 1  # prompts per batch: the speculator reads them one by one, the base prefills them together
    repeats: int = 3  # timed repetitions (the best is reported); full and spcli runs interleave within one
    warmup: int = 1  # untimed repetitions first
    max_tokens: int = 16  # decoded tokens per prompt for the end-to-end throughput
    ttft_limit_s: float | None = None  # for max QPS; None = 2 x the full-prefill TTFT of one batch
    seed: int = 0  # which essay windows become the prompts
    dtype: str | None = None
    speculator_dtype: str | None = None  # None or auto: spcli.models.dtype.resolve_speculator_dtype
    device: str = "auto"
    json: bool = False
    speculator_chunk: int = SPECULATOR_CHUNK  # tokens per speculator prefill call (memory only)
    select: SelectConfig = field(default_factory=lambda: SelectConfig(keep=1.0))  # keep comes from `keeps`
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def __post_init__(self) -> None:
        check(bool(self.keeps) and all(0.0 < k < 1.0 for k in self.keeps), f"--keep values must be in (0, 1), got {self.keeps}")
        check(bool(self.lengths) and all(n >= 16 for n in self.lengths), f"--lengths must be >= 16 tokens, got {self.lengths}")
        check(self.batch >= 1, f"--batch must be >= 1, got {self.batch}")
        check(self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}")
        check(self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}")
        check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        check(self.ttft_limit_s is None or self.ttft_limit_s > 0, f"--ttft-limit must be > 0 seconds, got {self.ttft_limit_s}")
        check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_speculator_chunk(self.speculator_chunk)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
