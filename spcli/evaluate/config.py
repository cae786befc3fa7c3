"""`spcli eval` configuration: a frozen dataclass validated on construction (flags map one-to-one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spcli.config.run import DTYPES, FieldConfig
from spcli.config.scoring import SPECULATOR_CHUNK, ScoreConfig, SelectConfig, check, check_speculator_chunk
from spcli.errors import ConfigError
from spcli.evaluate.selectors import SELECTORS, USES_SPECULATOR, check_selectors
from spcli.evaluate.tasks import TASKS


def split_list(text: str, kind: type, flag: str) -> tuple:
    """'0.1,0.3' -> (0.1, 0.3); a clear error naming the flag otherwise."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    try:
        return tuple(kind(s) for s in items)
    except ValueError:
        raise ConfigError(f"{flag} takes a comma-separated list of {kind.__name__} values, got {text!r}") from None


def parse_policy(text: str, default_scale: float = SelectConfig.keep_scale) -> float | str:
    """One --keep value: a rate in (0, 1], or auto / auto:P (keep = auto with keep_scale P) -> "auto:P"."""
    text = text.strip().lower()
    if text == "auto" or text.startswith("auto:"):
        scale = text.partition(":")[2] or str(default_scale)
        try:
            value = float(scale)
        except ValueError:
            raise ConfigError(f"--keep auto:P needs a scale P in (0, 100], got {text!r}") from None
        check(0.0 < value <= 100.0, f"--keep auto:P needs a scale P in (0, 100], got {text!r}")
        return f"auto:{value:g}"
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--keep takes rates in (0, 1] and auto:P policies, comma-separated, got {text!r}") from None


def _switch(text: str) -> bool:
    """'1'/'on'/'true' or '0'/'off'/'false'."""
    if text.lower() in ("1", "on", "true"):
        return True
    if text.lower() in ("0", "off", "false"):
        return False
    raise ValueError(text)


VARIANT_FIELDS = {"lookahead": int, "window": int, "score_layers": str, "pool": int, "rows": str, "chunk": int,
                  "unit": str, "max_unit": int, "unit_score": str, "min_free": int, "protect": str, "restate": _switch}
SELECT_VARIANT_FIELDS = ("chunk", "unit", "max_unit", "unit_score", "min_free", "protect")  # SelectConfig's; the rest ScoreConfig's


def parse_variant(text: str) -> tuple[tuple[str, object], ...]:
    """--variant 'rows=max,window=16' -> (("rows", "max"), ("window", 16)): settings of the first speculator
    changed for a compared row, `specprefill[rows=max,window=16]`."""
    items = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in VARIANT_FIELDS:
            raise ConfigError(f"--variant takes KEY=VALUE pairs, comma-separated, KEY one of "
                              f"{', '.join(VARIANT_FIELDS)}; got {text!r}")
        try:
            items.append((key, VARIANT_FIELDS[key](value.strip())))
        except ValueError:
            kind = "0 or 1" if key == "restate" else "an integer"
            raise ConfigError(f"--variant {key} takes {kind}, got {value!r}") from None
    check(bool(items), f"--variant needs at least one KEY=VALUE, got {text!r}")
    return tuple(items)


def variant_label(variant: tuple[tuple[str, object], ...]) -> str:
    return "specprefill[" + ",".join(f"{k}={v}" for k, v in variant) + "]"


def split_keeps(text: str, default_scale: float = SelectConfig.keep_scale) -> tuple:
    return tuple(parse_policy(s, default_scale) for s in text.split(",") if s.strip())


def is_auto(policy: float | str) -> bool:
    return isinstance(policy, str)


def policy_select(select: SelectConfig, policy: float | str) -> tuple[SelectConfig, float | str]:
    """The selection config and keep that implement a --keep policy: auto:P is keep auto, keep_scale P."""
    if is_auto(policy):
        return dataclasses.replace(select, keep="auto", keep_scale=float(policy.partition(":")[2])), "auto"
    return select, policy


def policy_order(policy: float | str) -> tuple:
    """Sort key: fixed rates ascending, then auto policies by scale."""
    return (1, float(policy.partition(":")[2])) if is_auto(policy) else (0, policy)


