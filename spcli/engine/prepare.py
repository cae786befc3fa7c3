"""The per-record stages every engine shares: tokenize -> speculate -> select, giving PrunedRequests.

The engines differ only in how the base model generates from the result (hf_pass.py, vllm_pass.py).
"""

from __future__ import annotations

import gc
import hashlib
import time

import torch

from spcli.config import SPECULATOR_CHUNK, RunConfig, ScoreConfig, SelectConfig
from spcli.engine.load import ModelStack
from spcli.engine.request import PrunedRequest
from spcli.engine.select import is_pruned, select_tokens
from spcli.engine.speculate import speculate_batch
from spcli.engine.tokenize import tokenize
from spcli.errors import RecordError
from spcli.io.records import Record
from spcli.stop import StopAtSafePoint


def row_seed(seed: int, row_id: str) -> int:
    """A per-row sampling seed: stable across batching, resume and Slurm tasks."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{row_id}".encode()).digest()[:7], "big")


def request_for(rec: Record, cfg: RunConfig, stack: ModelStack) -> PrunedRequest:
    """Tokenize one record into an unpruned request (all tokens kept); a bad record raises RecordError."""
    max_tokens = rec.max_tokens or cfg.generate.max_tokens
    ids = tokenize(rec, stack.tokenizer, stack.max_prompt_tokens(max_tokens), cfg.truncate,
                   stack.prompt_limit(max_tokens))
    temperature = rec.temperature if rec.temperature is not None else cfg.generate.temperature
    return PrunedRequest(
        record_id=rec.id, token_ids=ids, kept=torch.arange(len(ids)), max_tokens=max_tokens,
        temperature=temperature, seed=row_seed(cfg.generate.seed, rec.id),
        keep=rec.keep if rec.keep is not None else cfg.select.keep, num_logprobs=cfg.generate.logprobs,
    )


def prepare(records: list[Record], cfg: RunConfig, stack: ModelStack, on_stage=lambda text: None,
            should_stop=lambda: False) -> list[PrunedRequest | RecordError]:
    """One request per record, in order, or the RecordError that makes it an error row."""
    out: list[PrunedRequest | RecordError] = []
    for rec in records:
        try:
            out.append(request_for(rec, cfg, stack))
        except RecordError as e:
            out.append(e)
    ready = [i for i, r in enumerate(out) if isinstance(r, PrunedRequest)]
    pruned = prune([out[i] for i in ready], cfg.select, cfg.score, stack, on_stage, should_stop, cfg.speculator_chunk)
    for i, r in zip(ready, pruned):
        out[i] = r
    return out


SPECULATOR_BATCH_TOKENS = 32768  # padded tokens per speculator forward
MAX_PADDING = 1.125  # a group's padded size over its real tokens


def length_groups(lengths: list[int], max_tokens: int = SPECULATOR_BATCH_TOKENS) -> list[list[int]]:
    """Indices grouped for batched speculator passes: longest first, each group padded by at most
    MAX_PADDING and at most max_tokens padded tokens (a longer prompt goes alone)."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        g = groups[-1] if groups else None
        if g and lengths[g[0]] * (len(g) + 1) <= min(max_tokens, MAX_PADDING * (real + lengths[i])):
            g.append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return groups


def prune(requests: list[PrunedRequest], select: SelectConfig, score: ScoreConfig, stack: ModelStack,
          on_stage=lambda text: None, should_stop=lambda: False,
          chunk: int = SPECULATOR_CHUNK) -> list[PrunedRequest | RecordError]:
    """Speculate and select the requests whose prompts are pruned (in place); the others keep every token.

    Pruned prompts of similar length share one speculator pass (their importance is the same as
    alone). The speculator is loaded on first use, so a run at keep 1.0 never loads one. A batch
    that runs out of memory is retried one prompt at a time; a prompt that still does becomes a
    RecordError. on_stage hears progress; should_stop() is asked between groups (StopAtSafePoint);
    chunk: tokens per speculator prefill call.
    """
    out: list[PrunedRequest | RecordError] = list(requests)
    todo = [i for i, r in enumerate(requests) if is_pruned(r.num_prompt_tokens, select, r.keep)]
    done = 0
    for group in length_groups([requests[i].num_prompt_tokens for i in todo]):
        if should_stop():
            raise StopAtSafePoint
        on_stage(f"speculating {done + 1}-{done + len(group)} of {len(todo)} prompts")
        done += len(group)
        indices = [todo[g] for g in group]
        for i, spec in zip(indices, _speculate([requests[i] for i in indices], score, stack, chunk)):
            req = requests[i]
            if isinstance(spec, RecordError):
                out[i] = spec
                continue
            t0 = time.perf_counter()
            req.importance = spec.importance
            req.kept = select_tokens(spec.importance, select, req.keep)
            req.speculate_s = spec.speculate_s + time.perf_counter() - t0
    return out


def _speculate(batch: list[PrunedRequest], score: ScoreConfig, stack: ModelStack, chunk: int) -> list:
    try:
        return speculate_batch(stack.speculator, [r.token_ids for r in batch], score, stack.eos_ids, stack.device,
                               chunk=chunk)
    except torch.OutOfMemoryError:
        free_memory()
        if len(batch) > 1:
            return [s for r in batch for s in _speculate([r], score, stack, chunk)]
        return [RecordError(f"the speculator ran out of memory on {batch[0].num_prompt_tokens} tokens")]


def free_memory() -> None:
    """After an out-of-memory error: the failed tensors are garbage once the exception is gone."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
