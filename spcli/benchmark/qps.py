"""Maximum prompts/s under a TTFT limit: a closed-loop simulation on measured stage costs.

The paper's QPS argument (max QPS under a timeout scales like 1/TTFT) made concrete: C clients each
keep one request outstanding and resubmit the moment its first token arrives. One device serves
them FIFO in batches of up to `max_batch`: the speculator reads the batch's prompts one by one,
then the base prefills the batch. Costs are the measured ones of the benchmarked batch:

    batch time = k * (speculator_s + prefill_s)      k <= max_batch prompts, per-prompt costs measured
                                                     at batch max_batch (no batching gain assumed below)

The answer is the best throughput over C whose 95th-percentile TTFT is within the limit.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    speculator_s: float  # speculator + scoring + selection, per prompt (0 for full prefill)
    prefill_s: float  # base prefill, per prompt (the measured batch prefill / batch size)

    def batch_s(self, k: int) -> float:
        return k * (self.speculator_s + self.prefill_s)


def simulate(cost: CostModel, num_clients: int, max_batch: int, num_batches: int = 300) -> tuple[float, float]:
    """(prompts/s, p95 TTFT in s) of `num_clients` closed-loop clients with zero think time."""
    arrivals = [0.0] * num_clients  # one outstanding request per client: its submission time
    heapq.heapify(arrivals)
    now, done, ttfts = 0.0, 0, []
    start_time, warm = None, num_batches // 5
    for b in range(num_batches):
        now = max(now, arrivals[0])
        batch = [heapq.heappop(arrivals) for _ in range(min(max_batch, len(arrivals))) if arrivals[0] <= now]
        now += cost.batch_s(len(batch))
        for submitted in batch:
            heapq.heappush(arrivals, now)  # the client resubmits on its first token
            if b >= warm:
                ttfts.append(now - submitted)
        if b == warm - 1:
            start_time = now
        if b >= warm:
            done += len(batch)
    elapsed = now - (start_time or 0.0)
    return done / elapsed, float(np.percentile(ttfts, 95))


def max_qps(cost: CostModel, ttft_limit_s: float, max_batch: int, max_clients: int = 1024) -> dict:
    """Best throughput with p95 TTFT <= the limit, and the client count that reaches it."""
    best = {"qps": 0.0, "clients": 0, "p95_ttft_s": None}
    for clients in range(1, max_clients + 1):
        qps, p95 = simulate(cost, clients, max_batch)
        if p95 > ttft_limit_s * (1 + 1e-9):
            break  # TTFT only grows with more clients
        if qps > best["qps"]:
            best = {"qps": qps, "clients": clients, "p95_ttft_s": p95}
    return best
