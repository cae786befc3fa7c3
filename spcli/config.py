"""Run configuration: frozen dataclasses validated on construction.

The Typer layer (`spcli.cli`) maps flags one-to-one onto these fields and holds no logic.
Everything that changes outputs is part of `RunConfig.fingerprint_fields()`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from spcli.errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")  # auto: per device (spcli.dtype)
ENGINES = ("hf", "vllm")
KV_CACHE_DTYPES = ("auto", "fp8")
PLACEMENTS = ("auto", "workers", "driver")  # where the speculator runs on --engine vllm (auto: spcli.resolved)
OVERLAPS = ("auto", "on", "off")  # --speculator-overlap: auto = on with GPU workers, off on CPU (spcli.engine.replica_queue)
ROWS = ("mean", "max")  # how spcli.kernels.score combines the query rows' scores
OUTPUT_FORMATS = ("parquet", "jsonl", "openai")
TRUNCATE_POLICIES = ("error", "left", "middle")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_speculator_chunk(chunk: int) -> None:
    _check(chunk >= 1, f"--speculator-chunk must be >= 1, got {chunk}")


SPLIT_ROWS = 10_000  # --ray: rows per range of a larger file (spcli.ray.pieces); a unit of work and of resume
SPECULATOR_CHUNK = 8192  # tokens per speculator prefill call: its activations are one chunk's, not the prompt's
AUTO = "auto"  # keep = auto: a per-prompt budget from the importance itself (keep_scale, keep_min, keep_max)
AUTO_CRITERION = "perplexity-unpooled"  # keep = auto's budget: spcli.engine.select.auto_budget (issue 20)
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
    _check(0.0 < value <= 1.0, f"{flag} must be in (0, 1] or auto, got {value}")
    return value


UNITS = ("sentence", "word", "chunk")  # spcli.engine.units
MIN_TOKENS = 512  # docs/results.md, Selection units and short prompts
MIN_FREE = 128  # docs/results.md, Selection units and short prompts
MAX_UNIT = 32
MAX_PRUNE_COST = 0.9  # spcli.engine.pays: a prompt whose pruning would cost this share of its full prefill is prefilled whole
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
    chunk: int | None = None  # tokens per chunk, kept or dropped whole; None = the model's (spcli.profiles)
    keep_first: int = 4  # attention sink / BOS, always kept
    keep_last: int = 64  # question + generation prompt, always kept
    min_tokens: int = MIN_TOKENS  # prompts shorter than this are not pruned
    min_free: int = MIN_FREE  # at least this many tokens chosen beyond the forced first/last ones
    unit: str = "sentence"  # what is kept or dropped whole: sentence | word | chunk (spcli.engine.units)
    max_unit: int = MAX_UNIT  # unit sentence: a longer sentence is split into word-aligned pieces of ~chunk tokens
    unit_score: str = "mean"  # a unit's score from its tokens' importance: mean | max | topK (mean of its K best)
    protect: str = PROTECT  # never dropped, outside the budget: messages of these roles, and `instruction` (the field)
    keep_scale: float = KEEP_SCALE  # keep = auto: this many times the chunks that stand out (auto_budget) ...
    keep_min: float = 0.05  # ... but at least this fraction of the prompt ...
    keep_max: float = 0.5  # ... and at most this one
    max_prune_cost: float = MAX_PRUNE_COST  # prune a prompt only where speculator + kept cost less than this share of
    # its full prefill, in FLOPs (spcli.engine.pays); inf: always

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", parse_keep(self.keep))  # the flag's text ("0.1", "auto") or a number
        _check(self.chunk is None or self.chunk >= 1, f"--chunk must be >= 1, got {self.chunk}")
        _check(self.keep_first >= 0, f"--keep-first must be >= 0, got {self.keep_first}")
        _check(self.keep_last >= 0, f"--keep-last must be >= 0, got {self.keep_last}")
        _check(self.min_tokens >= 0, f"--min-tokens must be >= 0, got {self.min_tokens}")
        _check(self.min_free >= 0, f"--min-free must be >= 0, got {self.min_free}")
        _check(self.unit in UNITS, f"--unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        _check(self.max_unit >= 1, f"--max-unit must be >= 1, got {self.max_unit}")
        _check(all(re.fullmatch(r"[A-Za-z_]+", p) for p in self.protect_roles()),
               f"--protect takes chat roles and 'instruction', comma-separated, got {self.protect!r}")
        _check(parse_unit_score(self.unit_score) is not None,
               f"--unit-score must be mean, max or topK (K >= 1, e.g. top4), got {self.unit_score!r}")
        _check(0.0 < self.keep_scale <= 100.0, f"--keep-scale must be in (0, 100], got {self.keep_scale}")
        _check(0.0 < self.keep_min <= 1.0, f"--keep-min must be in (0, 1], got {self.keep_min}")
        _check(0.0 < self.keep_max <= 1.0, f"--keep-max must be in (0, 1], got {self.keep_max}")
        _check(self.max_prune_cost > 0.0, f"--max-prune-cost must be > 0 (inf: always prune), got {self.max_prune_cost}")
        _check(self.keep_min <= self.keep_max, f"--keep-min ({self.keep_min}) must not exceed --keep-max ({self.keep_max})")

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
    else its preset, else the paper's recipe `PAPER_SCORE`); `spcli.profiles.resolve` fills them.
    """

    lookahead: int | None = None  # greedy tokens decoded past the prompt; each adds a query row
    window: int | None = None  # the last W prompt tokens' queries score, each causally; 0 = the last token only
    score_layers: str | None = None  # all | I | I-J | I,J,... (the speculator's layers; negatives from the end)
    pool: int | None = None  # average-pool kernel along the token axis; 1 = no smoothing
    rows: str | None = None  # mean | max: how the query rows' scores (each the max over heads, layers) combine
    impl: str = "auto"  # scoring kernel: auto | torch | triton
    restate: bool = True  # the speculator reads a record's instruction again after its prompt (spcli.engine.restate)

    def __post_init__(self) -> None:
        _check(self.lookahead is None or self.lookahead >= 0, f"--lookahead must be >= 0, got {self.lookahead}")
        _check(self.window is None or self.window >= 0, f"--window must be >= 0, got {self.window}")
        if self.score_layers is not None:
            parse_layers(self.score_layers)
        _check(self.pool is None or (self.pool >= 1 and self.pool % 2 == 1),
               f"--pool must be an odd number >= 1, got {self.pool}")
        _check(self.rows in (None, *ROWS), f"--rows must be {' or '.join(ROWS)}, got {self.rows!r}")
        _check(self.impl in ("auto", "torch", "triton"), f"--score-impl must be auto, torch or triton, got {self.impl!r}")

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
        _check(m is not None, f"--score-layers must be all, I, I-J or a list such as 3,5-7 (negatives from the end), "
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
        _check(0 <= a <= b < num_layers,
               f"--score-layers {spec!r} names layers outside 0..{num_layers - 1} (the speculator has {num_layers})")
        out.update(range(a, b + 1))
    return sorted(out)


@dataclass(frozen=True)
class GenerateConfig:
    """Decoding after the (pruned) prefill."""

    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # sampling seed; each row draws from its own generator seeded by (seed, id)
    logprobs: int = 0  # top alternatives per generated token in the output; 0 = no logprobs

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(0 <= self.logprobs <= 20, f"--logprobs must be in [0, 20], got {self.logprobs}")
        _check(self.temperature >= 0.0, f"--temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class FieldConfig:
    """Names of the input record fields, and where a record's instruction goes."""

    prompt: str = "prompt"
    messages: str = "messages"
    id: str = "id"
    instruction: str = "instruction"  # text put beside the prompt (or a user message) and never dropped
    instruction_at: str = "after"  # after the prompt (or the last user message's content) | before it (or the first's)

    def __post_init__(self) -> None:
        _check(self.instruction_at in INSTRUCTION_PLACES,
               f"--instruction-at must be one of {', '.join(INSTRUCTION_PLACES)}, got {self.instruction_at!r}")


@dataclass(frozen=True)
class VllmConfig:
    """vLLM engine settings (--engine vllm); None = the model preset's value, else vLLM's default.

    None of them changes outputs but kv_cache_dtype, which alone is fingerprinted (where not auto).
    """

    tp: int | None = None  # tensor-parallel size
    max_model_len: int | None = None  # per-request KV capacity: kept tokens + max_tokens
    max_prompt_len: int | None = None  # the speculator's longest prompt (its GPU reserve); None = the plan's default (spcli.plan.plan.default_prompt_len)
    gpu_memory_utilization: float | None = None  # None = computed to leave room for the speculator
    max_num_batched_tokens: int | None = None  # tokens per scheduler step; small = chunked prefill
    enforce_eager: bool | None = None  # None = eager on CPU (compiling costs minutes), compiled on GPU
    max_num_seqs: int | None = None  # requests in one scheduler step; None = vLLM's
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8: half the KV bytes (changes outputs: fingerprinted)
    speculator_placement: str = "auto"  # workers: a replica in every vLLM worker; driver: this process; auto: resolved.placement_for
    speculator_overlap: str = "auto"  # workers score window k + 1 on their own thread while vLLM runs window k

    def __post_init__(self) -> None:
        _check(self.max_num_seqs is None or self.max_num_seqs >= 1, f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        _check(self.speculator_placement in PLACEMENTS,
               f"--speculator-placement must be one of {', '.join(PLACEMENTS)}, got {self.speculator_placement!r}")
        _check(self.speculator_overlap in OVERLAPS,
               f"--speculator-overlap must be one of {', '.join(OVERLAPS)}, got {self.speculator_overlap!r}")
        _check(self.speculator_overlap != "on" or self.speculator_placement != "driver",
               "--speculator-overlap on needs the speculator in vLLM's workers (--speculator-placement workers or auto: the replicas' own threads)")
        _check(self.tp is None or self.tp >= 1, f"--tp must be >= 1, got {self.tp}")
        _check(self.max_model_len is None or self.max_model_len >= 1, f"--max-model-len must be >= 1, got {self.max_model_len}")
        _check(self.max_prompt_len is None or self.max_prompt_len >= 1, f"--max-prompt-len must be >= 1, got {self.max_prompt_len}")
        _check(self.gpu_memory_utilization is None or 0.0 < self.gpu_memory_utilization <= 1.0,
               f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
               f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")


HF_BATCH = 8  # --engine hf's rows per batch where --batch-size is not given


@dataclass(frozen=True)
class RunConfig:
    inputs: tuple[str, ...]
    out: str
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default speculator; "self:K" = its first K layers
    engine: str = "hf"
    dtype: str | None = "auto"  # auto (or None): per device, spcli.dtype.resolve_dtype
    device: str = "auto"
    batch_size: int | None = None  # hf: rows per batch (None: HF_BATCH); vllm: the speculator window (None: vllm_stream.window)
    output_format: str = "parquet"
    save_scores: bool = False
    truncate: str = "error"
    max_record_bytes: int = 8 << 20  # longer records become error rows before they are parsed or tokenized
    commit_interval: float = 10.0  # seconds between commits (0 = after every batch); a stop always commits
    speculator_chunk: int = SPECULATOR_CHUNK  # tokens per speculator prefill call (memory only: same outputs)
    fresh: bool = False
    force: bool = False
    retry_failed: bool = False  # redo the committed error rows (each replaced in place), then go on
    pass_through: tuple[str, ...] = ()  # input columns copied into the output rows (a comma-separated string is split)
    ray: str | None = None  # None: this process; "": a local Ray cluster (started or joined); else its address
    ray_workers: int | None = None  # actors of a Ray run (None: as many as the cluster's GPUs or CPUs hold)
    split_rows: int | None = None  # --ray: files of more rows run as ranges of this many (None: SPLIT_ROWS; 0: whole)
    select: SelectConfig = field(default_factory=SelectConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    fields: FieldConfig = field(default_factory=FieldConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)

    def __post_init__(self) -> None:
        _check(len(self.inputs) > 0, "give at least one INPUT file, glob or directory")
        _check(self.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        _check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check(self.batch_size is None or self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        _check(self.output_format in OUTPUT_FORMATS, f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        _check(self.truncate in TRUNCATE_POLICIES, f"--truncate must be one of {', '.join(TRUNCATE_POLICIES)}, got {self.truncate!r}")
        _check(self.max_record_bytes >= 1, f"--max-record-bytes must be >= 1, got {self.max_record_bytes}")
        _check(self.commit_interval >= 0, f"--commit-interval must be >= 0, got {self.commit_interval}")
        _check(not (self.fresh and self.force), "--fresh and --force cannot be used together")
        check_speculator_chunk(self.speculator_chunk)
        _check(not (self.fresh and self.retry_failed), "--fresh and --retry-failed cannot be used together "
                                                       "(--fresh deletes the rows to retry)")
        columns = self.pass_through.split(",") if isinstance(self.pass_through, str) else self.pass_through or ()
        object.__setattr__(self, "pass_through", tuple(dict.fromkeys(c.strip() for c in columns)))
        _check(all(self.pass_through), f"--pass-through takes column names, comma-separated, got {self.pass_through}")
        _check(self.ray_workers is None or self.ray_workers >= 1, f"--ray-workers must be >= 1, got {self.ray_workers}")
        _check(self.ray_workers is None or self.ray is not None, "--ray-workers needs --ray")
        _check(self.split_rows is None or self.split_rows >= 0, f"--split-rows must be >= 0, got {self.split_rows}")
        _check(self.split_rows is None or self.ray is not None, "--split-rows needs --ray")

    @property
    def hf_batch(self) -> int:
        """Rows per batch of the batch loop (--engine hf, and --retry-failed's redo)."""
        return self.batch_size or HF_BATCH

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint_fields(self) -> dict:
        """Everything that changes outputs (inputs' identity is added by the manifest)."""
        d = self.to_dict()
        for k in ("inputs", "out", "batch_size", "commit_interval", "speculator_chunk", "fresh", "force", "retry_failed",
                  "device", "ray", "ray_workers", "split_rows"):
            d.pop(k)
        d["score"].pop("impl")
        if d["select"]["keep"] == AUTO:  # the budget's criterion changed with issue 20: older auto outputs differ
            d["select"]["auto_criterion"] = AUTO_CRITERION
        else:  # unused at a fixed keep; its predecessor's default stands in so that directories made before resume
            del d["select"]["keep_scale"]
            d["select"]["keep_mass"] = 0.8
        if d["select"]["unit"] == "chunk":  # fixed chunks select as before units existed: those directories resume
            for k in ("unit", "max_unit", "unit_score"):
                del d["select"][k]
        if d["select"]["min_free"] == 0:  # likewise the budget before its floor
            del d["select"]["min_free"]
        if d["select"]["max_prune_cost"] == math.inf:  # and every prompt pruned, as before --max-prune-cost
            del d["select"]["max_prune_cost"]
        if not d["select"]["protect"]:  # and nothing protected
            del d["select"]["protect"]
        if d["score"]["rows"] in (None, "mean"):  # mean is what runs before --rows did: their directories resume
            d["score"].pop("rows")
        if not d["score"]["restate"]:  # and without restating, what ran before --restate
            d["score"].pop("restate")
        if d["fields"]["instruction_at"] == "before":  # where instructions went before --instruction-at: those resume
            del d["fields"]["instruction_at"]
        d.pop("vllm")  # parallelism, memory and placement: same outputs
        if not d["pass_through"]:  # absent without it, as before: those directories resume
            d.pop("pass_through")
        if self.vllm.kv_cache_dtype != "auto":  # fp8 KV rounds differently; absent at auto, as before
            d["kv_cache_dtype"] = self.vllm.kv_cache_dtype
        return d
