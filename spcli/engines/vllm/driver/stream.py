"""The base pass on vLLM as a stream: requests added to vLLM's engine as they are scored, finished ones
collected as they come (any order), instead of one blocking `LLM.generate` per batch.

    stream = VllmStream(runner)
    key = stream.submit(request)          # checked (RecordError), then queued in vLLM's scheduler
    for key, generation in stream.poll(): # one engine step; only finished requests
        ...
    stream.abort(keys)                    # a stop: requests in flight are dropped (redone on resume)

How many to keep in flight (`limit`): vLLM runs at most max_num_seqs requests at once, and no more than
its KV cache holds (num_gpu_blocks x block_size tokens over each request's kept + generated tokens); the
stream keeps twice that many queued, so the scheduler always has the next ones while the driver scores.
While vLLM is still starting (vllm_start.py) the loop scores up to `head_start()` prompts ahead and submits
them once `is_ready()`.
"""

from __future__ import annotations

import itertools
import time

from spcli.config.scoring import SPECULATOR_BATCH_TOKENS
from spcli.stages.request import Generation, PrunedRequest

QUEUED_SETS = 2  # running set + the next one waiting in vLLM's queue
FIRST_WINDOW = 8  # prompts per worker in the first speculator window, before their length is known
HEAD_START_WINDOWS = 4  # first windows scored while vLLM starts (vllm_start.py), at most


class VllmStream:
    def __init__(self, starting, num_ranks: int):
        """`starting`: the engine's vllm_start.StartingRunner (vLLM may still be starting); `num_ranks`: its workers."""
        self.starting = starting
        self.num_ranks = num_ranks
        self.keys = itertools.count()
        self.started: dict[str, tuple[PrunedRequest, float]] = {}  # key -> (request, time added)

    @property
    def runner(self):
        return self.starting.result()

    @property
    def engine(self):
        return self.runner.llm.llm_engine

    def is_ready(self) -> bool:
        """vLLM has started (or failed to: `runner` raises its error); no wait."""
        return self.starting.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether vLLM has started (or failed to) within `timeout` seconds (None: until it has)."""
        return self.starting.wait(timeout)

    def head_start(self) -> int:
        """Prompts to score ahead while vLLM starts: HEAD_START_WINDOWS first windows."""
        return HEAD_START_WINDOWS * FIRST_WINDOW * self.num_ranks

    def capacity(self, tokens_per_request: float) -> int:
        """Requests vLLM runs at once: max_num_seqs, within what its KV cache holds at this request size."""
        config = self.engine.vllm_config
        seqs = int(config.scheduler_config.max_num_seqs)
        blocks = config.cache_config.num_gpu_blocks or 0
        if not blocks or tokens_per_request <= 0:
            return seqs
        kv_tokens = blocks * int(config.cache_config.block_size)
        return max(1, min(seqs, int(kv_tokens // tokens_per_request)))

    def window(self, prompt_tokens: float, tokens_per_request: float) -> int:
        """The speculator window where --batch-size is not given: as many prompts as fill one batched speculator
        pass on every worker (SPECULATOR_BATCH_TOKENS padded tokens each, at `prompt_tokens` a prompt), but no
        more than vLLM runs at once (`capacity`); FIRST_WINDOW per worker before any prompt is seen."""

        if not self.is_ready():
            return self.num_ranks * FIRST_WINDOW
        per_rank = FIRST_WINDOW if prompt_tokens <= 0 else max(1, int(SPECULATOR_BATCH_TOKENS // prompt_tokens))
        return max(1, min(self.num_ranks * per_rank, self.capacity(tokens_per_request)))

    def limit(self, tokens_per_request: float) -> int:
        return QUEUED_SETS * self.capacity(tokens_per_request)

    def submit(self, req: PrunedRequest) -> str:
        """Queue one request in vLLM (RecordError where it cannot run); its key comes back from poll()."""
        prompt, params = self.runner.request_inputs(req)  # checks first: RecordError
        key = f"spcli-{next(self.keys)}"
        self.engine.add_request(key, prompt, params)
        self.started[key] = (req, time.perf_counter())
        return key

    @property
    def num_in_flight(self) -> int:
        return len(self.started)

    def poll(self) -> list[tuple[str, Generation]]:
        """One engine step (blocks until vLLM has output); the requests that finished in it."""
        if not self.started:
            return []
        done = []
        for output in self.engine.step():
            if not output.finished:
                continue
            req, t0 = self.started.pop(output.request_id)
            wall = time.perf_counter() - t0
            ttft = _first_token_latency(output)
            ttft = wall if ttft is None else ttft
            done.append((output.request_id, self.runner._generation(output, req, ttft, ttft, wall)))
        return done

    def abort(self, keys: list[str] | None = None) -> int:
        """Drop the requests in flight with these keys (None: every one); how many there were."""
        keys = list(self.started) if keys is None else [k for k in keys if k in self.started]
        if keys:
            self.engine.abort_request(keys)
        for key in keys:
            del self.started[key]
        return len(keys)


def _first_token_latency(output) -> float | None:
    metrics = output.metrics
    return getattr(metrics, "first_token_latency", None) if metrics else None
