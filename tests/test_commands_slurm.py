"""`spcli slurm submit` without a cluster: --dry-run, the checks of the run options after `--`,
submission through a stand-in sbatch, resubmission rules; and the script's handling of a task
killed by a forwarded signal before spcli could catch it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.errors import ConfigError, OutputError
from spcli.io.manifest import Manifest, ShardProgress, manifest_name
from spcli.slurm.attempts import read_attempts
from spcli.slurm.script import SubmitOptions, render_sbatch, write_script
from spcli.slurm.submit import read_submissions


@pytest.fixture
def shards(tmp_path):
    paths = []
    for k in range(3):
        path = tmp_path / "data" / f"s{k}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"id": f"r{k}", "prompt": "hello"}) + "\n")
        paths.append(path)
    return paths


def submit(*args: str):
    return CliRunner().invoke(app, ["slurm", "submit", *args])


def test_dry_run_prints_a_valid_script_and_writes_nothing(tmp_path, shards):
    out = tmp_path / "out"
    res = submit(str(tmp_path / "data"), "--out", str(out), "--parallel", "2", "--partition", "gpu",
                 "--time", "4:00:00", "--signal-lead", "300", "--max-requeues", "5", "--sbatch-arg", "--exclusive",
                 "--dry-run", "--", "--keep", "0.2", "--model", "llama-70b", "--engine", "vllm")
    assert res.exit_code == 0, res.output
    script = res.stdout
    assert not out.exists()
    (tmp_path / "job.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    lines = script.splitlines()
    for expected in ("#SBATCH --array=0-2%2", "#SBATCH --signal=B:USR1@300", "#SBATCH --requeue",
                     "#SBATCH --open-mode=append", "#SBATCH --partition=gpu", "#SBATCH --time=4:00:00",
                     "#SBATCH --gres=gpu:8", "#SBATCH --exclusive", "max_requeues=5", "export SPCLI_ARRAY_TASK_COUNT=3"):
        assert expected in lines
    assert 'scontrol requeue "$job"' in script
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert shlex.split(srun.removesuffix(" &")) == [
        "srun", "--ntasks=1", "--cpus-per-task=32", str(os.path.join(os.path.dirname(sys.executable), "spcli")), "run",
        str(tmp_path / "data"), "--out", str(out), "--keep", "0.2", "--model", "llama-70b", "--engine", "vllm"]
    assert "3 task(s) over 3 shard(s)" in res.stderr


@pytest.mark.parametrize("run_args, gres, cpus", [
    ([], None, 8),  # the default smollm2-135m runs on a CPU
    (["--model", "smollm2-135m", "--engine", "vllm"], None, 8),
    (["--model", "llama-8b"], "gpu:1", 4),
    (["--model", "llama-70b"], "gpu:1", 4),  # the hf engine runs on one device
    (["--model", "llama-70b", "--engine", "vllm"], "gpu:8", 32),
    (["--model", "llama-405b-fp8", "--engine", "vllm", "--tp", "4"], "gpu:4", 16),
    (["--model", "llama-8b", "--device", "cpu"], None, 8),
])
def test_gpus_and_cpus_per_task_default_to_what_the_model_and_engine_need(tmp_path, shards, run_args, gres, cpus):
    res = submit(str(shards[0]), "--out", str(tmp_path / "out"), "--dry-run", "--", *run_args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert [line for line in lines if line.startswith("#SBATCH --gres")] == ([f"#SBATCH --gres=gpu:{gres[4:]}"] if gres else [])
    assert f"#SBATCH --cpus-per-task={cpus}" in lines
    res = submit(str(shards[0]), "--out", str(tmp_path / "out"), "--dry-run", "--gpus-per-task", "2",
                 "--cpus-per-task", "3", "--", *run_args)
    assert "#SBATCH --gres=gpu:2" in res.stdout.splitlines() and "#SBATCH --cpus-per-task=3" in res.stdout.splitlines()


@pytest.mark.parametrize("run_args, message", [
    (["--kep", "0.1"], "No such option: --kep"),
    (["--keep", "abc"], r"run options after --: --keep must be a number in \(0, 1\] or auto, got 'abc'"),
    (["--keep", "2"], r"run options after --: --keep must be in \(0, 1\] or auto, got 2.0"),
    (["--keep", "auto", "--keep-scale", "0"], r"run options after --: --keep-scale must be in \(0, 100\], got 0.0"),
    (["--keep", "auto", "--keep-min", "0.6", "--keep-max", "0.5"], r"--keep-min \(0.6\) must not exceed --keep-max \(0.5\)"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--score-impl", "cuda"], "--score-impl must be auto, torch or triton"),
    (["--pool", "4"], "--pool must be an odd number"),
    (["--fresh"], "--fresh would start a task over each time it is requeued"),
    (["--out", "elsewhere"], "give --out once, before --"),
    (["more.jsonl"], "unexpected argument"),
    (["--help"], "--help is not a run option"),
])
def test_run_options_are_checked_at_submit_time(tmp_path, shards, run_args, message):
    res = submit(str(shards[0]), "--out", str(tmp_path / "out"), "--dry-run", "--", *run_args)
    assert isinstance(res.exception, ConfigError), res.output
    assert res.exception.exit_code == 2
    assert re.search(message, str(res.exception)), str(res.exception)


@pytest.mark.parametrize("args, message", [
    (["--tasks", "0"], "--tasks must be an integer >= 1"),
    (["--time", "1:00"], "--signal-lead"),
    (["--sbatch-arg=--array=0-3"], "spcli sets --array itself"),
])
def test_submit_options_are_checked(tmp_path, shards, args, message):
    res = submit(str(shards[0]), "--out", str(tmp_path / "out"), "--dry-run", *args)
    assert isinstance(res.exception, ConfigError) and message in str(res.exception), res.output


def test_missing_input_is_an_error(tmp_path):
    res = submit(str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "out"), "--dry-run")
    assert res.exception is not None and "no such file or directory" in str(res.exception)


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\necho "$@" >>"$(dirname "$0")/calls"\necho "4242;cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / "calls"


def test_submit_writes_script_and_record(tmp_path, shards, fake_sbatch):
    out = tmp_path / "out"
    res = submit(*map(str, shards), "--out", str(out), "--tasks", "2", "--gpus-per-task", "0", "--spcli", "/opt/spcli",
                 "--", "--max-tokens", "2")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("submitted job 4242: 2 task(s) over 3 shard(s)")
    script = out / "slurm" / "spcli.sbatch"
    assert fake_sbatch.read_text().split() == ["--parsable", str(script)]
    assert "#SBATCH --array=0-1" in script.read_text().splitlines()
    assert (out / "slurm" / "logs").is_dir()
    (record,) = read_submissions(out)
    assert (record.job_id, record.tasks, record.shards, record.max_requeues) == ("4242", 2, tuple(map(str, shards)), 3)
    assert record.task_shards(0) == [str(shards[0]), str(shards[2])] and record.task_shards(1) == [str(shards[1])]
    status = CliRunner().invoke(app, ["status", str(out), "--no-slurm"])
    assert status.exit_code == 3, status.output
    assert "job 4242, 2 task(s)" in status.output


def test_more_tasks_than_shards_warns(tmp_path, shards):
    res = submit(str(shards[0]), "--out", str(tmp_path / "out"), "--tasks", "3", "--dry-run")
    assert res.exit_code == 0
    assert "3 tasks for 1 shard(s): tasks 1-2 have nothing to do" in res.stderr


def write_task_manifest(out, index: int, count: int) -> None:
    Manifest(out / manifest_name(index), {}, {"inputs": []}, {0: ShardProgress("/x.jsonl")},
             {"index": index, "count": count, "job_id": "1", "restart_count": 0}).save()


def test_resubmission_keeps_the_split(tmp_path, shards):
    out = tmp_path / "out"
    out.mkdir()
    write_task_manifest(out, 0, 2)
    res = submit(*map(str, shards), "--out", str(out), "--tasks", "3", "--dry-run")
    assert isinstance(res.exception, ConfigError) and "resubmit with --tasks 2" in str(res.exception)
    res = submit(*map(str, shards), "--out", str(out), "--dry-run")  # default: the directory's array size
    assert res.exit_code == 0 and "#SBATCH --array=0-1" in res.stdout.splitlines()


def test_a_plain_run_directory_is_refused(tmp_path, shards):
    out = tmp_path / "out"
    out.mkdir()
    Manifest(out / "manifest.json", {}, {"inputs": []}, {0: ShardProgress("/x.jsonl")}).save()
    res = submit(str(shards[0]), "--out", str(out), "--dry-run")
    assert isinstance(res.exception, OutputError) and "outside a Slurm array" in str(res.exception)


def test_help_shows_the_run_options_separator():
    res = CliRunner().invoke(app, ["slurm", "submit", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "[-- RUN OPTIONS...]" in res.output
    for flag in ("--tasks", "--parallel", "--partition", "--gpus-per-task", "--cpus-per-task", "--mem", "--time",
                 "--account", "--qos", "--signal-lead", "--max-requeues", "--sbatch-arg", "--job-name", "--spcli",
                 "--dry-run"):
        assert flag in res.output


# --- the sbatch script when a forwarded signal kills spcli before its handler is installed


def test_signal_death_before_the_handler_counts_as_resumable(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
        "squeue": "#!/bin/bash\necho RUNNING\n",
        "scontrol": '#!/bin/bash\necho "scontrol $*" >>"$(dirname "$0")/calls"\n',
        # Python still importing: no handler, so USR1 kills it (exit 128+10).
        "spcli": '#!/bin/bash\nout=${@: -1}\ntouch "$out/ready"\nexec sleep 30\n',
    }
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    options = SubmitOptions(tasks=2, gpus_per_task=0, spcli=str(bin_dir / "spcli"))
    script = write_script(out, render_sbatch(options, ["a.jsonl"], out, ()))  # --out OUT comes last
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_ARRAY_JOB_ID": "9", "SLURMD_NODENAME": "n1"}
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while not (out / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(0.1)  # `exec sleep` has replaced the stand-in
    proc.send_signal(signal.SIGUSR1)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGUSR1, output
    (attempt,) = read_attempts(out)[1]
    assert (attempt.exit, attempt.action) == (128 + signal.SIGUSR1, "requeue")
    assert (bin_dir / "calls").read_text().split() == ["scontrol", "requeue", "9_1"]


def test_resubmission_while_the_last_job_runs_is_refused(tmp_path, shards, fake_sbatch):
    out = tmp_path / "out"
    assert submit(str(shards[0]), "--out", str(out), "--gpus-per-task", "0").exit_code == 0
    squeue = fake_sbatch.parent / "squeue"
    squeue.write_text('#!/bin/bash\nprintf "4242_0|RUNNING|None\\n"\n')
    squeue.chmod(0o755)
    res = submit(str(shards[0]), "--out", str(out), "--dry-run")
    assert isinstance(res.exception, ConfigError), res.output
    assert "job 4242 still has 1 task(s) queued or running (0)" in str(res.exception)
    squeue.write_text('#!/bin/bash\nprintf "4242_0|COMPLETED|None\\n"\n')
    assert submit(str(shards[0]), "--out", str(out), "--dry-run").exit_code == 0


def test_engine_vllm_with_an_spcli_whose_python_has_no_vllm_is_refused(tmp_path, shards):
    """The issue: `slurm submit --dry-run -- --engine vllm` wrote a script calling a venv without vLLM. A dry
    run now warns, a submission is refused, before anything is written."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this Python has vllm: the spcli next to it is the one with vLLM")
    fake = tmp_path / "bin" / "spcli"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    res = submit(str(shards[0]), "--out", str(out), "--spcli", str(fake), "--dry-run", "--", "--engine", "vllm")
    assert res.exit_code == 0, res.output
    assert (f"spcli: warning: --engine vllm, but {sys.executable}, the Python of the spcli every task runs ({fake}), "
            "has no vllm: install it there (pip install vllm) or name an spcli whose environment has it with --spcli CMD"
            ) in res.stderr
    res = submit(str(shards[0]), "--out", str(out), "--spcli", str(fake), "--", "--engine=vllm")
    assert isinstance(res.exception, ConfigError) and "has no vllm" in str(res.exception)
    assert not out.exists(), "refused before anything is written"
    res = submit(str(shards[0]), "--out", str(out), "--spcli", str(fake), "--dry-run", "--", "--engine", "hf")
    assert res.exit_code == 0 and "has no vllm" not in res.stderr
