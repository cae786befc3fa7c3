"""The sbatch script that runs `spcli run` as a Slurm job array, and its submission.

Each array task runs `srun <spcli> run INPUTS --out DIR ...`; spcli picks the task's share of the
inputs itself (`spcli.slurm.tasks`). The script makes a task survive time limits and preemption:

- `--signal=B:USR1@<lead>` sends USR1 to the batch shell <lead> seconds before the time limit
  (and, with `SlurmctldParameters=preempt_send_user_signal`, when the job is preempted). The
  shell forwards USR1 and TERM to the srun step (within a second: it polls srun rather than
  `wait` on it, see the script); spcli commits what it finished and exits 75.
- On exit 75 the task requeues itself (`scontrol requeue JOB_TASK`) while SLURM_RESTART_COUNT
  < max_requeues and the job is still RUNNING; a job being cancelled (`scancel`) or killed is
  never requeued, so a 75 caused by scancel's TERM does not bring the task back.
- Exit 0 is done; 1, 2, any other code, or 75 past the limit end the task with that code. After a
  forwarded signal, a code above 128 (spcli killed by it before installing its handler, or after
  removing it on the way out) counts as 75.

Every attempt appends one line to <out>/slurm/attempts-<task>.log (`spcli.slurm.attempts`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from spcli.errors import ConfigError, OutputError, SpcliError
from spcli.slurm.tasks import COUNT_OVERRIDE

RESUMABLE_EXIT = 75  # spcli.errors.EXIT_INTERRUPTED
MAX_SIGNAL_LEAD = 65535  # sbatch --signal accepts at most 0xffff seconds

_NAME = re.compile(r"[\w.+,-]+")  # partitions, accounts, QOS, job names
_MEM = re.compile(r"\d+[KMGT]?", re.IGNORECASE)
# sbatch options the script sets itself, which --sbatch-arg may not override: the flag to use.
_OWN_OPTIONS = {
    "--array": "--tasks/--parallel", "-a": "--tasks/--parallel", "--signal": "--signal-lead",
    "--output": "--out", "-o": "--out", "--error": "--out", "-e": "--out",
    "--open-mode": None, "--requeue": None, "--no-requeue": None, "--ntasks": None, "-n": None,
    "--nodes": None, "-N": None, "--job-name": "--job-name", "-J": "--job-name",
    "--partition": "--partition", "-p": "--partition", "--account": "--account", "-A": "--account",
    "--qos": "--qos", "-q": "--qos", "--time": "--time", "-t": "--time", "--mem": "--mem",
    "--cpus-per-task": "--cpus-per-task", "-c": "--cpus-per-task", "--gres": "--gpus-per-task",
}


class SlurmError(SpcliError):
    """sbatch is missing or refused the job."""


def time_limit_seconds(limit: str) -> int | None:
    """Seconds in a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None = no limit."""
    if limit.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, dash, clock = limit.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or (dash and not days.isdigit()) or len(parts) > 3:
        raise ConfigError(f"--time must be a Slurm time limit (MM, HH:MM:SS, D-HH:MM, ...), got {limit!r}")
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (int(p) for p in parts + ["0"] * (3 - len(parts)))
        return ((int(days) * 24 + h) * 60 + m) * 60 + s
    padded = {1: ["0", *parts, "0"], 2: ["0", *parts], 3: parts}[len(parts)]  # MM | MM:SS | HH:MM:SS
    h, m, s = (int(p) for p in padded)
    return (h * 60 + m) * 60 + s


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_name(value: str | None, flag: str) -> None:
    _check(value is None or (isinstance(value, str) and bool(_NAME.fullmatch(value))),
           f"{flag} must be a name of letters, digits and . _ - + , only, got {value!r}")


@dataclass(frozen=True)
class SubmitOptions:
    """How the array is submitted; each field is one `spcli slurm` flag."""

    tasks: int  # array tasks: --array=0-(tasks-1)
    parallel: int | None = None  # at most this many tasks run at once (%K); None = no limit
    partition: str | None = None
    gpus_per_task: int = 8  # GPUs for each array task (--gres=gpu:N); 0 = no GPU request
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, Slurm syntax: 500M, 64G
    time: str | None = None  # per task, Slurm syntax: 30, 4:00:00, 1-00:00
    account: str | None = None
    qos: str | None = None
    signal_lead: int = 120  # seconds between USR1 and the time limit: spcli's time to commit
    max_requeues: int = 3  # self-requeues after exit 75 before a task gives up
    sbatch_args: tuple[str, ...] = ()  # extra #SBATCH lines, one option each: "--constraint=a100"
    job_name: str = "spcli"
    spcli: str = "spcli"  # the command each task runs: a name on the nodes' PATH, or a path

    def __post_init__(self) -> None:
        _check(_is_int(self.tasks) and self.tasks >= 1, f"--tasks must be an integer >= 1, got {self.tasks!r}")
        _check(self.parallel is None or (_is_int(self.parallel) and self.parallel >= 1),
               f"--parallel must be an integer >= 1, got {self.parallel!r}")
        _check_name(self.partition, "--partition")
        _check(_is_int(self.gpus_per_task) and self.gpus_per_task >= 0,
               f"--gpus-per-task must be an integer >= 0, got {self.gpus_per_task!r}")
        _check(self.cpus_per_task is None or (_is_int(self.cpus_per_task) and self.cpus_per_task >= 1),
               f"--cpus-per-task must be an integer >= 1, got {self.cpus_per_task!r}")
        _check(self.mem is None or (isinstance(self.mem, str) and bool(_MEM.fullmatch(self.mem))),
               f"--mem must be a size like 500M or 64G, got {self.mem!r}")
        _check_name(self.account, "--account")
        _check_name(self.qos, "--qos")
        _check(_is_int(self.signal_lead) and 1 <= self.signal_lead <= MAX_SIGNAL_LEAD,
               f"--signal-lead must be an integer number of seconds in 1-{MAX_SIGNAL_LEAD}, got {self.signal_lead!r}")
        limit = None if self.time is None else time_limit_seconds(self.time)
        _check(limit is None or self.signal_lead < limit,
               f"--signal-lead ({self.signal_lead} s) must be shorter than --time ({self.time} = {limit} s)")
        _check(_is_int(self.max_requeues) and self.max_requeues >= 0,
               f"--max-requeues must be an integer >= 0, got {self.max_requeues!r}")
        _check(isinstance(self.sbatch_args, tuple), f"--sbatch-arg values must be a tuple, got {self.sbatch_args!r}")
        for arg in self.sbatch_args:
            _check(isinstance(arg, str) and arg.startswith("-") and "\n" not in arg and "\0" not in arg,
                   f"--sbatch-arg must be one sbatch option on one line, like --constraint=a100, got {arg!r}")
            name = arg.split("=", 1)[0].split()[0]
            if not name.startswith("--"):
                name = name[:2]  # -pgpu, -p gpu
            flag = _OWN_OPTIONS.get(name)
            _check(name not in _OWN_OPTIONS,
                   f"--sbatch-arg {arg!r}: spcli sets {name} itself" + (f"; use {flag}" if flag else ""))
        _check_name(self.job_name, "--job-name")
        _check(isinstance(self.spcli, str) and bool(self.spcli) and "\n" not in self.spcli,
               f"the spcli command must be a non-empty path or name, got {self.spcli!r}")


def _sbatch_lines(options: SubmitOptions, out: str) -> list[str]:
    array = f"0-{options.tasks - 1}" + (f"%{options.parallel}" if options.parallel else "")
    lines = [
        f"--job-name={options.job_name}",
        f"--array={array}",
        "--nodes=1",
        "--ntasks=1",
        # %A = array job id, %a = task; sbatch's #SBATCH parser takes double quotes, not shell quoting.
        f'--output="{out}/slurm/logs/%A_%a.out"',
        "--open-mode=append",  # a requeued task appends to its log instead of truncating it
        "--requeue",
        f"--signal=B:USR1@{options.signal_lead}",
    ]
    for flag, value in (("--partition", options.partition), ("--account", options.account),
                        ("--qos", options.qos), ("--time", options.time), ("--mem", options.mem),
                        ("--cpus-per-task", options.cpus_per_task)):
        if value is not None:
            lines.append(f"{flag}={value}")
    if options.gpus_per_task:
        lines.append(f"--gres=gpu:{options.gpus_per_task}")
    lines.extend(options.sbatch_args)
    return [f"#SBATCH {line}" for line in lines]


_BODY = """\
# spcli array task: `spcli run` on this task's share of the inputs. USR1 (time limit near, or
# preemption) and TERM are forwarded to it; it commits and exits 75, and the task requeues itself
# while SLURM_RESTART_COUNT < max_requeues. Written by spcli.slurm.script.render_sbatch.
set -u
export {count_var}={tasks}
out={out}
max_requeues={max_requeues}
task=${{SLURM_ARRAY_TASK_ID:-0}}
job=${{SLURM_ARRAY_JOB_ID:-${{SLURM_JOB_ID:-unknown}}}}_$task  # the task: 123_4
restarts=${{SLURM_RESTART_COUNT:-0}}  # unset until the first requeue
host=${{SLURMD_NODENAME:-$(hostname)}}

