"""spcli.slurm without a cluster: the rendered sbatch script, shard assignment, array env parsing."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import pytest

from spcli.errors import ConfigError, SpcliError
from spcli.slurm.attempts import read_attempts
from spcli.slurm.script import (SlurmError, SubmitOptions, render_sbatch, submit,
                                time_limit_seconds, write_script)
from spcli.slurm.tasks import ArrayTask, array_task, assign_shards


def render(**options) -> str:
    run_args = options.pop("run_args", ("--keep", "0.1"))
    return render_sbatch(SubmitOptions(**{"tasks": 4, **options}), ["in/a.jsonl", "in/b c.jsonl"],
                         "/data/out", run_args)


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def srun_line(script: str) -> list[str]:
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return shlex.split(line.removesuffix(" &"))


# --- render_sbatch


def test_script_is_valid_bash(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(render(partition="gpu", time="4:00:00", mem="64G", cpus_per_task=16, account="a",
                           qos="high", sbatch_args=("--constraint=h100",), parallel=2))
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_array_signal_requeue_lines():
    lines = sbatch_lines(render(tasks=10, parallel=3, signal_lead=300))
    assert "--array=0-9%3" in lines
    assert "--signal=B:USR1@300" in lines
    assert "--requeue" in lines
    assert "--open-mode=append" in lines
    assert '--output="/data/out/slurm/logs/%A_%a.out"' in lines
    assert "--job-name=spcli" in lines
    assert "--gres=gpu:8" in lines  # the default: one 8-GPU node per task


def test_sbatch_directives_come_before_any_command():
    script = render()
    first_command = next(i for i, line in enumerate(script.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(script.splitlines()) if line.startswith("#SBATCH"))


def test_no_limit_on_parallel_tasks_by_default():
    assert "--array=0-3" in sbatch_lines(render())


def test_optional_lines_only_when_given():
    lines = sbatch_lines(render(gpus_per_task=0))
    assert not [line for line in lines if line.split("=")[0] in
                ("--partition", "--account", "--qos", "--time", "--mem", "--cpus-per-task", "--gres")]
    lines = sbatch_lines(render(partition="gpu", account="proj", qos="low", time="1-00:00", mem="500M",
                                cpus_per_task=4, gpus_per_task=2, sbatch_args=("--constraint=a100", "--exclusive")))
    for expected in ("--partition=gpu", "--account=proj", "--qos=low", "--time=1-00:00", "--mem=500M",
                     "--cpus-per-task=4", "--gres=gpu:2", "--constraint=a100", "--exclusive"):
        assert expected in lines


def test_command_line_round_trips_through_the_shell():
    script = render_sbatch(SubmitOptions(tasks=2, spcli="/opt/my tools/spcli", cpus_per_task=8),
                           ["data/a b.jsonl", "it's.parquet", "$HOME.jsonl"], "/data/out dir",
                           ["--model", "x y", "--keep", "0.1"])
    assert srun_line(script) == ["srun", "--ntasks=1", "--cpus-per-task=8", "/opt/my tools/spcli", "run",
                                 "data/a b.jsonl", "it's.parquet", "$HOME.jsonl", "--out", "/data/out dir",
                                 "--model", "x y", "--keep", "0.1"]
    assert "out='/data/out dir'" in script
    assert '--output="/data/out dir/slurm/logs/%A_%a.out"' in sbatch_lines(script)


def test_relative_out_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = render_sbatch(SubmitOptions(tasks=1), ["a.jsonl"], "out", ())
    assert srun_line(script)[-2:] == ["--out", str(tmp_path / "out")]


def test_script_exports_array_size_and_requeue_limit():
    script = render(tasks=6, max_requeues=5)
    assert "export SPCLI_ARRAY_TASK_COUNT=6" in script
    assert "max_requeues=5" in script
    assert 'scontrol requeue "$job"' in script


@pytest.mark.parametrize("inputs, out, run_args, message", [
    ([], "/o", (), "no inputs"),
    (["a"], "/o%x", (), "may not contain"),
    (["a"], '/o"x', (), "may not contain"),
    (["a"], "/o", ("--out", "/elsewhere"), "out_dir"),
    (["a"], "/o", ("--out=/elsewhere",), "out_dir"),
])
def test_render_rejects(inputs, out, run_args, message):
    with pytest.raises(ConfigError, match=message):
        render_sbatch(SubmitOptions(tasks=1), inputs, out, run_args)


# --- the script's logic, run here with stand-ins for srun, squeue and scontrol

FAKE_SPCLI = r"""#!/bin/bash
# Exits $FAKE_EXIT, or with FAKE_EXIT=wait waits for USR1/TERM and exits 75, or with FAKE_EXIT=term
# writes its pid and exits 75 the moment TERM comes.
out='' prev=''
for arg in "$@"; do [ "$prev" = --out ] && out=$arg; prev=$arg; done
if [ "$FAKE_EXIT" = term ]; then
  trap 'kill "$!" 2>/dev/null; exit 75' TERM
  echo $$ >"$out/pid"
  while :; do sleep 5 </dev/null >/dev/null 2>&1 & wait $!; done
