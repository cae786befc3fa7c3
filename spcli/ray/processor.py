"""A Ray Data processor for pipelines already in Ray Data: records in, spcli's output rows out.

    from spcli.ray import build_processor
    processor = build_processor(model="smollm2-135m", keep=0.3, max_tokens=64, concurrency=4)
    rows = processor(ray.data.read_parquet("s3://bucket/docs/"))   # a lazy Dataset; .write_parquet(...) etc.

Two actor-pool stages, each `Dataset.map_batches` over a callable class (Ray Data LLM's shape: a processor is a
chain of stages, each an actor pool with its own concurrency, batch size and resources):
  1. PrepareStage: record -> tokenize -> speculate -> select (spcli/stages/prepare.py), on the GPUs (or CPUs) it
     is given. Out: the kept token ids and their positions (`tokenized_prompt`, and `sampling_params` whose
     `extra_args` carry spcli's kept positions, as spcli's vLLM worker reads them), or the row's error.
  2. BasePassStage: the base model prefills the kept tokens at their original positions and decodes:
     `engine="hf"`, spcli's hf pass; `engine="vllm"`, spcli's vLLM engine (vLLM with spcli's worker class, the
     kept positions in each request, TP on the actor's GPUs as `--tp` says). Out: spcli's output columns
     (batch.output_row), as `spcli run` writes.
With `engine="vllm"` stage 1 loads the speculator alone (no base weights) on its actor's device, and stage 2's
vLLM takes only the prepared requests: no speculator pass runs in vLLM's workers.
A bad record (no prompt, a wrong type, too long) becomes a row with `error` set in either stage, never a
failed job; an input column `id` names rows (else a stable hash of the record).

Where this differs from Ray Data LLM (`ray.data.llm.build_processor`): the speculator stage is new, and
errors are rows by design (Ray Data LLM's `should_continue_on_error` is off by default and covers the engine
stage only); no checkpointing of its own (Ray Data's, or `spcli run --ray` for files: exactly once, resumable).
The vLLM stage is spcli's own, not Ray Data LLM's `vLLMEngineProcessorConfig` stage: stage 1's `tokenized_prompt`
and `sampling_params.extra_args` carry what spcli's worker reads, so that stage could take them with
`engine_kwargs={"worker_cls": ...}`, but spcli's stage also turns vLLM's refusals into error rows.
"""

from __future__ import annotations

import dataclasses
import hashlib

import orjson
import pyarrow as pa

from spcli.config.run import RunConfig
from spcli.config.sampling import NAMES, Sampling
from spcli.errors import ConfigError
from spcli.io.schema import SAMPLING

SHARD_PATH = "dataset"  # how error messages name a dataset row: "dataset:row N" is not meaningful, ids are
_IDS = pa.list_(pa.int64())
PREPARED_SCHEMA = pa.schema([
    ("id", pa.string()), ("custom_id", pa.string()), ("error", pa.string()), ("token_ids", _IDS), ("kept", _IDS),
    ("max_tokens", pa.int64()), ("temperature", pa.float64()), ("seed", pa.int64()), ("keep", pa.string()),
    ("speculate_s", pa.float64()), ("importance", pa.list_(pa.float32())),
    ("tokenized_prompt", _IDS),  # the kept token ids: what the base model prefills
    ("sampling_params", pa.struct([("max_tokens", pa.int64()), ("temperature", pa.float64()), ("seed", pa.int64()),
                                   *[(f.name, f.type) for f in SAMPLING if f.name not in ("temperature", "seed")],
                                   ("extra_args", pa.struct([("spcli_kept", _IDS), ("spcli_n", pa.int64())]))])),
])
PREPARED = tuple(PREPARED_SCHEMA.names)


