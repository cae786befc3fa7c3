"""The base pass on vLLM 0.32 (arXiv:2502.02789, steps 9-10): PrunedRequests in, Generations out.

Each request's prompt is its kept token ids; `SpcliWorker` (vllm_worker.py) runs them
at their original positions K and decodes at n, n+1, ... The KV cache holds only the
kept tokens. Typical use:

    runner = VllmRunner(VllmRunnerConfig(model="/path/to/llama", dtype="bfloat16"), tokenizer, eos_ids)
    generations = runner.generate([request])  # spcli.stages.request.PrunedRequest
    runner.close()

Requests that keep every token are sent plain (no kept indices, no salt), so prefix caching
serves them as it serves plain vLLM. vLLM hashes blocks by token ids only, so the same ids kept at
other positions would reuse KV computed at the wrong positions. spcli's vLLM plugin (plugin.py, loaded by
vLLM's processes through its entry point) adds to each block's hash the positions its tokens run at where
they are not the natural ones: a pruned request then needs no salt, its unpruned head (a template, a
protected system prompt) is shared with every request that has it, and a document group's members
(spcli.stages.share) share their kept document. Where the plugin is not loaded (VLLM_PLUGINS leaves it out),
every pruned request carries a `cache_salt`, derived from (n, K), or for a group member from the group's kept
document (L, K[:shared_kept]): the group's questions share those blocks and nothing else does. spcli's engine
turns prefix caching on (args.py).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spcli.config.sampling import VLLM_MAX_TEMPERATURE
from spcli.engines.stop_strings import stop_at
from spcli.engines.vllm import plugin
from spcli.engines.vllm.keys import KEPT_KEY, LENGTH_KEY, WORKER_CLS, check_vllm_version
from spcli.errors import ConfigError, RecordError
from spcli.stages.request import Generation, PrunedRequest, TokenLogprob
from spcli.stages.share import shared_salt

# Engine arguments VllmRunner owns or cannot honour.
_REFUSED_ENGINE_ARGS = {
    "speculative_config": "speculative decoding builds its own positions",
    "worker_cls": "the spcli worker is required",
    "enable_prefix_caching": "use VllmRunnerConfig.enable_prefix_caching",
}


@dataclass(frozen=True)
class VllmRunnerConfig:
    """vLLM engine settings for the base model; fields map one-to-one onto LLM(...)."""

    model: str  # local folder with config.json, safetensors and a tokenizer
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # KV capacity per request: m + max_tokens
    gpu_memory_utilization: float = 0.9  # on CPU: the share of RAM vLLM may take
    max_num_batched_tokens: int | None = None  # small values force chunked prefill
    max_num_seqs: int | None = None
    kv_cache_dtype: str = "auto"  # fp8: half the KV bytes per token
    seed: int = 0
    enforce_eager: bool = False
    enable_prefix_caching: bool = False  # safe either way, see the module docstring
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # other LLM(...) args

    def __post_init__(self):
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        for key, why in _REFUSED_ENGINE_ARGS.items():
            if key in self.engine_kwargs:
                raise ConfigError(f"--engine vllm: engine argument {key!r} is refused: {why}.")


def cache_salt(kept_positions: np.ndarray, num_prompt: int) -> str:
    """A prefix-cache salt unique to (n, K): equal ids at other positions never match."""
    digest = hashlib.sha256(np.int64(num_prompt).tobytes())
    digest.update(np.ascontiguousarray(kept_positions, dtype=np.int64).tobytes())
    return "spcli-" + digest.hexdigest()


class VllmRunner:
    """A vLLM engine whose requests run kept tokens at their original positions."""

    def __init__(self, config: VllmRunnerConfig, tokenizer, eos_ids: set[int]):
        import vllm
        from vllm import LLM

        check_vllm_version(vllm.__version__)  # the worker (imported in vLLM's processes only) fits 0.32.0 exactly
        _require_v1_model_runner()
        self.config = config
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.positions_hashed = plugin.is_active()  # block hashes name positions: no salt needed (plugin.py)
        kwargs = {
            "max_model_len": config.max_model_len,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_num_seqs": config.max_num_seqs,
        }
        self.llm = LLM(
            config.model,
            dtype=config.dtype,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_cache_dtype=config.kv_cache_dtype,
            worker_cls=WORKER_CLS,
            disable_log_stats=False,  # fills RequestOutput.metrics (time to first token)
            **{k: v for k, v in kwargs.items() if v is not None},
            **config.engine_kwargs,
        )
        assert self.llm.llm_engine.vllm_config.parallel_config.worker_cls == WORKER_CLS
        model_config = self.llm.llm_engine.model_config
        self.max_model_len: int = model_config.max_model_len
        self.max_positions: int = model_config.hf_text_config.max_position_embeddings

    def check(self, req: PrunedRequest) -> None:
        """Validate one request; raises RecordError (an error row for this record)."""
        m, n = int(req.kept.numel()), req.num_prompt_tokens
        positions = req.kept.numpy()  # [m]
        if m == 0:
            raise RecordError("a request must keep at least one token")
        if positions[0] < 0 or positions[-1] >= n or np.any(np.diff(positions) <= 0):
            raise RecordError(
                f"kept positions must be strictly ascending within [0, n={n}); "
                f"got {positions[:8].tolist()}{'...' if m > 8 else ''}"
            )
        if req.max_tokens < 1:
            raise RecordError(f"max_tokens must be >= 1, got {req.max_tokens}")
        if req.temperature > VLLM_MAX_TEMPERATURE:
            raise RecordError(f"field 'temperature' ({req.temperature!r}) is more than {VLLM_MAX_TEMPERATURE}, the most "
                              "--engine vllm applies (vLLM's SamplingParams); lower it, or run --engine hf")
        if n + req.max_tokens > self.max_positions:
            raise RecordError(
                f"prompt of n={n} tokens + max_tokens={req.max_tokens} needs positions up to "
                f"{n + req.max_tokens}, beyond the model's max_position_embeddings="
                f"{self.max_positions}; shorten the prompt or lower max_tokens"
            )
        if m + req.max_tokens > self.max_model_len:
            raise RecordError(
                f"{m} kept tokens + max_tokens={req.max_tokens} exceed max_model_len="
                f"{self.max_model_len}; raise --max-model-len or lower --keep/max_tokens"
            )

    def request_inputs(self, req: PrunedRequest) -> tuple[dict, Any]:
        """The (TokensPrompt, SamplingParams) pair vLLM receives for one request."""
        from vllm import SamplingParams

        self.check(req)
        prompt = {"prompt_token_ids": req.kept_ids().tolist()}
        extra = None
        if req.is_pruned:
            positions = req.kept.tolist()
            if not self.positions_hashed:  # without the plugin: a group's members share the blocks of its kept
                # document (kept[:shared_kept], the same for each: spcli.stages.share); any other pruned request
                # only those of its own (n, K)
                shared = req.group is not None and req.shared_kept > 0
                prompt["cache_salt"] = (shared_salt(req) if shared
                                        else cache_salt(np.asarray(positions), req.num_prompt_tokens))
            extra = {KEPT_KEY: positions, LENGTH_KEY: req.num_prompt_tokens}
        s = req.sampling
        params = SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            seed=req.seed if req.temperature > 0 else None,
            logprobs=req.num_logprobs or None,  # none computed when off
            stop_token_ids=sorted(self.eos_ids),
            top_p=s.top_p, top_k=s.top_k, min_p=s.min_p, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, repetition_penalty=s.repetition_penalty,
            stop=list(s.stop) or None,
            detokenize=bool(s.stop),  # vLLM finds stop strings in its own text; spcli decodes with the base's tokenizer
            extra_args=extra,
        )
        return prompt, params

    def generate(self, batch: Sequence[PrunedRequest]) -> list[Generation]:
        """Run a batch; raises RecordError naming the first bad request (check first)."""
        inputs = []
        for i, request in enumerate(batch):
            try:
                inputs.append(self.request_inputs(request))
            except RecordError as err:
                raise RecordError(f"request {i}: {err}") from None
        if not inputs:
            return []
        prompts, params = zip(*inputs)
        start = time.perf_counter()
        outputs = self.llm.generate(list(prompts), list(params), use_tqdm=False)
        wall = time.perf_counter() - start
        ttfts = [_first_token_latency(o) for o in outputs]
        prefill_s = max((t if t is not None else wall) for t in ttfts)  # arrival -> first token of the last row
        return [self._generation(o, req, wall if t is None else t, prefill_s, wall)
                for o, req, t in zip(outputs, batch, ttfts)]

    def _generation(self, output, req: PrunedRequest, ttft_s: float, prefill_s: float, wall: float) -> Generation:
        completion = output.outputs[0]
        tokens, finish = until_eos(completion.token_ids, self.eos_ids, completion.finish_reason)
        decode = lambda t: self.tokenizer.decode(t, skip_special_tokens=True)
        tokens, text, is_stop_string = stop_at(tokens, decode, req.sampling.stop)  # as the hf engine ends and cuts
        finish = "stop" if is_stop_string else finish
        logprobs = None
        if req.num_logprobs and completion.logprobs:
            logprobs = [_token_logprob(t, step, req.num_logprobs) for t, step in zip(tokens, completion.logprobs)]
        return Generation(
            token_ids=tokens, text=text, finish_reason=finish,
            ttft_s=ttft_s, prefill_s=prefill_s, decode_s=max(0.0, wall - ttft_s), logprobs=logprobs,
        )

    def close(self) -> None:
        """Stop vLLM's engine processes now (else they stop at interpreter exit)."""
        self.llm.llm_engine.engine_core.shutdown()

    def __enter__(self) -> VllmRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def until_eos(token_ids: Sequence[int], eos_ids: set[int], finish: str | None) -> tuple[list[int], str]:
    """The hf engine's semantics: stop at the first end-of-sequence id, which is not output."""
    for i, t in enumerate(token_ids):
        if t in eos_ids:
            return list(token_ids[:i]), "stop"
    return list(token_ids), finish or "length"


def _first_token_latency(output) -> float | None:
    metrics = output.metrics
    return getattr(metrics, "first_token_latency", None) if metrics else None


def _token_logprob(token_id: int, step: dict, k: int) -> TokenLogprob:
    """vLLM's {token id: Logprob(logprob, rank)} of one step -> the chosen token and its top k."""
    top = sorted(((t, lp.logprob) for t, lp in step.items() if lp.rank is not None and lp.rank <= k),
                 key=lambda x: -x[1])
    chosen = step.get(token_id)
    return TokenLogprob(int(token_id), float(chosen.logprob) if chosen else float("nan"), top[:k])


def _require_v1_model_runner() -> None:
    """vLLM 0.32 defaults to Model Runner V2 on CUDA; the remap hooks V1 (see worker)."""
    value = os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if value.strip().lower() in ("1", "true", "yes"):
        raise ConfigError(
            "--engine vllm needs vLLM's V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER "
            "or set it to 0"
        )