fi
if [ "$FAKE_EXIT" != wait ]; then exit "$FAKE_EXIT"; fi
got=''
trap 'got=USR1' USR1
trap 'got=TERM' TERM
touch "$out/ready"
for _ in $(seq 300); do sleep 0.05 & wait $!; [ -n "$got" ] && break; done
echo "$got" >"$out/signal"
exit 75
"""
FAKE_TOOLS = {
    "srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n',  # srun forwards signals
    "squeue": '#!/bin/bash\necho "$*" >>"$FAKE_LOG"\necho "$FAKE_STATE"\n',
    "scontrol": '#!/bin/bash\necho "scontrol $*" >>"$FAKE_LOG"\nexit "${FAKE_SCONTROL_EXIT:-0}"\n',
}


@pytest.fixture
def fake_slurm(tmp_path):
    """Run a rendered script outside Slurm: returns run(fake_exit, restarts, state, out) -> Popen."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {**FAKE_TOOLS, "spcli": FAKE_SPCLI}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    options = SubmitOptions(tasks=8, gpus_per_task=0, max_requeues=2, spcli=str(bin_dir / "spcli"))

    def run(fake_exit, restarts=None, state="RUNNING", out=tmp_path / "out", **extra_env):
        script = write_script(out, render_sbatch(options, ["a.jsonl"], out, ()))
        env = {**os.environ, **extra_env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_EXIT": str(fake_exit),
               "FAKE_STATE": state, "FAKE_LOG": str(tmp_path / "calls.log"), "SLURM_ARRAY_TASK_ID": "4",
               "SLURM_ARRAY_JOB_ID": "123", "SLURM_JOB_ID": "127", "SLURMD_NODENAME": "node7"}
        if restarts is not None:
            env["SLURM_RESTART_COUNT"] = str(restarts)
        return subprocess.Popen(["bash", str(script)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    run.out = tmp_path / "out"
    run.calls = lambda: (tmp_path / "calls.log").read_text().splitlines() if (tmp_path / "calls.log").exists() else []
    return run


@pytest.mark.parametrize("fake_exit, restarts, state, action, requeued", [
    (0, None, "RUNNING", "done", False),
    (75, None, "RUNNING", "requeue", True),  # first run: SLURM_RESTART_COUNT is unset
    (75, 1, "RUNNING", "requeue", True),
    (75, 2, "RUNNING", "gave-up", False),  # max_requeues=2
    (75, 0, "COMPLETING", "stopped", False),  # scancel'd: its TERM made spcli exit 75
    (2, None, "RUNNING", "failed", False),
    (1, 1, "RUNNING", "failed", False),
])
def test_exit_code_decides_requeue(fake_slurm, fake_exit, restarts, state, action, requeued):
    proc = fake_slurm(fake_exit, restarts, state)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == fake_exit, output
    (attempt,) = read_attempts(fake_slurm.out)[4]
    assert (attempt.restart, attempt.exit, attempt.action, attempt.job, attempt.host) == (
        restarts or 0, fake_exit, action, "123_4", "node7")
    assert ("scontrol requeue 123_4" in fake_slurm.calls()) == requeued


def test_failed_requeue_is_logged(fake_slurm):
    proc = fake_slurm(75, FAKE_SCONTROL_EXIT="1")
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75, output
    assert [a.action for a in read_attempts(fake_slurm.out)[4]] == ["requeue", "requeue-failed"]


@pytest.mark.parametrize("signal_", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_signal_to_the_batch_shell_reaches_spcli(fake_slurm, signal_):
    proc = fake_slurm("wait")
    deadline = time.monotonic() + 10
    while not (fake_slurm.out / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal_)  # only the shell, as with --signal=B:USR1 or scancel --batch
    output, _ = proc.communicate(timeout=30)
    assert (fake_slurm.out / "signal").read_text().strip() == signal_.name.removeprefix("SIG")
    assert proc.returncode == 75, output
    assert "scontrol requeue 123_4" in fake_slurm.calls()


def test_srun_status_survives_a_signal_as_srun_exits(fake_slurm):
    # Slurm ending a job TERMs the step, then the batch shell just as srun exits. A `wait` on srun
    # that a trap cut short as it reaped srun lost its status: exit -1, logged as failed. A race, so
    # twelve tasks at once: with `wait` on srun, about a quarter of them lost it here.
    outs = [fake_slurm.out / str(i) for i in range(12)]
    procs = [fake_slurm("term", out=out) for out in outs]
    for out, proc in zip(outs, procs):
        deadline = time.monotonic() + 20
        while not (out / "pid").exists() or not (out / "pid").read_text().strip():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, f"no pid in {out / 'pid'} after 20 s"
            time.sleep(0.01)
        os.kill(int((out / "pid").read_text()), signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
    for out, proc in zip(outs, procs):
        output, _ = proc.communicate(timeout=30)
        assert [(a.exit, a.action) for a in read_attempts(out)[4]] == [(75, "requeue")], output
        assert proc.returncode == 75, output


# --- SubmitOptions validation


@pytest.mark.parametrize("options, message", [
    (dict(tasks=0), "--tasks must be an integer >= 1"),
    (dict(tasks=2.5), "--tasks"),
    (dict(tasks=True), "--tasks"),
    (dict(parallel=0), "--parallel must be an integer >= 1"),
    (dict(gpus_per_task=-1), "--gpus-per-task must be an integer >= 0"),
    (dict(cpus_per_task=0), "--cpus-per-task"),
    (dict(mem="lots"), "--mem must be a size like 500M or 64G"),
    (dict(time="soon"), "--time must be a Slurm time limit"),
    (dict(time="1:00", signal_lead=120), r"--signal-lead \(120 s\) must be shorter than --time \(1:00 = 60 s\)"),
    (dict(signal_lead=0), "--signal-lead"),
    (dict(signal_lead=70000), "--signal-lead"),
    (dict(max_requeues=-1), "--max-requeues"),
    (dict(partition="gpu; rm -rf /"), "--partition must be a name"),
    (dict(account="a b"), "--account"),
    (dict(qos="q\n"), "--qos"),
    (dict(job_name=""), "--job-name"),
    (dict(sbatch_args=("constraint=a100",)), "one sbatch option on one line"),
    (dict(sbatch_args=("--comment=a\n#SBATCH --x",)), "one sbatch option on one line"),
    (dict(sbatch_args=["--exclusive"]), "tuple"),
    (dict(sbatch_args=("--array=0-3",)), "spcli sets --array itself; use --tasks/--parallel"),
    (dict(sbatch_args=("-p gpu",)), "spcli sets -p itself; use --partition"),
    (dict(sbatch_args=("-pgpu",)), "spcli sets -p itself"),
    (dict(sbatch_args=("--no-requeue",)), "spcli sets --no-requeue itself"),
    (dict(spcli=""), "spcli command"),
])
def test_options_validation(options, message):
    with pytest.raises(ConfigError, match=message):
        SubmitOptions(**{"tasks": 1, **options})


def test_options_defaults():
    options = SubmitOptions(tasks=3)
    assert (options.gpus_per_task, options.signal_lead, options.max_requeues, options.job_name) == (8, 120, 3, "spcli")
    assert options.parallel is None and options.sbatch_args == ()


@pytest.mark.parametrize("limit, seconds", [
    ("30", 1800), ("30:15", 1815), ("2:00:00", 7200), ("1-0", 86400), ("1-02:30", 95400),
    ("1-00:00:05", 86405), ("UNLIMITED", None), ("infinite", None),
])
def test_time_limit_seconds(limit, seconds):
    assert time_limit_seconds(limit) == seconds


@pytest.mark.parametrize("limit", ["", "a", "-5", "1-", "1-2-3", "1:2:3:4", "5-1:2:3:4", "1h"])
def test_time_limit_rejects(limit):
    with pytest.raises(ConfigError, match="--time must be a Slurm time limit"):
        time_limit_seconds(limit)


# --- write_script, submit, read_attempts


def test_write_script_creates_log_dir(tmp_path):
    path = write_script(tmp_path / "out", "#!/bin/bash\n")
    assert path == tmp_path / "out" / "slurm" / "spcli.sbatch"
    assert (tmp_path / "out" / "slurm" / "logs").is_dir()


def test_submit_without_sbatch(tmp_path):
    with pytest.raises(SlurmError, match="not found"):
        submit(tmp_path / "job.sbatch", sbatch=str(tmp_path / "no-sbatch"))
    assert issubclass(SlurmError, SpcliError)


def fake_sbatch(tmp_path, body: str) -> str:
    path = tmp_path / "sbatch"
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_submit_parses_job_id(tmp_path):
    assert submit("job.sbatch", sbatch=fake_sbatch(tmp_path, 'echo "4242;cluster"')) == "4242"
    assert submit("job.sbatch", sbatch=fake_sbatch(tmp_path, "echo 17")) == "17"


def test_submit_failure_carries_sbatch_message(tmp_path):
    sbatch = fake_sbatch(tmp_path, 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1')
    with pytest.raises(SlurmError, match="failed \\(exit 1\\): sbatch: error: invalid partition specified: gpu"):
        submit("job.sbatch", sbatch=sbatch)
    with pytest.raises(SlurmError, match="unexpected output"):
        submit("job.sbatch", sbatch=fake_sbatch(tmp_path, "echo Submitted batch job 5"))


def test_read_attempts(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "attempts-1.log").write_text(
        "time=2026-01-01T00:00:00Z task=1 restart=0 exit=75 action=requeue job=9_1 host=n1\n"
        "time=2026-01-01T01:00:00Z task=1 restart=1 exit=0 action=done job=9_1 host=n2\n")
    attempts = read_attempts(tmp_path)
    assert [(a.restart, a.exit, a.action) for a in attempts[1]] == [(0, 75, "requeue"), (1, 0, "done")]
    (tmp_path / "slurm" / "attempts-2.log").write_text("garbage\n")
    with pytest.raises(SpcliError, match="attempts-2.log:1: not an attempt line"):
        read_attempts(tmp_path)


# --- assign_shards


@pytest.mark.parametrize("num_shards, count", [(0, 1), (1, 1), (1, 4), (7, 3), (10, 10), (63, 8), (100, 7)])
def test_assign_shards_partitions_every_shard_once(num_shards, count):
    shards = [f"part-{i:05d}.parquet" for i in range(num_shards)]
    owned = [assign_shards(shards, index, count) for index in range(count)]
    assert sorted(i for mine in owned for i in mine) == list(range(num_shards))
    assert max(map(len, owned)) - min(map(len, owned)) <= 1  # balanced by count
    assert owned == [assign_shards(list(shards), index, count) for index in range(count)]  # stable


def test_assign_shards_round_robin():
    assert assign_shards(list("abcdefg"), 1, 3) == [1, 4]
    assert assign_shards(list("ab"), 3, 4) == []


@pytest.mark.parametrize("index, count", [(0, 0), (3, 3), (-1, 2)])
def test_assign_shards_rejects_bad_task(index, count):
    with pytest.raises(ConfigError):
        assign_shards(["a"], index, count)


# --- array_task


def test_not_an_array_task():
    assert array_task({}) is None
    assert array_task({"SLURM_JOB_ID": "5"}) is None


def test_array_task_from_count():
    env = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "5", "SLURM_ARRAY_JOB_ID": "123",
           "SLURM_JOB_ID": "125"}
    assert array_task(env) == ArrayTask(index=2, count=5, job_id="123", restart_count=0)
    assert array_task({**env, "SLURM_RESTART_COUNT": "2"}).restart_count == 2


def test_array_task_from_min_max():
    env = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "7", "SLURM_JOB_ID": "9"}
    assert array_task(env) == ArrayTask(index=3, count=8, job_id="9", restart_count=0)


def test_array_task_count_override_for_resubmitted_tasks():
    # `sbatch --array=3,7` of a 10-task array: Slurm says 2 tasks; the script exports the real size.
    env = {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "3",
           "SLURM_ARRAY_TASK_MAX": "7", "SLURM_ARRAY_JOB_ID": "50", "SPCLI_ARRAY_TASK_COUNT": "10"}
    assert array_task(env) == ArrayTask(index=7, count=10, job_id="50", restart_count=0)


def test_array_task_reads_os_environ(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.delenv("SPCLI_ARRAY_TASK_COUNT", raising=False)
    assert array_task() == ArrayTask(index=1, count=2, job_id="77", restart_count=1)


@pytest.mark.parametrize("env, message", [
    ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "SLURM_ARRAY_TASK_ID must be an integer"),
    ({"SLURM_ARRAY_TASK_ID": "0"}, "neither"),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "2"}, "outside 0-1"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1", "SLURM_RESTART_COUNT": "two"}, "SLURM_RESTART_COUNT"),
])
def test_array_task_rejects(env, message):
    with pytest.raises(ConfigError, match=message):
        array_task(env)
