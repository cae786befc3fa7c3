"""The driver's side of `--speculator-placement workers`: a window's prompts shared among vLLM's workers by tokens, each
rank scoring its share with its own replica (spcli/engines/vllm/worker/replica.py), the importance back here."""

from __future__ import annotations

import dataclasses
import time

from spcli.engines.vllm.driver.liveness import raise_engine_died, raise_if_engine_dies
from spcli.engines.vllm.driver.ready_poll import ReadyPoll, SecondsPerToken
from spcli.errors import EngineDied, StopAtSafePoint


class WorkerSpeculator:
    """The driver's side of `--speculator-placement workers`: a batch's prompts shared among vLLM's
    workers by tokens (replica.balance), each rank scoring its share with its own replica in one
    `collective_rpc`; importance comes back here, where selection runs. `submit` queues the same work on
    each worker's speculator thread instead (replica_queue.py) and returns at once (--speculator-overlap)."""

    def __init__(self, llm, source, eos_ids: set[int]):
        self.llm = llm
        self.source = source.to_dict()
        self.eos_ids = sorted(eos_ids)
        self.num_ranks = llm.llm_engine.vllm_config.parallel_config.world_size
        self.ranks_used: list[int] = []  # the ranks that answered the last call
        self.num_submitted = 0  # windows queued on the workers' threads (submit)
        self.pace = SecondsPerToken()  # when a submitted window is due (ready_poll.py)

    def __call__(self, prompts: list[list[int]], score, chunk: int, on_stage=lambda text: None,
                 should_stop=lambda: False, with_unpooled: bool = False, groups: list[list[int]] = ()):
        """Speculations of `prompts`, in order; each of `groups` (indices into prompts: one document's questions) goes
        whole to one rank, which reads its document once (prepare.speculate_grouped)."""
        from spcli.engines.vllm.worker.replica import gather

        shares, share_groups = self._shares(prompts, groups, on_stage, should_stop)
        t0 = time.perf_counter()
        replies = self._rpc("spcli_speculate", self._args(prompts, shares, share_groups, score, chunk, with_unpooled))
        return gather(shares, self._answered(replies, shares), len(prompts), time.perf_counter() - t0)

    def submit(self, prompts: list[list[int]], score, chunk: int, on_stage=lambda text: None,
               should_stop=lambda: False, with_unpooled: bool = False, groups: list[list[int]] = ()) -> WorkerScoring:
        """The same scoring queued on every worker's speculator thread; returns at once."""
        shares, share_groups = self._shares(prompts, groups, on_stage, should_stop)
        job_id = f"spcli-window-{self.num_submitted}"
        self.num_submitted += 1
        self._rpc("spcli_submit", (job_id, *self._args(prompts, shares, share_groups, score, chunk, with_unpooled)))
        most = max((sum(len(prompts[i]) for i in share) for share in shares), default=0)
        return WorkerScoring(self, job_id, shares, len(prompts), most)

    def _shares(self, prompts, groups, on_stage, should_stop) -> tuple[list[list[int]], list[list[list[int]]]]:
        from spcli.engines.vllm.worker.replica import balance_groups

        if should_stop():
            raise StopAtSafePoint
        on_stage(f"speculating {len(prompts)} prompts on {self.num_ranks} vLLM worker"
                 f"{'' if self.num_ranks == 1 else 's'}")
        return balance_groups(prompts, groups, self.num_ranks)

    def _args(self, prompts, shares, share_groups, score, chunk, with_unpooled) -> tuple:
        return (self.source, [[prompts[i] for i in share] for share in shares], dataclasses.asdict(score),
                self.eos_ids, chunk, with_unpooled, share_groups)

    def _answered(self, replies: list[dict], shares: list[list[int]]) -> list[dict]:
        replies = sorted(replies, key=lambda r: r["rank"])
        self.ranks_used = [r["rank"] for r, share in zip(replies, shares) if share]
        return replies

    def free_bytes(self) -> int | None:
        """The least device memory free on any worker now (spcli_free_bytes); None on CPUs."""
        free = [r["free"] for r in self._rpc("spcli_free_bytes", ())]
        return None if None in free else min(free)

    def _rpc(self, method: str, args: tuple) -> list:
        try:
            with raise_if_engine_dies(self.llm):
                return self.llm.collective_rpc(method, args=args)
        except Exception as e:  # a worker's exception (or a stop signal's cancel) comes back as a plain Exception
            raise_engine_died(e)
            raise EngineDied(f"vLLM's workers failed while speculating ({e}); committed rows are safe: run the same "
                             "command again to resume") from e


class WorkerScoring:
    """A window's scoring queued on the workers: ready() asks them (without waiting; not before the window is due,
    then at most every READY_POLL_S: ready_poll.py), result() collects."""

    def __init__(self, speculator: WorkerSpeculator, job_id: str, shares: list[list[int]], num_prompts: int,
                 most_tokens: int = 0):
        self.speculator, self.job_id, self.shares, self.num_prompts = speculator, job_id, shares, num_prompts
        self.most_tokens = most_tokens  # the largest share's prompt tokens: what the slowest rank scores
        self.poll = ReadyPoll(lambda: all(speculator._rpc("spcli_ready", (job_id,))),
                              speculator.pace.expected_s(most_tokens))

    def ready(self) -> bool:
        return self.poll.ready()

    def result(self) -> list:
        from spcli.engines.vllm.worker.replica import gather

        replies = self.speculator._answered(self.speculator._rpc("spcli_collect", (self.job_id,)), self.shares)
        slowest = max((r["wall_s"] for r in replies), default=0.0)  # the workers' own time, not the wait
        self.speculator.pace.update(slowest, self.most_tokens)
        return gather(self.shares, replies, self.num_prompts, slowest)