def build_processor(*, concurrency: int = 1, batch_size: int = 8, num_cpus: float = 1, num_gpus: float = 0,
                    prepare_concurrency: int | None = None, **flags):
    """A callable `Dataset -> Dataset`. flags: spcli run's (spcli.api names: model, keep, max_tokens, ...).
    concurrency: actors of the base-pass stage (prepare_concurrency: of the prepare stage; default the same);
    num_cpus / num_gpus: each actor's."""
    from spcli.api import run_config
    from spcli.ray.cluster import require_ray

    require_ray()
    # each row alone: Ray Data cuts its batches where it likes, and a group's rows must not depend on where
    if flags.get("groups", "off") != "off":
        raise ConfigError("build_processor runs every record alone (groups='off'): Ray Data batches rows where it "
                          "likes, so a document group could be cut; use `spcli run --ray` for document groups")
    cfg = run_config(["-"], "-", **{**flags, "groups": "off"})
    return SpcliProcessor(cfg, concurrency, prepare_concurrency or concurrency, batch_size, num_cpus, num_gpus)


class SpcliProcessor:
    def __init__(self, cfg: RunConfig, concurrency: int, prepare_concurrency: int, batch_size: int,
                 num_cpus: float, num_gpus: float):
        self.cfg, self.batch_size = cfg, batch_size
        self.concurrency, self.prepare_concurrency = concurrency, prepare_concurrency
        self.resources = {"num_cpus": num_cpus, "num_gpus": num_gpus}

    def __call__(self, ds):
        kw = dict(batch_size=self.batch_size, batch_format="pyarrow", fn_constructor_kwargs={"cfg": self.cfg},
                  **self.resources)
        ds = ds.map_batches(PrepareStage, concurrency=self.prepare_concurrency, **kw)
        return ds.map_batches(BasePassStage, concurrency=self.concurrency, **kw)


def _engine(cfg: RunConfig, prepares: bool = False):
    """The stage's engine and the resolved configuration (the model's scoring settings filled in) it runs.
    prepares: stage 1 of a vLLM processor, the speculator alone on this actor's device (an hf engine without
    base weights; the same resolved run, so its dtype is the vLLM base's)."""
    import os

    from spcli.engines.hf.engine import HFEngine
    from spcli.job.progress import setup_logging
    from spcli.job.run import build_engine
    from spcli.models.resolved import resolve_run
    from spcli.ray.worker import VLLM_EXECUTOR_ENV

    setup_logging("WARNING")
    os.environ.setdefault(VLLM_EXECUTOR_ENV, "mp")  # vLLM's own processes for TP inside this actor, as worker.py
    resolved = resolve_run(cfg)
    if cfg.engine == "vllm":
        from spcli.engines.vllm.driver.engine import VllmEngine

        if prepares:
            return HFEngine(resolved, with_base=False), resolved.cfg
        return VllmEngine(resolved, with_speculator=False), resolved.cfg
    return build_engine(resolved), resolved.cfg


def stable_id(obj) -> str:
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        data = repr(obj).encode()
    return "sha1:" + hashlib.sha1(data).hexdigest()[:16]


