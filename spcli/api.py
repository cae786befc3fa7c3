"""spcli as a library, for notebooks and pipelines: `run` a job, or `prefill` records and get rows back.

Both take `spcli run`'s flags as keyword arguments, named as the flag with underscores
(`--keep 0.3` -> keep=0.3, `--prompt-field body` -> prompt_field="body", `--score-layers 14` ->
score_layers="14") and build the same `RunConfig` the command line builds: `spcli run` calls `run`
below. An unknown keyword is refused by name (docs/guide/python.md).

    from spcli import api
    summary = api.run(["tickets.parquet"], "out/tickets", keep=0.3, max_tokens=64)
    rows = api.prefill([{"id": "t1", "prompt": "Summarise: ..."}], keep=0.3, max_tokens=32)
"""

from __future__ import annotations

import dataclasses
import difflib
import tempfile
from collections.abc import Iterable
from pathlib import Path

from spcli.config.run import RunConfig
from spcli.errors import ConfigError

SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)
            if f.default_factory is not dataclasses.MISSING}  # RunConfig's nested configs: select, score, ...
RENAMED = {("score", "impl"): "score_impl", ("fields", "instruction_at"): "instruction_at"}  # flags whose name is not their field's


def _flag_table() -> dict[str, tuple[str | None, str]]:
    """Every keyword -> (section or None for RunConfig itself, field name).

    A section's field is its own flag (keep, window, max_tokens, tp...); FieldConfig's `X` is `X_field`
    (prompt_field, id_field), as on the command line."""
    table: dict[str, tuple[str | None, str]] = {
        f.name: (None, f.name) for f in dataclasses.fields(RunConfig) if f.name not in {*SECTIONS, "inputs", "out"}
    }
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            name = RENAMED.get((section, f.name), f"{f.name}_field" if section == "fields" else f.name)
            assert name not in table, f"flag {name} names two config fields"
            table[name] = (section, f.name)
    return table


FLAGS = _flag_table()


def run_config(inputs: str | Path | Iterable[str | Path], out: str | Path, **flags) -> RunConfig:
    """The RunConfig of `spcli run INPUT... --out OUT --flag value ...`; None leaves a flag at its default."""
    unknown = sorted(set(flags) - set(FLAGS))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, FLAGS, n=1)
            hints.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise ConfigError(f"unknown spcli run option(s): {', '.join(hints)}; the options are spcli run's flags "
                          "with underscores (spcli run --help)")
    inputs = (inputs,) if isinstance(inputs, (str, Path)) else tuple(inputs)
    top: dict = {}
    nested: dict[str, dict] = {s: {} for s in SECTIONS}
    for name, value in flags.items():
        section, field = FLAGS[name]
        if value is None and field not in _nullable(section):
            continue  # the CLI's own defaults are the config's: None means "not given"
        (top if section is None else nested[section])[field] = value
    sections = {s: make(**nested[s]) for s, make in SECTIONS.items()}
    return RunConfig(inputs=tuple(str(i) for i in inputs), out=str(out), **top, **sections)


def _nullable(section: str | None) -> set[str]:
    """Fields whose default is None: None is then a value (the model's default), passed on as given."""
    cls = RunConfig if section is None else SECTIONS[section]
    return {f.name for f in dataclasses.fields(cls) if f.default is None}


def run(inputs: str | Path | Iterable[str | Path], out: str | Path, progress=None, **flags):
    """Run a job, as `spcli run` does: resumable, exactly once, outputs in `out`. Returns its RunSummary.

    progress: a `spcli.job.progress.Progress` (the CLI passes one); None = plain progress lines on a terminal.
    Raises SpcliError subclasses (ConfigError, InputError, OutputError...) with the CLI's messages, and
    `spcli.errors.Interrupted` after committing what was finished when SIGINT/SIGTERM/SIGUSR1 arrived."""
    cfg = run_config(inputs, out, **flags)
    # imported here, not at the top: the job pulls in torch and transformers, which `spcli --help` never needs
    if cfg.ray is not None:
        from spcli.ray.driver import run_on_ray  # a pool of actors, each running spcli.job.run.run on its share

        return run_on_ray(cfg, progress)
    from spcli.job.run import run as run_job

    return run_job(cfg, progress)


def prefill(records: list[dict], **flags) -> list[dict]:
    """Run records (dicts as in a JSONL input: `prompt` or `messages`, optional `id`, `max_tokens`, `keep`)
    through the same job in a temporary directory; return one output row per record, in input order.

    A row is the Parquet output's columns (id, output, finish_reason, num_prompt_tokens, num_kept_tokens,
    keep_rate, kept_indices, timings, error...); a bad record is a row with `error` set. Records without
    an id get `records:<index>`. Every `spcli run` flag but `inputs`, `out` and `output_format` applies."""
    import orjson

    from spcli.inspect.outputs import load_run

    refused = sorted({"inputs", "out", "output_format", "fresh", "force", "retry_failed"} & set(flags))
    if refused:
        raise ConfigError(f"prefill takes no {', '.join(refused)}: it writes to a temporary directory and "
                          "returns the rows; use spcli.api.run for an output directory")
    if isinstance(records, (dict, str, bytes)):
        raise ConfigError("prefill takes a list of records (dicts with prompt or messages)")
    with tempfile.TemporaryDirectory(prefix="spcli-prefill-") as tmp:
        shard = Path(tmp) / "records.jsonl"
        with open(shard, "wb") as f:
            for i, record in enumerate(records):
                if not isinstance(record, dict):
                    raise ConfigError(f"record {i}: expected a dict with prompt or messages, got {type(record).__name__}")
                try:
                    f.write(orjson.dumps(record) + b"\n")
                except TypeError as e:
                    raise ConfigError(f"record {i}: not JSON-serialisable ({e})") from None
        if not records:
            return []
        out = Path(tmp) / "out"
        run([shard], out, **flags)
        rows = [row for part in load_run(out).parts for row in _part_rows(part)]
    if not flags.get("save_scores"):
        for row in rows:
            row.pop("importance", None)
    return rows


def _part_rows(part: Path) -> list[dict]:
    """Every column of a committed part file (input columns carried by --pass-through included)."""
    import orjson
    import pyarrow.parquet as pq

    if part.suffix == ".parquet":
        return pq.read_table(part).to_pylist()
    return [orjson.loads(line) for line in part.read_bytes().splitlines() if line.strip()]
