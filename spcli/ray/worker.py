"""One Ray actor of `spcli run --ray`: an spcli engine that runs the job loop on the shards it is handed.

Each call runs `spcli.job.run.run` on the actor's share, exactly as a Slurm array task runs its own: its slot's
manifest and lock, resume from the slot's committed rows, atomic parts, error rows for bad records. The
engine is built on the first call and kept for the next ones (one model load per actor). The rows it
commits are relayed to the driver's progress through a `ray.util.queue.Queue`, without their texts.
"""

from __future__ import annotations

import dataclasses
import os

from spcli.config.run import RunConfig
from spcli.io.shards import Shard
from spcli.job.progress import Progress
from spcli.job.shares import WorkerShare

VLLM_EXECUTOR_ENV = "SPCLI_VLLM_EXECUTOR"  # read by engine.vllm_args: vLLM's own processes for TP, not Ray's


class RelayedProgress(Progress):
    """A worker's progress: counted here (the run's summary reads it) and sent on to the driver's, which logs
    the batch and failed-row lines (so they are not logged twice)."""

    def __init__(self, queue, slot: int):
        super().__init__(quiet=True)
        self.queue, self.slot = queue, slot

    def update(self, rows) -> None:
        self.rows += len(rows)
        self.failed += sum(r.error is not None for r in rows)
        ok = [r for r in rows if r.error is None]
        self.prompt_tokens += sum(r.num_prompt_tokens for r in ok)
        self.kept_tokens += sum(r.num_kept_tokens for r in ok)
        self.output_tokens += sum(r.num_output_tokens for r in ok)
        slim = [dataclasses.replace(r, output=None, kept_indices=[], importance=None, logprobs=None) for r in rows]
        self.queue.put(slim)


class Worker:
    """The actor class (wrapped with ray.remote by the driver, so that importing this needs no Ray)."""

    def __init__(self, cfg: RunConfig, run_id: str, queue, log_level: str):
        from spcli.job.progress import setup_logging

        setup_logging("DEBUG" if log_level == "DEBUG" else "WARNING")  # the driver logs progress and banner lines
        os.environ.setdefault(VLLM_EXECUTOR_ENV, "mp")
        self.cfg, self.run_id, self.queue = cfg, run_id, queue
        self.engines: dict = {}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """End the engines (vLLM's own processes with them) before the driver ends this actor."""
        for engine in self.engines.values():
            getattr(engine, "close", lambda: None)()
        self.engines.clear()

    def run(self, slot: int, owned: tuple[Shard, ...], num_slots: int, retry: bool = False) -> dict:
        """Run the shards (or row ranges) of `slot` not done yet (`owned`: every one its manifest lists, or will);
        retry: first redo the slot's committed error rows (--retry-failed)."""
        from spcli.job.run import run  # in the actor only: the driver, which imports this module, needs no torch

        task = {"index": slot, "count": num_slots, "job_id": self.run_id, "restart_count": 0, "ray": True}
        share = WorkerShare(task, tuple(owned), self.engines)
        cfg = dataclasses.replace(self.cfg, retry_failed=retry)
        summary = run(cfg, RelayedProgress(self.queue, slot), share)
        return {"rows": summary.rows_this_run, "wall_s": summary.wall_this_run_s, "retried": summary.retried,
                "retried_ok": summary.retried_ok}