# With --signal=B:... only this shell gets the signal: pass it on to the srun step.
pid='' pending='' interrupted=0 signalled=0
forward() {{
  interrupted=1 signalled=1
  if [ -n "$pid" ]; then kill -s "$1" "$pid" 2>/dev/null; else pending=$1; fi
}}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

echo "spcli-slurm: task $job attempt $((restarts + 1)) on $host at $(date -u +%FT%TZ)"
srun {srun_args} &
pid=$!
if [ -n "$pending" ]; then kill -s "$pending" "$pid" 2>/dev/null; fi
# No `wait` while srun runs: when a trapped signal comes as `wait` reaps srun, bash drops srun's
# status (its longjmp out of `wait` skips the bookkeeping), and the next `wait` says -1. Slurm
# signals this shell just as srun exits when it ends a job. A foreground sleep is not cut short by
# a trap (the trap runs after it, within 1 s), and bash records srun's status as it reaps it then.
# The group's 2>/dev/null drops bash's "Terminated" when Slurm's TERM kills the sleep.
while kill -0 "$pid" 2>/dev/null; do {{ sleep 1; }} 2>/dev/null; done
# srun is gone and its status kept: a trap can still cut `wait` short (128+n); wait again.
while :; do
  interrupted=0
  wait "$pid"
  code=$?
  if [ "$code" -le 128 ] || [ "$interrupted" = 0 ]; then break; fi
