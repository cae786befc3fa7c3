"""What the speculator scores (ScoreConfig, DESIGN.md steps 1-6) and which tokens selection keeps (SelectConfig, steps 7-9),
with the measured defaults and where each was measured."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spcli.errors import ConfigError

ROWS = ("mean", "max")  # how spcli.kernels.score combines the query rows' scores


def check_speculator_chunk(chunk: int) -> None:
    check(chunk >= 1, f"--speculator-chunk must be >= 1, got {chunk}")


SPECULATOR_CHUNK = 8192  # tokens per speculator prefill call: its activations are one chunk's, not the prompt's


SPECULATOR_BATCH_TOKENS = 32768  # padded tokens per speculator forward (spcli.stages.prepare batches prompts up to it)


MASK_ELEMENTS = 1 << 24  # mask elements per sdpa call with a mask (spcli.models.capture): 16 MiB boolean, 64 MiB additive float32


AUTO = "auto"  # keep = auto: a per-prompt budget from the importance itself (keep_scale, keep_min, keep_max)


AUTO_CRITERION = "perplexity-unpooled"  # keep = auto's budget: spcli.stages.select.auto_budget (issue 20)


KEEP_SCALE = 1.5  # measured: docs/results.md, keep auto


def parse_keep(text: str | float, flag: str = "--keep") -> float | str:
    """A keep rate: a number in (0, 1] or "auto"; a clear error naming the flag otherwise."""
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    try:
        if isinstance(text, bool):
            raise TypeError
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number in (0, 1] or auto, got {text!r}") from None
    check(0.0 < value <= 1.0, f"{flag} must be in (0, 1] or auto, got {value}")
    return value


UNITS = ("clause", "sentence", "word", "chunk")  # spcli.stages.units


MIN_TOKENS = 512  # docs/results.md, Selection units and short prompts


MIN_FREE = 128  # docs/results.md, Selection units and short prompts


MAX_UNIT = 32


MAX_PRUNE_COST = 0.9  # spcli.stages.pays: a prompt whose pruning would cost this share of its full prefill is prefilled whole


PROTECT = "system,instruction"  # chat roles whose messages are never dropped, and the record's instruction field


INSTRUCTION_PLACES = ("after", "before")  # --instruction-at: where a record's instruction goes beside its prompt


INSTRUCTION = "instruction"  # in --protect: the record's instruction (FieldConfig.instruction), put beside its prompt


def parse_unit_score(text: str) -> tuple[str, int] | None:
    """'mean' | 'max' | 'topK' -> (reduction, K); None when malformed."""
    if text in ("mean", "max"):
        return text, 0
    m = re.fullmatch(r"top(\d+)", text or "")
    return ("top", int(m[1])) if m and int(m[1]) >= 1 else None


@dataclass(frozen=True)
class SelectConfig:
    """Which prompt tokens the base model prefills (DESIGN.md steps 7-9)."""

    keep: float | str = 0.1  # fraction of prompt tokens kept; 1.0 = full prefill, no speculator; "auto" = per prompt
    chunk: int | None = None  # tokens per chunk, kept or dropped whole; None = the model's (spcli.models.profiles)
    keep_first: int = 4  # attention sink / BOS, always kept
    keep_last: int = 64  # question + generation prompt, always kept
    min_tokens: int = MIN_TOKENS  # prompts shorter than this are not pruned
    min_free: int = MIN_FREE  # at least this many tokens chosen beyond the forced first/last ones
    unit: str = "clause"  # what is kept or dropped whole: clause | sentence | word | chunk (spcli.stages.units)
    max_unit: int = MAX_UNIT  # unit clause/sentence: a longer one is split into word-aligned pieces of ~chunk tokens
    unit_score: str = "mean"  # a unit's score from its tokens' importance: mean | max | topK (mean of its K best)
    protect: str = PROTECT  # never dropped, outside the budget: messages of these roles, and `instruction` (the field)
    keep_scale: float = KEEP_SCALE  # keep = auto: this many times the chunks that stand out (auto_budget) ...
    keep_min: float = 0.05  # ... but at least this fraction of the prompt ...
    keep_max: float = 0.5  # ... and at most this one
    max_prune_cost: float = MAX_PRUNE_COST  # prune a prompt only where speculator + kept cost less than this share of
    # its full prefill, in FLOPs (spcli.stages.pays); inf: always

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", parse_keep(self.keep))  # the flag's text ("0.1", "auto") or a number
        check(self.chunk is None or self.chunk >= 1, f"--chunk must be >= 1, got {self.chunk}")
        check(self.keep_first >= 0, f"--keep-first must be >= 0, got {self.keep_first}")
        check(self.keep_last >= 0, f"--keep-last must be >= 0, got {self.keep_last}")
        check(self.min_tokens >= 0, f"--min-tokens must be >= 0, got {self.min_tokens}")
        check(self.min_free >= 0, f"--min-free must be >= 0, got {self.min_free}")
        check(self.unit in UNITS, f"--unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        check(self.max_unit >= 1, f"--max-unit must be >= 1, got {self.max_unit}")
        check(all(re.fullmatch(r"[A-Za-z_]+", p) for p in self.protect_roles()),
               f"--protect takes chat roles and 'instruction', comma-separated, got {self.protect!r}")
        check(parse_unit_score(self.unit_score) is not None,
               f"--unit-score must be mean, max or topK (K >= 1, e.g. top4), got {self.unit_score!r}")
        check(0.0 < self.keep_scale <= 100.0, f"--keep-scale must be in (0, 100], got {self.keep_scale}")
        check(0.0 < self.keep_min <= 1.0, f"--keep-min must be in (0, 1], got {self.keep_min}")
        check(0.0 < self.keep_max <= 1.0, f"--keep-max must be in (0, 1], got {self.keep_max}")
        check(self.max_prune_cost > 0.0, f"--max-prune-cost must be > 0 (inf: always prune), got {self.max_prune_cost}")
        check(self.keep_min <= self.keep_max, f"--keep-min ({self.keep_min}) must not exceed --keep-max ({self.keep_max})")

    def protect_roles(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.protect.split(",") if p.strip())

    @property
    def prunes(self) -> bool:
        """Whether prompts (of at least min_tokens) go through the speculator at this keep."""
        return self.keep == AUTO or self.keep < 1.0


@dataclass(frozen=True)
class ScoreConfig:
    """How the speculator scores tokens (DESIGN.md steps 1-6).

    window, lookahead, score_layers, pool and rows may be None: the model's default (a calibrate profile,
    else its preset, else the paper's recipe `PAPER_SCORE`); `spcli.models.profiles.resolve` fills them.
    """

    lookahead: int | None = None  # greedy tokens decoded past the prompt; each adds a query row
    window: int | None = None  # the last W prompt tokens' queries score, each causally; 0 = the last token only
    score_layers: str | None = None  # all | I | I-J | I,J,... (the speculator's layers; negatives from the end)
    pool: int | None = None  # average-pool kernel along the token axis; 1 = no smoothing
    rows: str | None = None  # mean | max: how the query rows' scores (each the max over heads, layers) combine
    impl: str = "auto"  # scoring kernel: auto | torch | triton
    restate: bool = True  # the speculator reads a record's instruction again after its prompt (spcli.stages.restate)

    def __post_init__(self) -> None:
        check(self.lookahead is None or self.lookahead >= 0, f"--lookahead must be >= 0, got {self.lookahead}")
        check(self.window is None or self.window >= 0, f"--window must be >= 0, got {self.window}")
        if self.score_layers is not None:
            parse_layers(self.score_layers)
        check(self.pool is None or (self.pool >= 1 and self.pool % 2 == 1),
               f"--pool must be an odd number >= 1, got {self.pool}")
        check(self.rows in (None, *ROWS), f"--rows must be {' or '.join(ROWS)}, got {self.rows!r}")
        check(self.impl in ("auto", "torch", "triton"), f"--score-impl must be auto, torch or triton, got {self.impl!r}")

    @property
    def is_resolved(self) -> bool:
        return None not in (self.lookahead, self.window, self.score_layers, self.pool, self.rows)

    @property
    def num_prompt_rows(self) -> int:
        """Query rows from the prompt itself: the last `window` tokens, at least the last one."""
        return max(1, self.window or 0)

    def layers(self, num_layers: int) -> list[int]:
        """The scored layers' indices, ascending, for a speculator of num_layers layers."""
        assert self.score_layers is not None, "resolve the score configuration first"
        return resolve_layers(self.score_layers, num_layers)


