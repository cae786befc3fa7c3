"""Which dtype the models load in: `--dtype auto` (the default) picks per device, and says why.

- CUDA (or any accelerator): the model's own dtype (bfloat16 for every preset).
- CPU with AMX (Intel Sapphire Rapids and later): the model's dtype; AMX multiplies bf16 tiles natively.
- CPU without AMX: float32. Without AMX, torch's bf16 matmuls convert to fp32 and back, so bf16 is slower:
  `spcli bench` on SmolLM2-135M here (AVX2 only) measured the rows in the README ("The CPU dtype").

The device comes from the caller (spcli never probes the GPU here); the answer is a pure function of
the request, the model's dtype, the device type and whether the CPU has AMX.
"""

from __future__ import annotations

import torch

from spcli import models

AUTO = "auto"


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, as torch's own CPU dispatch sees it (False where torch cannot tell)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def resolve_dtype(requested: str | None, model: str, device: torch.device, has_amx: bool | None = None) -> tuple[str, str]:
    """(dtype, why) for `--dtype requested` (None or "auto": pick) of `model` on `device`."""
    if requested not in (None, AUTO):
        return requested, "--dtype"
    own = models.default_dtype(model)
    if device.type != "cpu" or own == "float32":
        return own, f"auto: the model's dtype on {device.type}"
    if cpu_has_amx() if has_amx is None else has_amx:
        return own, f"auto: the model's dtype, this CPU has AMX ({own} matmuls run natively)"
    return "float32", f"auto: this CPU has no AMX, {own} is slower than float32 on it"
