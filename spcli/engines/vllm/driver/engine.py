"""The `vllm` engine: the shared tokenize -> speculate -> select, then the base pass on vLLM.

Same contract as `HFEngine` (`stack`, `check`, `generate(requests) -> Generations or RecordErrors`);
the base model runs in vLLM 0.32 through `VllmRunner` (kept tokens at their original positions,
vllm_pass.py). What is supported:

- Speculator: a separate model (of the base's tokenizer or another: prepare aligns in the driver), or `self`/`self:K` with early exit (no
  look-ahead): vLLM holds the base weights in its own format, so only the tensors of the layers the
  speculator runs (up to the last scored one) and the embeddings are read from the base's checkpoint
  into transformers (counted in the memory plan); an FP8 checkpoint is refused. With look-ahead `self`
  would need a second copy of the whole model: refused. Both refusals come from vllm_refusals.py, which
  `spcli plan` calls too, before vLLM starts. At --keep 1.0 no speculator is located or loaded.
- Where it runs (`--speculator-placement`): `workers` (default) puts a replica in every vLLM worker, one
  per GPU, on that worker's device; each batch's pruned prompts are shared among the ranks by tokens and
  scored there with the hf engine's own speculate code (replica.py, `WorkerSpeculator`); the driver holds
  no model. `driver` keeps one copy in this process on `--device` (the first GPU by default), as before.
  Either way its memory reserve is taken out of `gpu_memory_utilization` (equal on every rank).
- Model presets map to vLLM arguments (vllm_args.py): tensor parallel size, FP8, max_model_len;
  `--tp`, `--max-model-len`, `--gpu-memory-utilization`, `--max-num-batched-tokens`, `--max-num-seqs` and
  `--kv-cache-dtype` override.
- Greedy outputs follow transformers' semantics: stop at the first end-of-sequence id of the
  model (generation config, config, tokenizer), text decoded by the same tokenizer. Sampled
  outputs (temperature > 0) are seeded per row but come from vLLM's sampler, not torch's.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from spcli.config.run import RunConfig
from spcli.engines.vllm.driver.args import VLLM_CPU_NICE, beside_speculator_env, cpu_env_defaults, engine_args
from spcli.engines.vllm.driver.liveness import import_vllm, raise_engine_died, raise_if_engine_dies
from spcli.engines.vllm.driver.replicas import WorkerSpeculator
from spcli.engines.vllm.driver.start import StartingRunner
from spcli.engines.vllm.worker.replica_queue import overlaps
from spcli.errors import RecordError
from spcli.models import files, load, speculator
from spcli.models.files import read_model_config
from spcli.models.resolved import ResolvedRun, resolve_run
from spcli.plan.memory import GiB
from spcli.plan.refusals import base_quantization, refuse_speculator, stored_quantization
from spcli.stages.request import Generation, PrunedRequest


class VllmEngine:
    def __init__(self, run: ResolvedRun | RunConfig, log=lambda msg: None, runner=None, with_speculator: bool = True):
        """`run`: the resolved run (spcli.models.resolved; a RunConfig is resolved here: tests, benches). `runner`: an
        already started VllmRunner to reuse, or a vllm_start.StartingRunner (tests, benches); else one is started
        here: on a thread of its own where the speculator is in this process on the CPU (vllm_start.py).

        The stack is made once, complete, after the runner: the driver placement's device (the resolved one,
        NVML's count, no CUDA before vLLM starts; the workers placement holds no model here: CPU, for
        tokenizing), the self speculator's layers, and what the runner decides (max_positions, the reserve's
        prompt bound, the worker speculator). with_speculator=False: an engine for requests prepared elsewhere
        (spcli.ray.processor's base stage): no speculator is loaded or reserved for, whatever --keep says."""
        run = run if isinstance(run, ResolvedRun) else resolve_run(run)
        cfg = run.cfg
        self.cfg = cfg
        self.scores = cfg.select.prunes and with_speculator  # a speculator runs here (in the workers or this process)
        self.log = log
        self.placement = cfg.vllm.speculator_placement
        self.dtype = run.dtype  # the base's, for the replicas on the GPUs too (not the driver CPU's)
        self.speculator_dtype = run.speculator_dtype  # the speculator's (--speculator-dtype; auto: the base's on GPUs)
        name = run.speculator
        model_config = read_model_config(run.model_path)  # read once: layers, RoPE table, quantization
        if self.scores:  # what `spcli plan` refuses, refused here before vLLM is imported or started
            refuse_speculator(name, cfg.model, cfg.score, base_quantization(cfg.model, stored_quantization(model_config)),
                              int(model_config["num_hidden_layers"]))
        platform = import_vllm()  # first: no CUDA runtime call before it (spcli/models/device.py); vLLM sets the NVML check too
        device = run.device if self.placement == "driver" else torch.device("cpu")
        base = files.read_base(run.model_path)
        self.model_config = model_config
        self.source = None  # what the speculator loads (checked before vLLM starts); None: it cannot run here
        layers = None  # a self speculator's first layers (early exit), read from the base's checkpoint
        tokens = load.UNREAD  # the speculator's own tokenizer, where it runs
        if not self.scores:
            pass  # the full-prefill baseline: no speculator, even where the preset's is not on this machine
        elif speculator.parse_self(name) is None or not cfg.score.lookahead:  # self with look-ahead: refused above
            if speculator.parse_self(name) is not None:
                layers = speculator.self_layers(name, cfg.score, int(model_config["num_hidden_layers"]))
            self.source = load.speculator_source(base.path, cfg.model, name, self.speculator_dtype, base.max_positions, layers,
                                                 run.speculator_path)
            tokens = speculator.speculator_tokens(base.tokenizer, name, run.speculator_path)
        self.owns_runner = runner is None
        max_prompt_len = cfg.vllm.max_prompt_len  # an already started runner: the flag's bound, no reserve here
        self.in_background = runner is None and run.scores_while_vllm_starts
        if runner is None:
            make, max_prompt_len, self.num_ranks = self._runner_maker(platform, base, device)
            # the speculator beside vLLM on the same cores: vLLM's processes run below it (start.py, issue 58)
            nice = VLLM_CPU_NICE if self.scores else 0
            self.starting = StartingRunner(make, nice=nice) if self.in_background else StartingRunner.of(make())
        else:  # a started runner, or one starting (a StartingRunner: tests)
            self.starting = runner if isinstance(runner, StartingRunner) else StartingRunner.of(runner)
            self.in_background = not self.starting.done()
            self.num_ranks = engine_args(cfg, base.path, platform.is_cpu(), self.dtype)["tensor_parallel_size"]
        remote = None
        if self.placement == "workers" and self.source is not None:
            remote = WorkerSpeculator(self.runner.llm, self.source, base.eos_ids if tokens is None else tokens.eos_ids)
            if max_prompt_len:  # the reserve was planned: what vLLM left free is measured now (issue 40)
                max_prompt_len = self._measured_prompt_len(remote.free_bytes(), max_prompt_len)
        self.stack = load.open_stack(
            base, cfg.model, name, self.dtype, device, with_base=False, needs_speculator=False,  # source checked it
            speculator_path=run.speculator_path, speculator_tokens=tokens, speculator_layers=layers,
            max_positions=base.max_positions if self.in_background else self.runner.max_positions,
            speculate_remote=remote, max_prompt_len=max_prompt_len, speculator_dtype=self.speculator_dtype,
            prompt_len_flag="--max-prompt-len (it sizes the speculator's share of the GPU)" if max_prompt_len else "")
        self.overlap = overlaps(cfg.vllm.speculator_overlap, platform.is_cpu(), remote is not None)
        if remote is not None:
            self.log(f"speculator overlap {'on' if self.overlap else 'off'} (--speculator-overlap "
                     f"{cfg.vllm.speculator_overlap}): the workers score the next window "
                     + ("while vLLM runs this one" if self.overlap else "between vLLM's steps"))

    @property
    def runner(self):
        """The started VllmRunner (waits while vLLM starts in the background; its start's error is raised here)."""
        return self.starting.result()

    def _runner_maker(self, current_platform, base: files.BaseFiles, device):
        """(what starts the runner, the longest prompt the speculator's reserve is sized for or None without a
        reserve, the number of ranks): everything but vLLM's start itself is decided here, on the caller's thread."""
        from spcli.engines.vllm.driver.base_pass import VllmRunner, VllmRunnerConfig

        args = engine_args(self.cfg, base.path, current_platform.is_cpu(), self.dtype)
        max_prompt_len = self.cfg.vllm.max_prompt_len  # None: the base's positions (tokenize's own bound)
        if current_platform.is_cpu():
            env = cpu_env_defaults(args["tensor_parallel_size"])
            if self.in_background and self.scores:  # started below the speculator (start.py)
                env.update(beside_speculator_env())
            for key, value in env.items():
                os.environ.setdefault(key, value)
        elif "gpu_memory_utilization" not in args and self._shares_gpu(args["tensor_parallel_size"], device):
            index = (device.index or 0) if self.placement == "driver" else 0
            total = current_platform.get_device_total_memory(index)  # NVML: no CUDA init here
            max_prompt_len = self._reserve_tokens(args, total, base.path)  # longer: an error row, not an OOM
            share = self._speculator_share(max_prompt_len, total)
            args["gpu_memory_utilization"] = share.gpu_memory_utilization
            where = "on every GPU" if self.placement == "workers" else f"on {device}"
            self.log(f"speculator reserve {share.reserve.total / GiB:.1f} GiB of {total / GiB:.1f} GiB {where}: "
                     f"gpu_memory_utilization={share.gpu_memory_utilization} (spcli plan shows the terms)")
        self.log(("starting vLLM in the background: " if self.in_background else "starting vLLM: ")
                 + ", ".join(f"{k}={v}" for k, v in args.items() if k != "engine_kwargs"))
        config = VllmRunnerConfig(**args)
        return lambda: VllmRunner(config, base.tokenizer, base.eos_ids), max_prompt_len, config.tensor_parallel_size

    def _shares_gpu(self, tp: int, device) -> bool:
        """The speculator sits on vLLM's GPUs (workers: all of them; driver: --device, if one of 0 .. tp-1)
        and will be loaded (--keep < 1)."""
        if self.source is None or not self.scores:
            return False
        if self.placement == "workers":
            return True
        return device.type == "cuda" and (device.index or 0) < tp

    def _reserve_tokens(self, args: dict, total_bytes: int, model_path: Path) -> int:
        """The longest prompt the reserve is sized for: --max-prompt-len, by default the plan's (the base's positions
        where the reserve for them leaves vLLM one max_model_len request, else the longest that does:
        plan.default_prompt_len). The base holds only kept tokens: --max-model-len bounds kept + generated."""
        from spcli.plan.memory import KV_CACHE_BYTES
        from spcli.plan.plan import default_prompt_len
        from spcli.plan.shapes import DTYPE_BYTES, ModelShape

        max_positions = int(self.model_config.get("max_position_embeddings", 1 << 17))
        if self.cfg.vllm.max_prompt_len:
            return min(self.cfg.vllm.max_prompt_len, max_positions)
        base = ModelShape.from_folder(model_path)  # a stored quantization counts in its headers' bytes
        spec = self._speculator_shape
        b = DTYPE_BYTES[self.dtype]
        return default_prompt_len(base, spec, self.cfg.score, self.cfg.speculator_chunk, total_bytes, b,
                                  args["tensor_parallel_size"], args["engine_kwargs"].get("quantization"),
                                  KV_CACHE_BYTES.get(args["kv_cache_dtype"], b), args["max_model_len"] or max_positions)

    def _measured_prompt_len(self, free_bytes: int | None, planned: int) -> int:
        """The speculator's prompt bound once vLLM is up: the planned one where the replicas' reserve fits in
        what vLLM left free on every GPU, else the longest prompt that fits (longer ones become error rows
        naming --max-prompt-len, instead of running out of memory beside vLLM's steps). None: a CPU."""
        from spcli.plan.memory import measured_prompt_len
        from spcli.plan.shapes import DTYPE_BYTES

        if free_bytes is None:
            return planned
        fits, note = measured_prompt_len(free_bytes, planned, self._speculator_shape, self.cfg.score,
                                         DTYPE_BYTES[self.speculator_dtype], self.cfg.speculator_chunk)
        if note:
            self.log(note)
        return fits

    def _speculator_share(self, max_prompt_len: int, total_bytes: int):
        """The plan's (spcli/plan/memory.py): the reserve for prompts up to max_prompt_len, the utilization."""
        from spcli.plan.memory import speculator_share
        from spcli.plan.shapes import DTYPE_BYTES

        return speculator_share(self._speculator_shape, self.cfg.score, max_prompt_len, self.cfg.speculator_chunk,
                                total_bytes, DTYPE_BYTES[self.speculator_dtype])

    @functools.cached_property
    def _speculator_shape(self):
        """The layers the speculator's replicas load (plan.shapes.ModelShape), read from its folder once: the
        reserve's plan, its share of the GPU and the bound measured after vLLM starts all size it."""
        from spcli.plan.shapes import ModelShape

        return ModelShape.from_folder(Path(self.source.path), self.source.num_layers)

    def check(self, req: PrunedRequest) -> None:
        runner = self.starting.started()
        if runner is not None:  # while vLLM starts, its stream checks each request as it is submitted
            runner.check(req)  # e.g. kept + max_tokens > max_model_len

    def generate(self, requests: list[PrunedRequest], should_stop=lambda: False) -> list[Generation | RecordError]:
        """should_stop is not asked: a vLLM batch runs to its end (a signal to vLLM's processes drops it)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            with raise_if_engine_dies(self.starting):
                return self.runner.generate(requests)
        except (RuntimeError, EngineDeadError) as e:  # EngineDeadError is not a RuntimeError
            raise_engine_died(e)
            raise

    @contextmanager
    def streaming(self):
        """A VllmStream on this engine (vllm_stream.py), for the job loop (spcli.job.batch.stream_rows): an engine
        that dies while it runs raises EngineDied; on the way out every request still in flight is aborted."""
        from vllm.v1.engine.exceptions import EngineDeadError

        from spcli.engines.vllm.driver.stream import VllmStream

        stream = VllmStream(self.starting, self.num_ranks)
        try:
            with raise_if_engine_dies(self.starting):
                yield stream
        except (RuntimeError, EngineDeadError) as e:
            raise_engine_died(e)
            raise
        finally:
            try:
                stream.abort()
            except Exception:  # a dead engine cannot take the abort: nothing is left to drop
                pass

    def close(self) -> None:
        """Stop vLLM where this engine started it (after its start, where that is still under way)."""
        if self.owns_runner:
            try:
                runner = self.runner
            except Exception:  # noqa: BLE001 (a start that failed left nothing running; its error was raised)
                return
            runner.close()


