"""spcli/engines/vllm/worker/replica_queue.py on CPU: submit returns at once, jobs run in order on their own thread,
collect in any order, errors reach the collector, close fails what never ran; and real speculator jobs
(the tiny model, speculate_prompts) give through the queue what they give when called directly."""

from __future__ import annotations

import threading

import pytest
import torch

from spcli.engines.vllm.worker.replica_queue import QueueClosed, SpeculatorQueue


def test_submit_returns_before_the_job_runs_and_jobs_run_in_order():
    q = SpeculatorQueue()
    gate, ran = threading.Event(), []
    q.submit("a", lambda: (gate.wait(10), ran.append("a"))[1] or "A")
    q.submit("b", lambda: ran.append("b") or "B")
    assert ran == []  # the caller is back while job a waits
    gate.set()
    assert q.collect("b") == "B" and q.collect("a") == "A"  # collected out of order
    assert ran == ["a", "b"]  # run in submission order
    q.close()


def test_errors_reach_their_collector_and_results_are_collected_once():
    q = SpeculatorQueue()
    q.submit("bad", lambda: 1 / 0)
    q.submit("ok", lambda x: x + 1, 41)
    with pytest.raises(ZeroDivisionError):
        q.collect("bad")
    assert q.collect("ok") == 42
    with pytest.raises(KeyError):
        q.collect("ok")
    with pytest.raises(KeyError):
        q.collect("never")
    q.close()


def test_close_finishes_the_running_job_and_fails_the_queued_ones():
    q = SpeculatorQueue()
    started, gate = threading.Event(), threading.Event()
    q.submit("running", lambda: (started.set(), gate.wait(10))[1] and "done")
    q.submit("queued", lambda: "never")
    started.wait(10)
    closer = threading.Thread(target=q.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert q.collect("running") == "done"
    with pytest.raises(QueueClosed):
        q.collect("queued")
    with pytest.raises(QueueClosed):
        q.submit("late", lambda: None)
    q.close()  # twice is fine


def test_speculator_jobs_through_the_queue_equal_direct_calls(tiny_dir):
    import dataclasses

    from spcli.config.scoring import ScoreConfig
    from spcli.engines.vllm.worker.replica import Replica
    from spcli.models.load import SpeculatorSource

    source = SpeculatorSource(str(tiny_dir), "float32").to_dict()
    score = ScoreConfig(lookahead=0, window=8, score_layers="all", pool=13, rows="mean", impl="torch")

    prompts = [[(7 * i + j) % 500 + 3 for j in range(40 + 9 * i)] for i in range(5)]
    replica = Replica(torch.device("cpu"))
    args = (source, prompts, dataclasses.asdict(score), [2])
    direct = replica.speculate(*args)
    q = SpeculatorQueue(torch.device("cpu"))
    for k in range(3):  # windows k, k+1, ... submitted ahead, collected later
        q.submit(f"w{k}", replica.speculate, *args)
    got = [q.collect(f"w{k}") for k in (2, 0, 1)]
    q.close()
    for g in got:
        assert [r["importance"] for r in g["results"]] == [r["importance"] for r in direct["results"]]


def test_is_done_tells_without_waiting_and_refuses_unknown_jobs():
    import threading

    from spcli.engines.vllm.worker.replica_queue import SpeculatorQueue

    gate = threading.Event()
    q = SpeculatorQueue()
    try:
        q.submit("a", gate.wait)
        assert q.is_done("a") is False  # running, blocked on the gate: asked, not waited for
        gate.set()
        assert q.collect("a", timeout=10) is True
        with pytest.raises(KeyError, match="collected already"):
            q.is_done("a")
    finally:
        q.close()


@pytest.mark.parametrize(("setting", "is_cpu", "has_workers", "want"), [
    ("auto", False, True, True), ("auto", True, True, False), ("on", True, True, True), ("off", False, True, False),
    ("on", False, False, False), ("auto", False, False, False)])
def test_overlap_is_on_with_gpu_workers_or_when_asked(setting, is_cpu, has_workers, want):
    from spcli.engines.vllm.worker.replica_queue import overlaps

    assert overlaps(setting, is_cpu, has_workers) is want


def test_overlap_on_needs_the_workers_placement():
    from spcli.config.run import VllmConfig
    from spcli.errors import ConfigError

    with pytest.raises(ConfigError, match="needs the speculator in vLLM's workers"):
        VllmConfig(speculator_overlap="on", speculator_placement="driver")
    VllmConfig(speculator_overlap="on")  # placement auto: resolved to workers (resolved.placement_for)
    with pytest.raises(ConfigError, match="--speculator-overlap must be one of auto, on, off"):
        VllmConfig(speculator_overlap="yes")
