"""Closed-loop QPS simulation on costs worked out by hand."""

import pytest

from spcli.benchmark.qps import CostModel, max_qps, simulate


def test_one_client_one_prompt_batches():
    cost = CostModel(speculator_s=0.25, prefill_s=0.75)  # 1 s per prompt
    qps, p95 = simulate(cost, num_clients=1, max_batch=4)
    assert qps == pytest.approx(1.0) and p95 == pytest.approx(1.0)


def test_clients_share_a_batch_and_queue_beyond_it():
    cost = CostModel(0.0, prefill_s=0.5)
    qps, p95 = simulate(cost, num_clients=4, max_batch=4)
    assert qps == pytest.approx(2.0) and p95 == pytest.approx(2.0)  # 4 prompts per 2 s batch, all first tokens at 2 s
    qps, p95 = simulate(cost, num_clients=8, max_batch=4)
    assert qps == pytest.approx(2.0) and p95 == pytest.approx(4.0)  # waits one batch, then its own


def test_max_qps_respects_the_ttft_limit_and_rewards_cheaper_prompts():
    full = CostModel(0.0, prefill_s=1.0)
    pruned = CostModel(speculator_s=0.05, prefill_s=0.1)
    a = max_qps(full, ttft_limit_s=2.0, max_batch=8)
    b = max_qps(pruned, ttft_limit_s=2.0, max_batch=8)
    assert a == {"qps": pytest.approx(1.0), "clients": 1, "p95_ttft_s": pytest.approx(1.0)}
    assert b["p95_ttft_s"] <= 2.0 and b["qps"] == pytest.approx(1 / 0.15)
    assert max_qps(full, ttft_limit_s=0.5, max_batch=8)["qps"] == 0.0  # one prompt alone takes 1 s
