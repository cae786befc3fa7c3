"""Per-record work shared by every engine: tokenize -> speculate -> select.

The engines differ only in how they run the base model on the result.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch
from torch import nn

from spcli.config import RunConfig
from spcli.engine.select import is_pruned, select_tokens
from spcli.engine.speculate import speculate
from spcli.engine.tokenize import tokenize
from spcli.errors import RecordError
from spcli.io.records import Record, shard_kind, where
from spcli.io.schema import RowResult


def row_seed(seed: int, row_id: str) -> int:
    """A per-row sampling seed: stable across batching, resume and Slurm tasks."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{row_id}".encode()).digest()[:7], "big")


@dataclass
class Prepared:
    index: int  # position in the batch
    record: Record
    input_ids: list[int]  # the whole prompt, n tokens
    kept: torch.Tensor  # [m] int64 ascending indices into input_ids
    keep: float
    max_tokens: int
    temperature: float  # the record's, else --temperature
    speculate_s: float  # speculator prefill + look-ahead + scoring; 0 when not pruned
    importance: torch.Tensor | None  # [n] float32, when the speculator ran


def prepare(
    index: int, rec: Record, cfg: RunConfig, tokenizer, max_positions: int,
    speculator: nn.Module | None, eos_ids: set[int], device: torch.device,
) -> Prepared:
    """Tokenize a record and choose its kept tokens; a problem with this record raises RecordError.

    `speculator` is a model, or a function returning one: it is only called when the prompt is
    pruned, so a run at keep 1.0 never loads a speculator.
    """
    max_tokens = rec.max_tokens or cfg.generate.max_tokens
    ids = tokenize(rec, tokenizer, max_positions - max_tokens, cfg.truncate)
    keep = rec.keep if rec.keep is not None else cfg.select.keep
    temperature = rec.temperature if rec.temperature is not None else cfg.generate.temperature
    n = len(ids)
    if not is_pruned(n, cfg.select, keep):
        return Prepared(index, rec, ids, torch.arange(n), keep, max_tokens, temperature, 0.0, None)
    try:
        spec = speculate(speculator() if callable(speculator) else speculator, ids, cfg.score, eos_ids, device)
    except torch.OutOfMemoryError:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise RecordError(f"the speculator ran out of GPU memory on {n} tokens") from None
    kept = select_tokens(spec.importance, cfg.select, keep)
    return Prepared(index, rec, ids, kept, keep, max_tokens, temperature, spec.speculate_s + spec.score_s,
                    spec.importance)


def error_row(rec: Record, shard_paths: dict[int, str], message: str) -> RowResult:
    return RowResult(rec.id, shard_paths[rec.shard], rec.row, error=message,
                     custom_id=rec.custom_id, endpoint=rec.endpoint)


def where_of(rec: Record, shard_paths: dict[int, str]) -> str:
    """How an error names a record: `file:line N` (JSONL, 1-based) or `file:row N` (Parquet)."""
    path = shard_paths[rec.shard]
    return where(path, rec.row, shard_kind(path))


class RecordEngine:
    """What every engine shares: one row per record, bad records as error rows.

    A subclass sets cfg, shard_paths, tokenizer, max_positions, eos_ids, device and a
    `speculator` attribute or property, and implements `_generate(ready, t0)`.
    """

    cfg: RunConfig
    shard_paths: dict[int, str]

    def _check(self, p: Prepared) -> None:
        """Engine-specific refusals of a prepared record (raise RecordError)."""

    def _generate(self, ready: list[Prepared], t0: float) -> list[RowResult]:
        raise NotImplementedError

    def _error(self, rec: Record, message: str) -> RowResult:
        return error_row(rec, self.shard_paths, message)

    def _row(self, p: Prepared, token_ids: list[int], finish_reason: str, ttft_s: float, prefill_s: float,
             decode_s: float) -> RowResult:
        """The output row of a prepared record whose base pass generated `token_ids` (EOS excluded)."""
        rec = p.record
        return RowResult(
            id=rec.id, shard=self.shard_paths[rec.shard], row=rec.row,
            output=self.tokenizer.decode(token_ids, skip_special_tokens=True), finish_reason=finish_reason,
            num_prompt_tokens=len(p.input_ids), num_kept_tokens=int(p.kept.numel()),
            num_output_tokens=len(token_ids), kept_indices=p.kept.tolist(), ttft_s=ttft_s,
            speculate_s=p.speculate_s, prefill_s=prefill_s, decode_s=decode_s,
            importance=p.importance.tolist() if (self.cfg.save_scores and p.importance is not None) else None,
            custom_id=rec.custom_id, endpoint=rec.endpoint,
        )

    def run_batch(self, records: list[Record]) -> list[RowResult]:
        t0 = time.perf_counter()
        results: list[RowResult | None] = [None] * len(records)
        ready: list[Prepared] = []
        for i, rec in enumerate(records):
            if rec.error is not None:
                results[i] = self._error(rec, rec.error)
                continue
            try:
                p = prepare(i, rec, self.cfg, self.tokenizer, self.max_positions, lambda: self.speculator,
                            self.eos_ids, self.device)
                self._check(p)
                ready.append(p)
            except RecordError as e:
                results[i] = self._error(rec, f"{where_of(rec, self.shard_paths)}: {e}")
        if ready:
            for p, r in zip(ready, self._generate(ready, t0)):
                results[p.index] = r
        return results  # type: ignore[return-value]
