"""vLLM started on a thread of its own (spcli/engines/vllm/driver/start.py) and where the speculator goes by default
(spcli.models.resolved.placement_for); no vLLM needed."""

import threading

import pytest
import torch

from spcli.engines.vllm.driver.start import StartingRunner
from spcli.models.resolved import placement_for


def test_a_start_runs_on_its_own_thread_and_hands_over_its_runner():
    gate, seen = threading.Event(), []

    def make():
        seen.append(threading.current_thread().name)
        gate.wait()
        return "runner"

    starting = StartingRunner(make)
    assert not starting.done() and starting.started() is None and not starting.wait(0)
    gate.set()
    assert starting.result() == "runner" and starting.done() and starting.started() == "runner"
    assert seen == ["spcli-vllm-start"]


def test_a_failed_start_is_raised_to_whoever_asks_for_the_runner():
    starting = StartingRunner(lambda: (_ for _ in ()).throw(RuntimeError("engine core failed to start")))
    assert starting.wait(30)
    assert starting.started() is None
    with pytest.raises(RuntimeError, match="engine core failed to start"):
        starting.result()


def test_an_already_started_runner_is_ready_at_once():
    starting = StartingRunner.of("runner")
    assert starting.done() and starting.result() == "runner"


def test_auto_placement_is_workers_on_gpus_and_the_driver_on_a_cpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert placement_for("auto", gpu, "auto") == "workers"
    assert placement_for("auto", cpu, "auto") == "driver"
    assert placement_for("auto", cpu, "on") == "workers"  # the overlap runs on the replicas' own threads
    assert placement_for("workers", cpu, "auto") == "workers" and placement_for("driver", gpu, "off") == "driver"



def test_a_start_below_this_process_runs_nice_with_what_it_spawns_and_leaves_this_thread_as_it_was():
    import os
    import subprocess
    import sys

    before = os.getpriority(os.PRIO_PROCESS, 0)

    def make():  # what vLLM's start does: processes spawned from this thread
        child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                               capture_output=True, text=True, check=True)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), int(child.stdout)

    assert StartingRunner(make, nice=5).result() == (min(19, before + 5),) * 2
    assert StartingRunner(make).result() == (before, before)  # nice 0: as this process
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # this thread, the one that scores, is untouched
