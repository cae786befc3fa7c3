"""`spcli calibrate` configuration: a frozen dataclass validated on construction (flags map one-to-one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spcli.config.run import DTYPES
from spcli.config.scoring import ROWS, SelectConfig, check
from spcli.evaluate.metrics import FACT_MEASURES
from spcli.evaluate.tasks import TASKS


@dataclass(frozen=True)
class CalibrateConfig:
    out: str = "out/calibrate"
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default speculator; layers are the speculator's
    tasks: tuple[str, ...] = ("niah", "niah-multi", "multidoc-qa")  # built-in, seeded; recall needs their needles
    hold_out: tuple[str, ...] = ()  # tasks measured and reported but not chosen on (each one of `tasks`)
    lengths: tuple[int, ...] = (2048, 4096)  # target prompt tokens
    samples: int = 8  # examples per task and length
    keeps: tuple[float, ...] = (0.1, 0.2)  # the target must hold at every one
    windows: tuple[int, ...] = (16, 32, 64)  # observation windows W (last W prompt queries, causal)
    target_recall: float = 0.95  # mean of `metric` each task must reach at each keep
    metric: str = "facts"  # facts: share of fact sentences kept whole (what answers need); tokens: of fact tokens kept
    max_cost: float | None = None  # speed budget: the best recall among layers costing at most this share of a forward
    pools: tuple[int, ...] = ()  # average-pool kernels swept; () = the model's one (spcli.models.profiles)
    chunks: tuple[int, ...] = ()  # selection chunks swept; () = the model's one
    rows: tuple[str, ...] = ()  # row aggregations swept (mean, max); () = the model's one
    paper: bool = True  # also score the paper's recipe (every layer, look-ahead 8) for reference
    write_profile: bool = False  # store the choice where `spcli run` picks it up
    dtype: str | None = None
    speculator_dtype: str | None = None  # None or auto: spcli.models.dtype.resolve_speculator_dtype
    device: str = "auto"
    seed: int = 0
    select: SelectConfig = field(default_factory=lambda: SelectConfig(keep=1.0))  # keep is per sweep: `keeps`

    def __post_init__(self) -> None:
        check(bool(self.tasks), "--tasks needs at least one built-in task")
        for t in self.tasks:
            check(t in TASKS, f"unknown task {t!r}: use one of {', '.join(TASKS)}")
        check(all(t in self.tasks for t in self.hold_out), f"--hold-out {self.hold_out}: each must be one of --tasks {self.tasks}")
        check(len(set(self.hold_out)) < len(set(self.tasks)), "--hold-out leaves no task to choose on")
        check(bool(self.lengths) and all(256 <= n <= 32768 for n in self.lengths),
               f"--lengths must be in [256, 32768] tokens, got {self.lengths}")
        check(self.samples >= 1, f"--samples must be >= 1, got {self.samples}")
        check(bool(self.keeps) and all(0.0 < k < 1.0 for k in self.keeps), f"--keep values must be in (0, 1), got {self.keeps}")
        check(bool(self.windows) and all(w >= 1 for w in self.windows), f"--windows must be >= 1, got {self.windows}")
        check(len(set(self.windows)) == len(self.windows), f"--windows has repeats: {self.windows}")
        check(self.metric in FACT_MEASURES, f"--metric must be one of {', '.join(FACT_MEASURES)}, got {self.metric!r}")
        check(0.0 < self.target_recall <= 1.0, f"--target-recall must be in (0, 1], got {self.target_recall}")
        check(all(p >= 1 and p % 2 == 1 for p in self.pools), f"--pool values must be odd numbers >= 1, got {self.pools}")
        check(all(c >= 1 for c in self.chunks), f"--chunk values must be >= 1, got {self.chunks}")
        check(len(set(self.pools)) == len(self.pools) and len(set(self.chunks)) == len(self.chunks),
               f"--pool / --chunk have repeats: {self.pools} / {self.chunks}")
        check(self.max_cost is None or 0.0 < self.max_cost <= 1.0, f"--max-cost must be in (0, 1], got {self.max_cost}")
        check(all(r in ROWS for r in self.rows) and len(set(self.rows)) == len(self.rows),
               f"--rows values must be {' or '.join(ROWS)}, without repeats, got {self.rows}")
        check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def max_window(self) -> int:
        return max(self.windows)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
