"""Run configuration: frozen dataclasses validated on construction.

The Typer layer (`spcli.cli`) maps flags one-to-one onto these fields and holds no logic.
Everything that changes outputs is part of `RunConfig.fingerprint_fields()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spcli.errors import ConfigError

DTYPES = ("bfloat16", "float16", "float32")
ENGINES = ("hf", "vllm")
OUTPUT_FORMATS = ("parquet", "jsonl", "openai")
TRUNCATE_POLICIES = ("error", "left", "middle")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class SelectConfig:
    """Which prompt tokens the base model prefills (DESIGN.md steps 6-8)."""

    keep: float = 0.1  # fraction of prompt tokens kept; 1.0 = full prefill, no speculator
    chunk: int = 32  # tokens per chunk; chunks are kept or dropped whole
    keep_first: int = 4  # attention sink / BOS, always kept
    keep_last: int = 64  # question + generation prompt, always kept
    min_tokens: int = 256  # prompts shorter than this are not pruned

    def __post_init__(self) -> None:
        _check(0.0 < self.keep <= 1.0, f"--keep must be in (0, 1], got {self.keep}")
        _check(self.chunk >= 1, f"--chunk must be >= 1, got {self.chunk}")
        _check(self.keep_first >= 0, f"--keep-first must be >= 0, got {self.keep_first}")
        _check(self.keep_last >= 0, f"--keep-last must be >= 0, got {self.keep_last}")
        _check(self.min_tokens >= 0, f"--min-tokens must be >= 0, got {self.min_tokens}")


@dataclass(frozen=True)
class ScoreConfig:
    """How the speculator scores tokens (DESIGN.md steps 1-5)."""

    lookahead: int = 8  # greedy tokens decoded past the prompt; lookahead + 1 query rows score
    pool: int = 13  # average-pool kernel along the token axis; 1 = no smoothing
    impl: str = "auto"  # scoring kernel: auto | torch | triton

    def __post_init__(self) -> None:
        _check(self.lookahead >= 0, f"--lookahead must be >= 0, got {self.lookahead}")
        _check(self.pool >= 1 and self.pool % 2 == 1, f"--pool must be an odd number >= 1, got {self.pool}")
        _check(self.impl in ("auto", "torch", "triton"), f"--score-impl must be auto, torch or triton, got {self.impl!r}")


@dataclass(frozen=True)
class GenerateConfig:
    """Decoding after the (pruned) prefill."""

    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # sampling seed; each row draws from its own generator seeded by (seed, id)

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(self.temperature >= 0.0, f"--temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class FieldConfig:
    """Names of the input record fields."""

    prompt: str = "prompt"
    messages: str = "messages"
    id: str = "id"


@dataclass(frozen=True)
class VllmConfig:
    """vLLM engine settings (--engine vllm); None = the model preset's value, else vLLM's default.

    None of them changes outputs, so none is fingerprinted.
    """

    tp: int | None = None  # tensor-parallel size
    max_model_len: int | None = None  # per-request KV capacity: kept tokens + max_tokens
    gpu_memory_utilization: float | None = None  # None = computed to leave room for the speculator
    max_num_batched_tokens: int | None = None  # tokens per scheduler step; small = chunked prefill
    enforce_eager: bool | None = None  # None = eager on CPU (compiling costs minutes), compiled on GPU

    def __post_init__(self) -> None:
        _check(self.tp is None or self.tp >= 1, f"--tp must be >= 1, got {self.tp}")
        _check(self.max_model_len is None or self.max_model_len >= 1, f"--max-model-len must be >= 1, got {self.max_model_len}")
        _check(self.gpu_memory_utilization is None or 0.0 < self.gpu_memory_utilization <= 1.0,
               f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
               f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class RunConfig:
    inputs: tuple[str, ...]
    out: str
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default speculator; "self:K" = its first K layers
    engine: str = "hf"
    dtype: str | None = None  # None = the model's default dtype
    device: str = "auto"
    batch_size: int = 8
    output_format: str = "parquet"
    save_scores: bool = False
    truncate: str = "error"
    max_record_bytes: int = 8 << 20  # longer records become error rows before they are parsed or tokenized
    commit_interval: float = 10.0  # seconds between commits (0 = after every batch); a stop always commits
    fresh: bool = False
    force: bool = False
    select: SelectConfig = field(default_factory=SelectConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    fields: FieldConfig = field(default_factory=FieldConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)

    def __post_init__(self) -> None:
        _check(len(self.inputs) > 0, "give at least one INPUT file, glob or directory")
        _check(self.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        _check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        _check(self.output_format in OUTPUT_FORMATS, f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        _check(self.truncate in TRUNCATE_POLICIES, f"--truncate must be one of {', '.join(TRUNCATE_POLICIES)}, got {self.truncate!r}")
        _check(self.max_record_bytes >= 1, f"--max-record-bytes must be >= 1, got {self.max_record_bytes}")
        _check(self.commit_interval >= 0, f"--commit-interval must be >= 0, got {self.commit_interval}")
        _check(not (self.fresh and self.force), "--fresh and --force cannot be used together")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint_fields(self) -> dict:
        """Everything that changes outputs (inputs' identity is added by the manifest)."""
        d = self.to_dict()
        for k in ("inputs", "out", "batch_size", "commit_interval", "fresh", "force", "device"):
            d.pop(k)
        d["score"].pop("impl")
        d.pop("vllm")  # parallelism and memory: same outputs
        return d