def _plain(value):
    """numpy arrays (Ray Data's list columns) -> lists, recursively: spcli validates plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class PrepareStage:
    """Stage 1: records -> kept tokens (or an error), one row each, in order."""

    def __init__(self, cfg: RunConfig):
        self.engine, self.cfg = _engine(cfg, prepares=True)

    def __call__(self, batch):
        from spcli.io.records import to_record, where
        from spcli.io.schema import RowResult
        from spcli.io.shards import Shard
        from spcli.job.batch import prepared

        records = []
        for row, obj in enumerate(batch.to_pylist()):
            obj = _plain(obj)
            if isinstance(obj, dict) and obj.get(self.cfg.fields.id) is None:
                obj = {**obj, self.cfg.fields.id: stable_id(obj)}
            rec = to_record(obj, Shard(0, SHARD_PATH), row, "jsonl", self.cfg.fields)
            if rec.error is not None:
                rec.error = f"record {rec.id}: {rec.error.split(': ', 1)[-1]}"
            records.append(rec)
        out = {k: [] for k in PREPARED}
        for rec, item in zip(records, prepared(self.engine, records, self.cfg, {0: SHARD_PATH})):
            done = isinstance(item, RowResult)
            error = (item.error.replace(where(SHARD_PATH, rec.row, "jsonl"), f"record {rec.id}") if done else None)
            kept = None if done else item.kept.tolist()
            values = dict(id=rec.id, custom_id=rec.custom_id, error=error, token_ids=None if done else item.token_ids,
                          kept=kept, max_tokens=None if done else item.max_tokens,
                          temperature=None if done else item.temperature, seed=None if done else item.seed,
                          keep=None if done else str(item.keep), speculate_s=None if done else item.speculate_s,
                          importance=None if done or item.importance is None or not self.cfg.save_scores
                          else item.importance.tolist(),
                          tokenized_prompt=None if done else [item.token_ids[i] for i in kept],
                          sampling_params=None if done else _sampling(item))
            for k in PREPARED:
                out[k].append(values[k])
        return pa.table(out, schema=PREPARED_SCHEMA)  # typed even where a batch is all errors (null columns)


def _sampling(req) -> dict:
    """vLLM's SamplingParams for a prepared request, with spcli's kept positions in `extra_args` (what spcli's
    vLLM worker reads: spcli/engines/vllm/worker/positions.py), as Ray Data LLM's vLLM stage takes them per row."""
    from spcli.engines.vllm.keys import KEPT_KEY, LENGTH_KEY

    return {"max_tokens": req.max_tokens, "temperature": req.temperature, "seed": req.seed,
            **dataclasses.asdict(req.sampling), "stop": list(req.sampling.stop),
            "extra_args": {KEPT_KEY: req.kept.tolist(), LENGTH_KEY: req.num_prompt_tokens}}


class BasePassStage:
    """Stage 2: kept tokens -> generations -> spcli's output rows (errors pass through as rows)."""

    def __init__(self, cfg: RunConfig):
        self.engine, self.cfg = _engine(cfg)

    def __call__(self, batch):
        import torch

        from spcli.errors import RecordError
        from spcli.io.records import Record
        from spcli.io.schema import RowResult, to_table
        from spcli.job.batch import output_row
        from spcli.stages.request import PrunedRequest

        rows = [_plain(r) for r in batch.to_pylist()]
        results: list[RowResult | None] = [None] * len(rows)
        todo = []
        for i, r in enumerate(rows):
            if r["error"] is not None:
                results[i] = RowResult(r["id"], SHARD_PATH, i, error=r["error"], custom_id=r["custom_id"])
                continue
            keep = r["keep"] if r["keep"] == "auto" else float(r["keep"])
            todo.append((i, PrunedRequest(
                record_id=r["id"], token_ids=r["token_ids"], kept=torch.tensor(r["kept"], dtype=torch.int64),
                max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"], keep=keep,
                sampling=Sampling(**{n: r["sampling_params"][n] for n in NAMES if n != "stop"},
                                  stop=tuple(r["sampling_params"]["stop"] or ())),
                num_logprobs=self.cfg.generate.logprobs, speculate_s=r["speculate_s"],
                importance=None if r["importance"] is None else torch.tensor(r["importance"]))))
        gens = self.engine.generate([req for _, req in todo]) if todo else []
        for (i, req), gen in zip(todo, gens):
            rec = Record(0, i, rows[i]["id"], custom_id=rows[i]["custom_id"])
            if isinstance(gen, RecordError):
                results[i] = RowResult(rec.id, SHARD_PATH, i, error=f"record {rec.id}: {gen}", custom_id=rec.custom_id)
            else:
                results[i] = output_row(rec, {0: SHARD_PATH}, req, gen, 0.0, self.cfg.save_scores,
                                        self.engine.stack.tokenizer)
        table = to_table(results, self.cfg.save_scores)  # spcli's output schema, as spcli run writes it
        return table.drop_columns([c for c in ("shard", "row") if c in table.column_names])  # no file position
