"""Run configuration: frozen dataclasses validated on construction.

The Typer layer (`spcli.cli`) maps flags one-to-one onto these fields and holds no logic.
Everything that changes outputs is part of `RunConfig.fingerprint_fields()`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from spcli.config import sampling
from spcli.config.scoring import (
    AUTO,
    AUTO_CRITERION,
    INSTRUCTION_PLACES,
    SPECULATOR_CHUNK,
    ScoreConfig,
    SelectConfig,
    check,
    check_speculator_chunk,
)

# --groups: shard = a shard's records of one document (the same prompt text, or --group-field) wherever they stand
# (spcli.io.group_order); consecutive = only records one after another (spcli.io.groups); auto = shard, except on a
# directory made with the consecutive rule (its fingerprint's groups "auto"), which resumes with it (job.manifest.groups_for)
GROUPS = ("auto", "shard", "consecutive", "off")
GROUP_MAX = 16  # --group-max: a group's records, so its speculator pass and base prefill stay bounded
GROUP_RULES = ("union", "document")  # --group-rule: what a group keeps of its document (spcli.stages.share)
DTYPES = ("auto", "bfloat16", "float16", "float32")  # auto: per device (spcli.models.dtype)
ENGINES = ("hf", "vllm")
KV_CACHE_DTYPES = ("auto", "fp8")
PLACEMENTS = ("auto", "workers", "driver")  # where the speculator runs on --engine vllm (auto: spcli.models.resolved)
OVERLAPS = ("auto", "on", "off")  # --speculator-overlap: auto = on with GPU workers, off on CPU (spcli.engines.vllm.worker.replica_queue)
OUTPUT_FORMATS = ("parquet", "jsonl", "openai")
TRUNCATE_POLICIES = ("error", "left", "middle")


SPLIT_ROWS = 10_000  # --ray: rows per range of a larger file (spcli.ray.pieces); a unit of work and of resume


@dataclass(frozen=True)
class GenerateConfig:
    """Decoding after the (pruned) prefill: the job's defaults, which a record's own fields override
    (spcli.config.sampling: vLLM's SamplingParams names and meanings)."""

    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # sampling seed; each row draws from its own generator seeded by (seed, id), or by its record's seed
    logprobs: int = 0  # top alternatives per generated token in the output; 0 = no logprobs
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = every token
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()  # a string or several (a comma is part of the string)

    def __post_init__(self) -> None:
        check(self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        check(0 <= self.logprobs <= 20, f"--logprobs must be in [0, 20], got {self.logprobs}")
        check(self.temperature >= 0.0, f"--temperature must be >= 0, got {self.temperature}")
        for name in (*sampling.NAMES, "seed"):
            value, problem = sampling.check(name, getattr(self, name))
            check(problem is None, f"--{name.replace('_', '-')} {problem}")
            object.__setattr__(self, name, value)

    def sampling_defaults(self) -> sampling.Sampling:
        return sampling.Sampling(**{name: getattr(self, name) for name in sampling.NAMES})


@dataclass(frozen=True)
class FieldConfig:
    """Names of the input record fields, and where a record's instruction goes."""

    prompt: str = "prompt"
    messages: str = "messages"
    id: str = "id"
    instruction: str = "instruction"  # text put beside the prompt (or a user message) and never dropped
    instruction_at: str = "after"  # after the prompt (or the last user message's content) | before it (or the first's)
    group: str | None = None  # --group-field: records of equal values, one after another, share a document (spcli.io.groups)

    def __post_init__(self) -> None:
        check(self.instruction_at in INSTRUCTION_PLACES,
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
        check(self.max_num_seqs is None or self.max_num_seqs >= 1, f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        check(self.speculator_placement in PLACEMENTS,
               f"--speculator-placement must be one of {', '.join(PLACEMENTS)}, got {self.speculator_placement!r}")
        check(self.speculator_overlap in OVERLAPS,
               f"--speculator-overlap must be one of {', '.join(OVERLAPS)}, got {self.speculator_overlap!r}")
        check(self.speculator_overlap != "on" or self.speculator_placement != "driver",
               "--speculator-overlap on needs the speculator in vLLM's workers (--speculator-placement workers or auto: the replicas' own threads)")
        check(self.tp is None or self.tp >= 1, f"--tp must be >= 1, got {self.tp}")
        check(self.max_model_len is None or self.max_model_len >= 1, f"--max-model-len must be >= 1, got {self.max_model_len}")
        check(self.max_prompt_len is None or self.max_prompt_len >= 1, f"--max-prompt-len must be >= 1, got {self.max_prompt_len}")
        check(self.gpu_memory_utilization is None or 0.0 < self.gpu_memory_utilization <= 1.0,
               f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        check(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
               f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")


HF_BATCH = 8  # --engine hf's rows per batch where --batch-size is not given


@dataclass(frozen=True)
class RunConfig:
    inputs: tuple[str, ...]
    out: str
    model: str = "smollm2-135m"
    speculator: str | None = None  # None = the model's default speculator; "self:K" = its first K layers
    engine: str = "hf"
    dtype: str | None = "auto"  # auto (or None): per device, spcli.models.dtype.resolve_dtype
    speculator_dtype: str | None = "auto"  # auto (or None): spcli.models.dtype.resolve_speculator_dtype
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
    groups: str = "auto"  # records of one document share its speculator pass and kept set: GROUPS
    group_max: int = GROUP_MAX  # records per group at most
    group_rule: str = "union"  # union of the questions' selections, or one selection from all their scores together
    split_rows: int | None = None  # --ray: files of more rows run as ranges of this many (None: SPLIT_ROWS; 0: whole)
    select: SelectConfig = field(default_factory=SelectConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    fields: FieldConfig = field(default_factory=FieldConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)

    def __post_init__(self) -> None:
        check(len(self.inputs) > 0, "give at least one INPUT file, glob or directory")
        check(self.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        check(self.dtype is None or self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check(self.speculator_dtype is None or self.speculator_dtype in DTYPES,
              f"--speculator-dtype must be one of {', '.join(DTYPES)}, got {self.speculator_dtype!r}")
        check(self.batch_size is None or self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")
        check(self.output_format in OUTPUT_FORMATS, f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        check(self.truncate in TRUNCATE_POLICIES, f"--truncate must be one of {', '.join(TRUNCATE_POLICIES)}, got {self.truncate!r}")
        check(self.max_record_bytes >= 1, f"--max-record-bytes must be >= 1, got {self.max_record_bytes}")
        check(self.commit_interval >= 0, f"--commit-interval must be >= 0, got {self.commit_interval}")
        check(not (self.fresh and self.force), "--fresh and --force cannot be used together")
        check_speculator_chunk(self.speculator_chunk)
        check(not (self.fresh and self.retry_failed), "--fresh and --retry-failed cannot be used together "
                                                       "(--fresh deletes the rows to retry)")
        columns = self.pass_through.split(",") if isinstance(self.pass_through, str) else self.pass_through or ()
        object.__setattr__(self, "pass_through", tuple(dict.fromkeys(c.strip() for c in columns)))
        check(all(self.pass_through), f"--pass-through takes column names, comma-separated, got {self.pass_through}")
        check(self.ray_workers is None or self.ray_workers >= 1, f"--ray-workers must be >= 1, got {self.ray_workers}")
        check(self.ray_workers is None or self.ray is not None, "--ray-workers needs --ray")
        check(self.groups in GROUPS, f"--groups must be one of {', '.join(GROUPS)}, got {self.groups!r}")
        check(self.group_max >= 1, f"--group-max must be >= 1, got {self.group_max}")
        check(self.group_rule in GROUP_RULES, f"--group-rule must be one of {', '.join(GROUP_RULES)}, got {self.group_rule!r}")
        check(self.split_rows is None or self.split_rows >= 0, f"--split-rows must be >= 0, got {self.split_rows}")
        check(self.split_rows is None or self.ray is not None, "--split-rows needs --ray")
        check(self.engine != "vllm" or self.generate.temperature <= sampling.VLLM_MAX_TEMPERATURE,
              f"--temperature {self.generate.temperature}: --engine vllm applies at most "
              f"{sampling.VLLM_MAX_TEMPERATURE} (vLLM's SamplingParams)")

    @property
    def grouped(self) -> int | None:
        """--group-max where records are grouped, None with --groups off (each record alone)."""
        return None if self.groups == "off" else self.group_max

    @property
    def order_free(self) -> bool:
        """Whether a document's records are grouped wherever they stand in a shard (--groups shard, or auto)."""
        return self.groups in ("auto", "shard")

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
                  "device", "ray", "ray_workers", "split_rows", "speculator_dtype"):  # dtypes: job.manifest's, resolved
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
        if self.groups == "off":  # each record alone, as before groups: those directories resume
            for k in ("groups", "group_max", "group_rule"):
                d.pop(k)
            d["fields"].pop("group")
        else:  # the consecutive rule is named "auto", as directories made before --groups shard name it: they resume
            d["groups"] = "shard" if self.order_free else "auto"
        d.pop("vllm")  # parallelism, memory and placement: same outputs
        if not d["pass_through"]:  # absent without it, as before: those directories resume
            d.pop("pass_through")
        for name in sampling.NAMES:  # sampling settings left at vLLM's defaults: absent, as before they existed
            if d["generate"][name] == getattr(sampling.DEFAULT, name):
                del d["generate"][name]
        if self.vllm.kv_cache_dtype != "auto":  # fp8 KV rounds differently; absent at auto, as before
            d["kv_cache_dtype"] = self.vllm.kv_cache_dtype
        return d