def policy_label(policy: float | str) -> str:
    return policy if is_auto(policy) else f"{policy:.2f}"


@dataclass(frozen=True)
class EvalConfig:
    out: str
    inputs: tuple[str, ...] = ()  # JSONL/Parquet shards (an optional `answer` field: string or list of alternatives)
    tasks: tuple[str, ...] = ()  # built-in tasks, generated from `seed`
    lengths: tuple[int, ...] = (2048,)  # target prompt tokens of built-in tasks
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default
    extra_speculators: tuple[str, ...] = ()  # `--speculator A,B,...`: B... compared with A, rows `specprefill@B`
    variants: tuple[tuple[tuple[str, object], ...], ...] = ()  # `--variant rows=max`: A with other settings
    keeps: tuple[float | str, ...] = (0.1, 0.3, 0.5, 1.0)  # rates, and "auto:P" policies (keep auto, keep_scale P)
    selectors: tuple[str, ...] = SELECTORS
    samples: int = 20  # per task and length (built-in), or the first N records of the inputs
    seed: int = 0  # task generation and random selection
    max_tokens: int | None = None  # None = each example's own: the task's (32-64) or the record's (else 24)
    compare_tokens: int = 16  # greedy tokens compared with full prefill for exact match
    bootstrap: int = 2000  # resamples per confidence interval
    dtype: str | None = None
    speculator_dtype: str | None = None  # None or auto: spcli.models.dtype.resolve_speculator_dtype
    device: str = "auto"
    html: bool = False
    match_auto: bool = True  # per auto policy, also a fixed keep at its mean kept fraction (adaptive vs fixed, paired)
    speculator_chunk: int = SPECULATOR_CHUNK  # tokens per speculator prefill call (memory only)
    select: SelectConfig = field(default_factory=lambda: SelectConfig(keep=1.0))  # keep is per run: `keeps`
    score: ScoreConfig = field(default_factory=ScoreConfig)
    fields: FieldConfig = field(default_factory=FieldConfig)  # INPUT's field names, as `spcli run --prompt-field` ...

    def __post_init__(self) -> None:
        check(bool(self.inputs) or bool(self.tasks), "give INPUT files or at least one --task")
        for t in self.tasks:
            check(t in TASKS, f"unknown task {t!r}: use one of {', '.join(TASKS)}")
        check(bool(self.keeps) and all(is_auto(k) or 0.0 < k <= 1.0 for k in self.keeps), f"--keep values must be in (0, 1], got {self.keeps}")
        for k in self.keeps:
            if is_auto(k):
                policy_select(self.select, k)  # validates the scale
        check(bool(self.selectors), f"--selector needs at least one of {', '.join(SELECTORS)}")
        check_selectors(self.selectors)
        check(not any(is_auto(k) for k in self.keeps) or any(s in USES_SPECULATOR for s in self.selectors),
               "--keep auto's budget comes from the speculator's importance: add specprefill to --selector")
        check(all(256 <= n <= 32768 for n in self.lengths), f"--lengths must be in [256, 32768] tokens, got {self.lengths}")
        check(self.samples >= 1, f"--samples must be >= 1, got {self.samples}")
        check(self.max_tokens is None or self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        check(self.compare_tokens >= 1, f"--compare-tokens must be >= 1, got {self.compare_tokens}")
        check(self.bootstrap >= 100, f"--bootstrap must be >= 100 resamples, got {self.bootstrap}")
        check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_speculator_chunk(self.speculator_chunk)
        for v in self.variants:  # validated like the flags they stand for
            dataclasses.replace(self.score, **{k: x for k, x in v if k not in SELECT_VARIANT_FIELDS})
            dataclasses.replace(self.select, **{k: x for k, x in v if k in SELECT_VARIANT_FIELDS})
        labels = [variant_label(v) for v in self.variants]
        check(len(set(labels)) == len(labels), f"--variant names a variant twice: {', '.join(labels)}")
        names = (self.speculator, *self.extra_speculators)
        check(len(set(names)) == len(names), f"--speculator names a speculator twice: {', '.join(map(str, names))}")

    @property
    def pruned_keeps(self) -> tuple[float | str, ...]:
        return tuple(sorted({k for k in self.keeps if is_auto(k) or k < 1.0}, key=policy_order))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
