"""`spcli slurm submit`: check a submission, write its sbatch script, submit it, record it.

Everything a task would trip over is checked here, on the login node, before anything is queued:
the inputs exist and hold shards, the `spcli run` options after `--` parse and validate, and the
output directory does not hold work split another way (a different task count would hand a
shard that one task has half done to another task, which would write its rows a second time).

Each submission appends one JSON line to <out>/slurm/submissions.jsonl: the job id, the array size
and every shard in split order, so `spcli status` knows each task's shards before it has started.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from spcli.config.run import FieldConfig, GenerateConfig, RunConfig, VllmConfig
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.errors import ConfigError, OutputError
from spcli.io.manifest import read_manifests
from spcli.io.shards import discover
from spcli.slurm import query
from spcli.slurm.script import SubmitOptions, render_sbatch, submit, write_script
from spcli.slurm.tasks import assign_shards

SUBMISSIONS = "submissions.jsonl"
# `spcli run` flags whose name differs from the config field they set (cli.run).
_RENAMED = {"prompt_field": "prompt", "messages_field": "messages", "id_field": "id", "score_impl": "impl"}
_NESTED = {"select": SelectConfig, "score": ScoreConfig, "generate": GenerateConfig, "fields": FieldConfig,
           "vllm": VllmConfig}


@dataclass(frozen=True)
class Submission:
    """One line of <out>/slurm/submissions.jsonl."""

    job_id: str
    tasks: int
    shards: tuple[str, ...]  # every input shard (absolute), in the order the tasks split them
    time: float
    max_requeues: int

    def task_shards(self, index: int) -> list[str]:
        return [self.shards[i] for i in assign_shards(self.shards, index, self.tasks)]


@dataclass(frozen=True)
class Plan:
    """A checked submission: the script to write and submit."""

    options: SubmitOptions
    out: Path  # absolute
    shards: tuple[str, ...]
    script: str
    warnings: tuple[str, ...]


CPUS_PER_CPU_TASK = 8  # torch's threads for a model that runs on the CPU
CPUS_PER_GPU = 4  # a GPU's worker process, its tokenizer and data loading


def task_resources(cfg: RunConfig) -> tuple[int, int]:
    """GPUs and CPUs a task of `cfg` asks for by default: no GPU for a CPU model (smollm2-135m) or
    --device cpu; the tensor-parallel size (--tp, else the preset's) for --engine vllm; else one."""
    from spcli.models.lookup import PRESETS

    preset = PRESETS.get(cfg.model)
    if cfg.device == "cpu" or (cfg.device == "auto" and preset is not None and preset.is_cpu_model):
        return 0, CPUS_PER_CPU_TASK
    gpus = (cfg.vllm.tp or (preset.tp if preset else 1)) if cfg.engine == "vllm" else 1
    return gpus, CPUS_PER_GPU * gpus


def check_run_args(run_command, inputs: list[str], out: Path, run_args: list[str]) -> RunConfig:
    """Parse `spcli run INPUTS --out OUT RUN_ARGS` with the run command itself (a click command) and
    build its config, so an unknown flag or a bad value fails now, not on the cluster."""
    for arg in run_args:
        if arg in ("--help", "-h"):
            raise ConfigError("run options after --: --help is not a run option (see `spcli run --help`)")
        if arg in ("--out", "-o") or arg.startswith(("--out=", "-o=")):
            raise ConfigError("run options after --: give --out once, before --")
        if arg == "--fresh":
            raise ConfigError("run options after --: --fresh would start a task over each time it is requeued; "
                              "use a new --out directory (or empty this one) instead")
    args = [*inputs, "--out", str(out), *run_args]
    try:
        ctx = run_command.make_context("spcli run", args)
    except Exception as e:  # click's usage errors (typer vendors its own click)
        if not hasattr(e, "format_message"):
            raise
        raise ConfigError(f"run options after --: {e.format_message()}") from None
    params = ctx.params
    if len(params.get("inputs", ())) != len(inputs):
        extra = list(params["inputs"])[len(inputs):]
        raise ConfigError(f"run options after --: unexpected argument(s) {' '.join(extra)}; give inputs before --")
    try:
        return _run_config(params)
    except ConfigError as e:
        raise ConfigError(f"run options after --: {e}") from None


def _run_config(params: dict) -> RunConfig:
    """RunConfig from the run command's parsed flags, matched to fields by name (for validation)."""
    named = {_RENAMED.get(k, k): v for k, v in params.items()}

    def pick(cls) -> dict:
        return {f.name: named[f.name] for f in dataclasses.fields(cls) if f.name in named and f.name not in _NESTED}

    nested = {name: cls(**pick(cls)) for name, cls in _NESTED.items()}
    top = {k: v for k, v in pick(RunConfig).items() if k not in ("inputs", "out")}
    return RunConfig(inputs=tuple(params["inputs"]), out=str(params["out"]), **top, **nested)


def existing_task_count(out: Path) -> int | None:
    """The array size the directory's manifests were written by; None for a new directory."""
    counts = set()
    for doc in read_manifests(out):
        task = doc.get("task")
        if task is not None and task.get("ray"):
            raise OutputError(f"{out} holds a run made by spcli run --ray; submit into a new --out directory")
        if task is None:
            raise OutputError(f"{out} holds a run made outside a Slurm array (manifest.json); "
                              "submit into a new --out directory")
        counts.add(task["count"])
    if len(counts) > 1:
        raise OutputError(f"{out} holds manifests of arrays of {sorted(counts)} tasks; use a new --out directory")
    return counts.pop() if counts else None


def check_not_queued(out: Path) -> None:
    """Refuse while the directory's last job still has tasks queued or running: two tasks with one
    index would write one task's shards (the second would stop at the first one's lock)."""
    submissions = read_submissions(out)
    if not submissions:
        return
    job_id = submissions[-1].job_id
    states = query.query(job_id) or {}
    live = sorted(i for i, s in states.items() if i is not None and s.state in query.ACTIVE | query.WAITING)
    if live:
        raise ConfigError(f"{out}: job {job_id} still has {len(live)} task(s) queued or running "
                          f"({', '.join(map(str, live[:5]))}{', ...' if len(live) > 5 else ''}); "
                          f"wait for it or `scancel {job_id}` before resubmitting")


def plan(run_command, inputs: list[str], out, run_args: list[str], tasks: int | None, **options) -> Plan:
    """Check a submission and render its script; `options` are SubmitOptions fields."""
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: output path exists and is not a directory")
    inputs = [os.path.abspath(i) for i in inputs]  # tasks may start in another directory
    cfg = check_run_args(run_command, inputs, out, run_args)
    gpus, cpus = task_resources(cfg)
    options["gpus_per_task"] = gpus if options.get("gpus_per_task") is None else options["gpus_per_task"]
    options["cpus_per_task"] = cpus if options.get("cpus_per_task") is None else options["cpus_per_task"]
    shards = tuple(s.path for s in discover(inputs, exclude=out))
    existing = existing_task_count(out) if out.is_dir() else None
    check_not_queued(out)
    if existing is not None and tasks is not None and tasks != existing:
        raise ConfigError(f"{out} holds the work of a {existing}-task array; resubmit with --tasks {existing} "
                          "(changing it would move half-done shards to other tasks) or use a new --out")
    if tasks is None:
        tasks = existing or len(shards)
    submit_options = SubmitOptions(tasks=tasks, **options)
    script = render_sbatch(submit_options, inputs, out, run_args)
    warnings = ()
    if tasks > len(shards):
        idle = f"task {tasks - 1} has" if tasks - len(shards) == 1 else f"tasks {len(shards)}-{tasks - 1} have"
        warnings = (f"{tasks} tasks for {len(shards)} shard(s): {idle} nothing to do",)
    return Plan(submit_options, out, shards, script, warnings)


def submit_plan(plan_: Plan) -> str:
    """Write the script to <out>/slurm/spcli.sbatch, submit it, record the submission; the job id."""
    path = write_script(plan_.out, plan_.script)
    job_id = submit(path)
    record = Submission(job_id, plan_.options.tasks, plan_.shards, time.time(), plan_.options.max_requeues)
    try:
        with open(plan_.out / "slurm" / SUBMISSIONS, "ab") as f:
            f.write(orjson.dumps(dataclasses.asdict(record)) + b"\n")
    except OSError as e:
        raise OutputError(f"job {job_id} is submitted, but {plan_.out}/slurm/{SUBMISSIONS} cannot be written "
                          f"({e.strerror}): `spcli status` will know less about it") from e
    return job_id


def read_submissions(out: Path) -> list[Submission]:
    """Every recorded submission into `out`, oldest first (unreadable lines are skipped)."""
    path = Path(out) / "slurm" / SUBMISSIONS
    if not path.is_file():
        return []
    found = []
    for line in path.read_bytes().splitlines():
        try:
            doc = orjson.loads(line)
            found.append(Submission(str(doc["job_id"]), int(doc["tasks"]), tuple(doc["shards"]),
                                    float(doc["time"]), int(doc["max_requeues"])))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return found
