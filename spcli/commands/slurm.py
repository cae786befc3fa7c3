"""`spcli slurm submit`: `spcli run` as a Slurm job array (spcli.slurm.submit holds the logic)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

SUBMIT_HELP = (
    "Submit `spcli run INPUT... --out DIR [RUN OPTIONS]` as a Slurm job array.\n\n"
    "Writes DIR/slurm/spcli.sbatch and submits it with sbatch (array 0-(N-1)%K, --requeue, "
    "--signal=B:USR1@LEAD, logs in DIR/slurm/logs/JOB_TASK.out). Task i of N runs shards i, i+N, "
    "i+2N, ... of the inputs in order. On USR1 (time limit near, preemption) or TERM a task commits "
    "and exits 75, and requeues itself while it has requeues left; any other failure ends it. "
    "Everything after `--` is passed to `spcli run` and checked now. Follow with `spcli status DIR`."
)


class _SubmitCommand(TyperCommand):
    """Splits the arguments at the first `--`: what follows is for `spcli run`, kept in ctx.meta."""

    def parse_args(self, ctx, args):
        if "--" in args:
            cut = args.index("--")
            args, ctx.meta["spcli.run_args"] = args[:cut], args[cut + 1:]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx):
        return [*super().collect_usage_pieces(ctx), "[-- RUN OPTIONS...]"]


def _default_spcli() -> str:
    """The spcli next to this interpreter (tasks run the same install), else `spcli` on the nodes' PATH."""
    here = Path(sys.executable).parent / "spcli"
    return str(here) if here.is_file() else "spcli"


def _asks_vllm(run_args: list[str]) -> bool:
    return any(a == "--engine=vllm" or (a == "--engine" and i + 1 < len(run_args) and run_args[i + 1] == "vllm")
               for i, a in enumerate(run_args))


def interpreter_without_vllm(spcli: str) -> str | None:
    """The Python that `spcli` (a path or a name on PATH) runs under, when that Python has no vllm; None when
    it has, or it cannot be told here (a command that is not a Python script on this machine)."""
    import shutil
    import subprocess

    path = shutil.which(spcli)
    try:
        with open(path or spcli, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    python = shutil.which(words[-1]) if words and words[0].endswith("/env") else (words[0] if words else None)
    if python is None:
        return None
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        rc = subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if rc == 3 else None


def register(app: typer.Typer) -> None:
    slurm_app = typer.Typer(help="Run spcli on a Slurm cluster.", no_args_is_help=True)
    app.add_typer(slurm_app, name="slurm")

    @slurm_app.command(name="submit", cls=_SubmitCommand, help=SUBMIT_HELP)
    def _submit(
        ctx: typer.Context,
        inputs: Annotated[list[str], typer.Argument(metavar="INPUT", help="Shards, globs or directories, as for `spcli run`.", show_default=False)],
        out: Annotated[str, typer.Option("--out", "-o", metavar="DIR", help="Output directory shared by all tasks (on a file system every node sees).", show_default=False)],
        tasks: Annotated[Optional[int], typer.Option(metavar="N", help="Array tasks. Default: the directory's array size when resubmitting, else one per shard.", show_default=False)] = None,
        parallel: Annotated[Optional[int], typer.Option(metavar="K", help="At most K tasks run at once (--array=...%K). Default: no limit.", show_default=False)] = None,
        partition: Annotated[Optional[str], typer.Option(metavar="P", help="Slurm partition.", show_default=False)] = None,
        gpus_per_task: Annotated[Optional[int], typer.Option(metavar="G", help="GPUs per task (--gres=gpu:G; 0 = none): one node per task. Default: from the run's model and engine: 0 for a CPU model (smollm2-135m) or --device cpu, the tensor-parallel size with --engine vllm (--tp, else the model's), else 1.", show_default=False)] = None,
        cpus_per_task: Annotated[Optional[int], typer.Option(metavar="C", help="CPUs per task. Default: 8 without a GPU, else 4 per GPU.", show_default=False)] = None,
        mem: Annotated[Optional[str], typer.Option(metavar="M", help="Memory per node: 500M, 64G.", show_default=False)] = None,
        time: Annotated[Optional[str], typer.Option(metavar="T", help="Time limit per task: 30, 4:00:00, 1-00:00.", show_default=False)] = None,
        account: Annotated[Optional[str], typer.Option(metavar="A", help="Slurm account.", show_default=False)] = None,
        qos: Annotated[Optional[str], typer.Option(metavar="Q", help="Slurm QOS.", show_default=False)] = None,
        signal_lead: Annotated[int, typer.Option(metavar="S", help="Seconds between USR1 and the time limit: spcli's time to commit.")] = 120,
        max_requeues: Annotated[int, typer.Option(metavar="R", help="Self-requeues per task after exit 75 before it gives up.")] = 3,
        sbatch_arg: Annotated[Optional[list[str]], typer.Option(metavar="OPT", help="Extra sbatch option, one per flag: --sbatch-arg=--constraint=h100.", show_default=False)] = None,
        job_name: Annotated[str, typer.Option(metavar="NAME", help="Slurm job name.")] = "spcli",
        spcli: Annotated[Optional[str], typer.Option(metavar="CMD", help="The spcli each task runs. Default: the one running now, else `spcli` on the nodes' PATH.", show_default=False)] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the script; write and submit nothing.")] = False,
    ) -> None:
        from spcli.slurm.submit import plan, submit_plan

        run_command = typer.main.get_command(app).commands["run"]
        checked = plan(run_command, inputs, out, list(ctx.meta.get("spcli.run_args", [])), tasks,
                       parallel=parallel, partition=partition, gpus_per_task=gpus_per_task, cpus_per_task=cpus_per_task,
                       mem=mem, time=time, account=account, qos=qos, signal_lead=signal_lead,
                       max_requeues=max_requeues, sbatch_args=tuple(sbatch_arg or ()), job_name=job_name,
                       spcli=spcli or _default_spcli())
        for warning in checked.warnings:
            typer.echo(f"spcli: warning: {warning}", err=True)
        run_args = list(ctx.meta.get("spcli.run_args", []))
        python = interpreter_without_vllm(spcli or _default_spcli()) if _asks_vllm(run_args) else None
        if python is not None:
            from spcli.errors import ConfigError

            problem = (f"--engine vllm, but {python}, the Python of the spcli every task runs "
                       f"({spcli or _default_spcli()}), has no vllm: install it there (pip install vllm) or name an "
                       "spcli whose environment has it with --spcli CMD")
            if not dry_run:
                raise ConfigError(problem)
            typer.echo(f"spcli: warning: {problem}", err=True)
        n, shards = checked.options.tasks, len(checked.shards)
        if dry_run:
            typer.echo(checked.script, nl=False)
            typer.echo(f"spcli: dry run: {n} task(s) over {shards} shard(s); nothing written or submitted "
                       f"(to submit this script yourself, first mkdir -p {checked.out}/slurm/logs)", err=True)
            return
        job_id = submit_plan(checked)
        typer.echo(f"submitted job {job_id}: {n} task(s) over {shards} shard(s); script {checked.out}/slurm/spcli.sbatch, "
                   f"logs {checked.out}/slurm/logs/; progress: spcli status {checked.out}")
