"""Which dtype the models load in: `--dtype auto` (the default) picks per engine, device and CPU, and says why.

- CUDA (or any accelerator): the model's own dtype (bfloat16 for every preset), both engines.
- CPU: per engine (`hf`: transformers, which also runs every speculator; `vllm`: vLLM's CPU build for the
  base) and per the best of the CPU's features that the rule reads (CPU_FEATURES: AMX, AVX512-BF16, AVX2),
  from CPU_DTYPE below. Measured with benches/dtype.py on SmolLM2-135M, ~1.5k-token prefills
  (docs/results/dtype.md): with AMX bf16 is faster in both engines; without AMX (AVX512-BF16 emulated on an
  AMX CPU by capping oneDNN and torch's AMX probe) float32 was faster in transformers, and in vLLM in one
  round of two (the quieter round had vLLM's bf16 faster: undecided, float32 kept); on an AVX2-only CPU
  transformers' bf16 was ~4.5x slower than float32 (docs/results.md, "The CPU dtype"); vLLM on AVX2 is not measured.

The device comes from the caller (spcli never probes the GPU here); the answer is a pure function of
the request, the model's dtype, the engine, the device type and the CPU's features.
"""

from __future__ import annotations

import torch

from spcli.models import lookup

AUTO = "auto"
MODEL = "model"  # CPU_DTYPE's value for the model's own dtype
CPU_FEATURES = ("amx", "avx512_bf16", "avx2")  # the ones the rule reads, best first
ENGINE_NAMES = {"hf": "transformers", "vllm": "vLLM"}
FEATURE_NAMES = {"amx": "AMX", "avx512_bf16": "AVX512-BF16", "avx2": "AVX2", None: "none of AMX, AVX512-BF16, AVX2"}
# engine -> the CPU's best feature -> dtype on that CPU (docs/results/dtype.md has the measurements and commands)
CPU_DTYPE = {
    "hf": {"amx": MODEL, "avx512_bf16": "float32", "avx2": "float32", None: "float32"},
    "vllm": {"amx": MODEL, "avx512_bf16": "float32", "avx2": "float32", None: "float32"},
}


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, as torch's own CPU dispatch sees it (False where torch cannot tell)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The flags of the first processor in /proc/cpuinfo (`cpuinfo`: its text; an empty set where there is none)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def cpu_features(flags: set[str] | None = None, has_amx: bool | None = None) -> tuple[str, ...]:
    """Which of CPU_FEATURES this CPU has, best first: AMX as torch's dispatch sees it (cpu_has_amx, which vLLM's
    CPU kernels read too), the others from the CPU's flags."""
    flags = cpu_flags() if flags is None else flags
    amx = cpu_has_amx() if has_amx is None else has_amx
    return tuple(f for f in CPU_FEATURES if (amx if f == "amx" else f in flags))


def resolve_dtype(requested: str | None, model: str, device: torch.device, has_amx: bool | None = None,
                  engine: str = "hf", features: tuple[str, ...] | None = None) -> tuple[str, str]:
    """(dtype, why) for `--dtype requested` (None or "auto": pick) of `model` run by `engine` on `device`.
    `features`: the CPU's (cpu_features(); `has_amx` overrides its AMX only)."""
    if requested not in (None, AUTO):
        return requested, "--dtype"
    own = lookup.default_dtype(model)
    if device.type != "cpu" or own == "float32":
        return own, f"auto: the model's dtype on {device.type}"
    features = cpu_features(has_amx=has_amx) if features is None else features
    best = features[0] if features else None
    picked = CPU_DTYPE[engine][best]
    if picked == MODEL:
        return own, f"auto: the model's dtype, this CPU has {FEATURE_NAMES[best]} ({own} matmuls run natively)"
    has = "has no AMX" if best is None else f"has {FEATURE_NAMES[best]} but no AMX"
    return picked, f"auto: this CPU {has}, {own} is slower than {picked} on it in {ENGINE_NAMES[engine]} (docs/results/dtype.md)"


# The speculator's dtype where --speculator-dtype is auto, on a CPU: bfloat16 where the CPU multiplies bf16 natively
# (AMX, AVX512-BF16), else the run's. Measured on an AMD EPYC with AVX512-BF16 and no AMX (docs/results/lengths.md,
# issue 58): the Qwen2.5-Coder-0.5B speculator's pass over 4k tokens took 8.4 s in float32 and 5.1 s in bfloat16,
# its matmuls 2.2x faster; its scores are accumulated in float32 either way (spcli.kernels.score).
NATIVE_BF16 = ("amx", "avx512_bf16")


def resolve_speculator_dtype(requested: str | None, dtype: str, device: torch.device,
                             features: tuple[str, ...] | None = None) -> tuple[str, str]:
    """(dtype, why) of the speculator for `--speculator-dtype requested` (None or "auto": pick) in a run of `dtype`
    (resolved) on `device`: the run's dtype on an accelerator and wherever the run is not float32; on a CPU running
    float32, bfloat16 where it has NATIVE_BF16. `features`: the CPU's (cpu_features())."""
    if requested not in (None, AUTO):
        return requested, "--speculator-dtype"
    if device.type != "cpu" or dtype != "float32":
        return dtype, f"auto: the run's dtype ({dtype} on {device.type})"
    features = cpu_features() if features is None else features
    native = next((f for f in features if f in NATIVE_BF16), None)
    if native is None:
        return dtype, "auto: the run's dtype (this CPU has no native bf16 matmul)"
    return "bfloat16", (f"auto: this CPU has {FEATURE_NAMES[native]}, where the speculator's bf16 matmuls run ~2x "
                        f"float32's (its scores summed in float32; docs/results/lengths.md)")