done

action=failed
if [ "$code" -eq 0 ]; then
  action="done"
elif [ "$code" -eq {resumable} ] || {{ [ "$signalled" = 1 ] && [ "$code" -gt 128 ]; }}; then
  # scancel and kills also end in 75 (spcli commits on TERM); only a RUNNING job is requeued.
  # A signal that reaches spcli outside its handler (Python still starting, or already exiting)
  # kills it: srun exits 128+n. Nothing is ever half committed, so that resumes like 75.
  state=$(squeue --noheader --jobs="$job" --format=%T 2>/dev/null)
  if [ "$restarts" -ge "$max_requeues" ]; then
    action=gave-up
  elif [ -n "$state" ] && [ "$state" != RUNNING ]; then
    action=stopped
  else
    action=requeue
  fi
fi
attempt() {{
  printf 'time=%s task=%s restart=%s exit=%s action=%s job=%s host=%s\\n' \\
    "$(date -u +%FT%TZ)" "$task" "$restarts" "$code" "$1" "$job" "$host" >>"$out/slurm/attempts-$task.log"
}}
attempt "$action"
echo "spcli-slurm: task $job exit $code: $action"
if [ "$action" = requeue ] && ! scontrol requeue "$job"; then
  attempt requeue-failed
fi
exit "$code"
"""


def render_sbatch(options: SubmitOptions, inputs, out_dir, run_args=()) -> str:
    """The sbatch script (bash) for `spcli run INPUTS --out OUT_DIR RUN_ARGS` as an array.

    `out_dir` is made absolute here (Slurm opens the log before the script runs); relative
    inputs resolve against the directory sbatch is run from. Before submitting, the caller
    creates <out>/slurm/logs (`write_script` does), or Slurm cannot open the log and the task fails.
    """
    inputs = [str(i) for i in inputs]
    run_args = [str(a) for a in run_args]
    _check(bool(inputs), "no inputs to submit")
    out = os.path.abspath(str(out_dir))
    _check(not any(c in out for c in '%"\\\n'),
           f"{out}: the output directory may not contain % \" \\ or a newline (Slurm reads them in the log path)")
    _check(not any(a in ("--out", "-o") or a.startswith("--out=") for a in run_args),
           "pass the output directory as out_dir, not in run_args")
    command = ["--ntasks=1"]
    if options.cpus_per_task is not None:  # srun in Slurm 22.05 does not inherit it from sbatch
        command.append(f"--cpus-per-task={options.cpus_per_task}")
    command += [options.spcli, "run", *inputs, "--out", out, *run_args]
    body = _BODY.format(count_var=COUNT_OVERRIDE, tasks=options.tasks, out=shlex.quote(out),
                        max_requeues=options.max_requeues, resumable=RESUMABLE_EXIT,
                        srun_args=" ".join(shlex.quote(c) for c in command))
    return "\n".join(["#!/bin/bash", *_sbatch_lines(options, out), "", body])


def write_script(out_dir, script: str) -> Path:
    """Write `script` to <out>/slurm/spcli.sbatch, creating <out>/slurm/logs; returns the path."""
    slurm_dir = Path(out_dir).absolute() / "slurm"
    try:
        (slurm_dir / "logs").mkdir(parents=True, exist_ok=True)
        path = slurm_dir / "spcli.sbatch"
        path.write_text(script)
    except OSError as e:
        raise OutputError(f"{slurm_dir}: cannot write the sbatch script ({e.strerror})") from e
    path.chmod(0o755)
    return path


def submit(script_path, sbatch: str = "sbatch", timeout: float = 120) -> str:
    """Submit with `sbatch --parsable`; returns the job id (the array job id for arrays)."""
    command = [sbatch, "--parsable", str(script_path)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{sbatch}: not found; submit from a machine with the Slurm client commands "
                         "(a login node, or after `module load slurm`)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"sbatch {script_path}: no answer from slurmctld in {timeout:.0f} s") from None
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip() or "no message"
        raise SlurmError(f"sbatch {script_path} failed (exit {proc.returncode}): {detail}")
    job_id = proc.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch {script_path}: unexpected output {proc.stdout.strip()!r}, expected a job id")
    return job_id