PAPER_SCORE = {"lookahead": 8, "window": 0, "score_layers": "all", "pool": 13,
               "rows": "mean"}  # Speculative Prefill's recipe ...


PAPER_CHUNK = 32  # ... and its selection chunk


def parse_layers(spec: str) -> list[tuple[int, int]] | None:
    """'all' -> None; 'I', 'I-J', 'I,J,K-L' -> inclusive (start, end) ranges (negatives count from the end)."""
    if spec.strip().lower() == "all":
        return None
    ranges = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(-?\d+)(?:-(-?\d+))?\s*", part)
        check(m is not None, f"--score-layers must be all, I, I-J or a list such as 3,5-7 (negatives from the end), "
                              f"got {spec!r}")
        ranges.append((int(m[1]), int(m[2] if m[2] is not None else m[1])))
    return ranges


def resolve_layers(spec: str, num_layers: int) -> list[int]:
    ranges = parse_layers(spec)
    if ranges is None:
        return list(range(num_layers))
    out = set()
    for a, b in ranges:
        a, b = (a + num_layers if a < 0 else a), (b + num_layers if b < 0 else b)
        check(0 <= a <= b < num_layers,
               f"--score-layers {spec!r} names layers outside 0..{num_layers - 1} (the speculator has {num_layers})")
        out.update(range(a, b + 1))
    return sorted(out)


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
