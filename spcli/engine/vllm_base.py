"""The base-model pass of Speculative Prefill on vLLM 0.32 (arXiv:2502.02789, step 9-10).

Each request's prompt is its kept token ids; `SpcliWorker` (vllm_worker.py) runs them
at their original positions K and decodes at n, n+1, ... The KV cache holds only the
kept tokens. Typical use:

    base = VllmBase(VllmBaseConfig(model="/path/to/llama", dtype="bfloat16"))
    results = base.generate([(kept_ids, kept_positions, n, max_tokens, 0.0, None)])
    base.close()

Prefix caching: vLLM hashes blocks by token ids only, so the same ids kept at other
positions would reuse KV computed at the wrong positions. It is off by default; every
pruned request also carries a `cache_salt` derived from (n, K), so turning it on (e.g.
for repeated identical selections) is safe: requests share blocks only with requests
of the same kept set and the same n.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from spcli.engine.vllm_worker import KEPT_KEY, LENGTH_KEY, WORKER_CLS  # refuses vLLM != 0.32.x
from spcli.errors import ConfigError, RecordError

# Engine arguments VllmBase owns or cannot honour.
_REFUSED_ENGINE_ARGS = {
    "speculative_config": "speculative decoding builds its own positions",
    "worker_cls": "the spcli worker is required",
    "enable_prefix_caching": "use VllmBaseConfig.enable_prefix_caching",
}


@dataclass(frozen=True)
class VllmBaseConfig:
    """vLLM engine settings for the base model; fields map one-to-one onto LLM(...)."""

    model: str  # local folder with config.json, safetensors and a tokenizer
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # KV capacity per request: m + max_tokens
    gpu_memory_utilization: float = 0.9  # on CPU: the share of RAM vLLM may take
    max_num_batched_tokens: int | None = None  # small values force chunked prefill
    max_num_seqs: int | None = None
    seed: int = 0
    enforce_eager: bool = False
    enable_prefix_caching: bool = False  # safe either way, see the module docstring
    num_logprobs: int = 5  # top-k logprobs returned for the first generated token
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # other LLM(...) args

    def __post_init__(self):
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_logprobs < 0:
            raise ConfigError(f"num_logprobs must be >= 0, got {self.num_logprobs}")
        for key, why in _REFUSED_ENGINE_ARGS.items():
            if key in self.engine_kwargs:
                raise ConfigError(f"--engine vllm: engine argument {key!r} is refused: {why}.")


class BaseRequest(NamedTuple):
    """One pruned prompt; a plain tuple in this field order works too."""

    kept_ids: Sequence[int]  # [m] token ids of the kept tokens
    kept_positions: Sequence[int]  # [m] their original indices, strictly ascending, < n
    num_prompt: int  # n, the original prompt length
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class BaseResult:
    token_ids: list[int]  # [num_generated]
    text: str
    finish_reason: str | None  # "stop" | "length" | ...
    first_logprobs: dict[int, float]  # top num_logprobs of the first step: token id -> logprob
    ttft_s: float | None  # arrival -> first token, as vLLM measured it


def cache_salt(kept_positions: np.ndarray, num_prompt: int) -> str:
    """A prefix-cache salt unique to (n, K): equal ids at other positions never match."""
    digest = hashlib.sha256(np.int64(num_prompt).tobytes())
    digest.update(np.ascontiguousarray(kept_positions, dtype=np.int64).tobytes())
    return "spcli-" + digest.hexdigest()


class VllmBase:
    """A vLLM engine whose requests run kept tokens at their original positions."""

    def __init__(self, config: VllmBaseConfig):
        from vllm import LLM

        _require_v1_model_runner()
        self.config = config
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
            worker_cls=WORKER_CLS,
            disable_log_stats=False,  # fills RequestOutput.metrics (time to first token)
            **{k: v for k, v in kwargs.items() if v is not None},
            **config.engine_kwargs,
        )
        assert self.llm.llm_engine.vllm_config.parallel_config.worker_cls == WORKER_CLS
        model_config = self.llm.llm_engine.model_config
        self.max_model_len: int = model_config.max_model_len
        self.max_positions: int = model_config.hf_text_config.max_position_embeddings

    def check_request(self, request: BaseRequest | tuple) -> BaseRequest:
        """Validate one request; raises RecordError (an error row for this record)."""
        req = BaseRequest(*request)
        m, n = len(req.kept_ids), req.num_prompt
        positions = np.asarray(req.kept_positions, dtype=np.int64)  # [m]
        if m == 0 or positions.shape != (m,):
            raise RecordError(
                f"kept_ids ({m}) and kept_positions ({positions.size}) must be non-empty "
                "and of equal length"
            )
        if positions[0] < 0 or positions[-1] >= n or np.any(np.diff(positions) <= 0):
            raise RecordError(
                f"kept_positions must be strictly ascending within [0, n={n}); "
                f"got {positions[:8].tolist()}{'...' if m > 8 else ''}"
            )
        if req.max_tokens < 1:
            raise RecordError(f"max_tokens must be >= 1, got {req.max_tokens}")
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
        return req

    def request_inputs(self, request: BaseRequest | tuple) -> tuple[dict, Any]:
        """The (TokensPrompt, SamplingParams) pair vLLM receives for one request."""
        from vllm import SamplingParams

        req = self.check_request(request)
        positions = [int(p) for p in req.kept_positions]
        prompt = {
            "prompt_token_ids": [int(t) for t in req.kept_ids],
            "cache_salt": cache_salt(np.asarray(positions), req.num_prompt),
        }
        params = SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            seed=req.seed,
            logprobs=self.config.num_logprobs or None,
            extra_args={KEPT_KEY: positions, LENGTH_KEY: int(req.num_prompt)},
        )
        return prompt, params

    def generate(self, batch: Sequence[BaseRequest | tuple]) -> list[BaseResult]:
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
        outputs = self.llm.generate(list(prompts), list(params), use_tqdm=False)
        return [self._result(out) for out in outputs]

    def _result(self, output) -> BaseResult:
        completion = output.outputs[0]
        first = completion.logprobs[0] if completion.logprobs else {}
        top = {t: lp.logprob for t, lp in first.items() if lp.rank <= self.config.num_logprobs}
        metrics = output.metrics
        return BaseResult(
            token_ids=list(completion.token_ids),
            text=completion.text,
            finish_reason=completion.finish_reason,
            first_logprobs=top,
            ttft_s=getattr(metrics, "first_token_latency", None) if metrics else None,
        )

    def close(self) -> None:
        """Stop vLLM's engine processes now (else they stop at interpreter exit)."""
        self.llm.llm_engine.engine_core.shutdown()

    def __enter__(self) -> VllmBase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _require_v1_model_runner() -> None:
    """vLLM 0.32 defaults to Model Runner V2 on CUDA; the remap hooks V1 (see worker)."""
    value = os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if value.strip().lower() in ("1", "true", "yes"):
        raise ConfigError(
            "--engine vllm needs vLLM's V1 model runner: unset VLLM_USE_V2_MODEL_RUNNER "
            "or set it to 0"
        )

