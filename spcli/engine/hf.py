"""The `hf` engine: transformers + torch, the reference engine and the embedded default.

Wires, for one batch of records: tokenize -> speculate -> score -> select -> prefill+decode.
"""

from __future__ import annotations

import time

import torch

from spcli import models
from spcli.config import RunConfig
from spcli.engine import load
from spcli.engine.prefill import PrunedPrompt, generate_pruned
from spcli.engine.prepare import Prepared, RecordEngine, row_seed, where_of
from spcli.io.schema import RowResult


class HFEngine(RecordEngine):
    def __init__(self, cfg: RunConfig, shard_paths: dict[int, str], log=lambda msg: None):
        self.cfg = cfg
        self.shard_paths = shard_paths
        self.log = log
        self.device = load.pick_device(cfg.device)
        self.dtype = cfg.dtype or models.default_dtype(cfg.model)
        path = models.locate(cfg.model)
        self.base = load.load_causal_lm(path, self.dtype, self.device)
        self.tokenizer = load.load_tokenizer(path)
        self.eos_ids = load.eos_token_ids(self.base.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self.max_positions = int(getattr(self.base.model.config, "max_position_embeddings", 1 << 30))
        self.speculator_name = cfg.speculator or models.default_speculator(cfg.model)
        self._speculator = None

    @property
    def speculator(self):
        """Loaded on first use: a run at keep=1.0 never loads it."""
        if self._speculator is None:
            k = load.parse_self(self.speculator_name)
            if k is not None:
                self._speculator = load.first_layers(self.base.model, k)
            else:
                path = models.locate(self.speculator_name)
                load.check_same_vocabulary(self.tokenizer, load.load_tokenizer(path), self.cfg.model, self.speculator_name)
                self._speculator = load.load_causal_lm(path, self.dtype, self.device).model
        return self._speculator

    def _generate(self, ready: list[Prepared], t0: float) -> list[RowResult]:
        gcfg = self.cfg.generate
        prompts = [
            PrunedPrompt(torch.tensor(p.input_ids)[p.kept], p.kept, len(p.input_ids), p.max_tokens,
                         p.temperature, row_seed(gcfg.seed, p.record.id))
            for p in ready
        ]
        try:
            gens, timing = generate_pruned(self.base.model, prompts, self.eos_ids, self.pad_id, self.device)
        except (RuntimeError, MemoryError) as e:
            if len(ready) == 1:
                rec = ready[0].record
                return [self._error(rec, f"{where_of(rec, self.shard_paths)}: model failed: {e}")]
            self.log(f"batch of {len(ready)} failed ({e}); retrying one row at a time")
            return [r for p in ready for r in self._generate([p], time.perf_counter())]
        ttft = time.perf_counter() - t0 - timing.decode_s
        return [self._row(p, g.token_ids, g.finish_reason, ttft, timing.prefill_s, timing.decode_s)
                for p, g in zip(ready, gens)]
