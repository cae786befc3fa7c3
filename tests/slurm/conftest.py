"""The local Slurm cluster for tests marked `slurm`: `tests/slurm/cluster.sh up` once per session.

Needs root (it starts munged, mariadbd, slurmdbd, slurmctld and slurmd, and installs the Debian
packages when missing). Without root, or when the packages cannot be installed, the tests skip
with the reason; under CI=true the reason is also printed, so a skip is never silent. A cluster
that is installed but does not come up fails the tests. SLURM_CI_KEEP=1 leaves it up afterwards.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CLUSTER_SH = Path(__file__).with_name("cluster.sh")
EXIT_NO_PACKAGES = 100  # cluster.sh: the packages are missing and cannot be installed
UP_TIMEOUT_S = 600  # a first install downloads ~100 MB of packages
START_TIMEOUT_S = 90  # a job's start: ~1 s on an idle node, more on CI's 2 loaded cores
DRAIN_TIMEOUT_S = 60  # after a test: its cancelled jobs leave the queue (KillWait=5, then KILL)
STATE_DIR = Path(os.environ.get("SLURM_CI_DIR", "/tmp/spcli-slurm"))  # cluster.sh's default
# sacct states after which a job does not run again.
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                "BOOT_FAIL", "DEADLINE"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: runs jobs on the local Slurm cluster (tests/slurm/cluster.sh; root)")


def _say(request: pytest.FixtureRequest, message: str) -> None:
    """Print past pytest's output capture (only under CI, where a skip must be explained)."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n[slurm] {message}", yellow=True)


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def sacct_rows(job_id: str, duplicates: bool = False) -> list[dict[str, str]]:
    """One dict per job record (array task and attempt with `duplicates`), batch steps left out."""
    args = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
            "--format=JobID,State,ExitCode,Start,End"]
    proc = _run(*args, *(["--duplicates"] if duplicates else []))
    assert proc.returncode == 0, proc.stderr
    keys = ("job", "state", "exit", "start", "end")
    # "CANCELLED by 0" -> "CANCELLED"
    return [{**dict(zip(keys, line.split("|"))), "state": line.split("|")[1].split()[0]}
            for line in proc.stdout.splitlines() if line]


def queued(job_id: str) -> list[str]:
    """`<task> <state>` for each task of the job still pending, running or completing."""
    proc = _run("squeue", "--noheader", f"--jobs={job_id}", "--format=%i %T")
    if proc.returncode != 0 and "Invalid job id" in proc.stderr:  # purged already
        return []
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")[:-1]


def cluster_report() -> str:
    """The queue with each job's reason, the node's state and slurmctld's last lines: for a failure message."""
    parts = []
    for args in (("squeue", "--noheader", "--format=%i %P %T %r start=%S elapsed=%M"),
                 ("sinfo", "--noheader", "--Node", "--format=%N %T %C reason=%E")):
        try:
            proc = _run(*args)
            parts.append(f"$ {' '.join(args)}\n{proc.stdout}{proc.stderr}".rstrip())
        except (OSError, subprocess.TimeoutExpired) as err:
            parts.append(f"$ {' '.join(args)}: {err!r}")
    try:
        lines = (STATE_DIR / "log" / "slurmctld.log").read_text(errors="replace").splitlines()
        parts.append("slurmctld.log, last 25 lines:\n" + "\n".join(lines[-25:]))
    except OSError as err:
        parts.append(f"slurmctld.log: {err}")
    return "\n".join(parts)


def wait_for_job(job_id: str, timeout: float, tasks: int | None = None) -> list[dict[str, str]]:
    """Poll until every task of the job has left the queue and sacct holds its final state.

    A requeued task goes back to PENDING, so it stays waited for. Give `tasks` for an array:
    slurmdbd may briefly hold one unsplit record for an array whose tasks all ended, so this also
    waits for the `<job>_<i>` rows. Returns `sacct_rows(job_id)`.
    """
    expected = None if tasks is None else {f"{job_id}_{i}" for i in range(tasks)}
    deadline = time.monotonic() + timeout
    while queued(job_id):
        if time.monotonic() > deadline:
            detail = _run("scontrol", "show", "job", job_id).stdout
            raise AssertionError(f"job {job_id} still queued after {timeout:.0f} s: {queued(job_id)}\n{detail}\n"
                                 f"{cluster_report()}")
        time.sleep(0.5)
    while True:  # accounting reaches slurmdbd a moment after squeue lets go of the job, and a final
        rows = sacct_rows(job_id)  # state can be there a moment before its End time (then "Unknown")
        if rows and all(r["state"] in FINAL_STATES and r["end"] != "Unknown" for r in rows) and (
                expected is None or {r["job"] for r in rows} == expected):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id}: sacct has no final state after {timeout:.0f} s: {rows}\n"
                                 f"{cluster_report()}")
        time.sleep(0.5)


def wait_for_path(path: Path, timeout: float = START_TIMEOUT_S) -> None:
    """Until a job has written `path` (by default: until a job has started, however loaded the machine)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout:.0f} s\n{cluster_report()}")
        time.sleep(0.2)


def cancel_every_job() -> None:
    """scancel whatever is queued and wait until the queue is empty (or fail, saying what is left)."""
    ids = _run("squeue", "--noheader", "--format=%A").stdout.split()
    if ids:
        _run("scancel", *ids)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while _run("squeue", "--noheader", "--format=%A").stdout.split():
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs still queued {DRAIN_TIMEOUT_S} s after scancel\n{cluster_report()}")
        time.sleep(0.5)


@dataclass(frozen=True)
class SlurmCluster:
    dir: Path  # $SLURM_CI_DIR: config, state and logs
    conf: Path  # exported as $SLURM_CONF for the session; jobs inherit it

    def run(self, *args: str) -> str:
        proc = _run(*args)
        assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def sbatch(self, *args: str) -> str:
        proc = _run("sbatch", "--parsable", *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    start_timeout = START_TIMEOUT_S
    report = staticmethod(cluster_report)
    wait_for_job = staticmethod(wait_for_job)
    wait_for_path = staticmethod(wait_for_path)
    sacct_rows = staticmethod(sacct_rows)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest):
    if os.geteuid() != 0:
        reason = "the local Slurm cluster needs root (tests/slurm/cluster.sh starts munged and slurmd)"
        _say(request, f"skipping: {reason}")
        pytest.skip(reason)
    state_dir = STATE_DIR
    started = time.monotonic()
    try:
        proc = _run(str(CLUSTER_SH), "up", timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tests/slurm/cluster.sh up did not finish in {UP_TIMEOUT_S} s")
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode == EXIT_NO_PACKAGES:
        reason = f"Slurm is not installed and cannot be installed: {(output.splitlines() or ['?'])[-1]}"
        _say(request, f"skipping: {reason}")
        pytest.skip(reason)
    if proc.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh up failed (exit {proc.returncode}):\n{output}")
    _say(request, f"cluster up in {time.monotonic() - started:.1f} s ({state_dir})")

    conf = state_dir / "etc" / "slurm.conf"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield SlurmCluster(dir=state_dir, conf=conf)
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if os.environ.get("SLURM_CI_KEEP") != "1":
            _run(str(CLUSTER_SH), "down", timeout=120)


@pytest.fixture(autouse=True)
def empty_queue_after_each_test(request: pytest.FixtureRequest):
    """A test that fails mid-wait leaves its jobs queued: they would start later and hold the node
    (several tests ask for --exclusive), failing the next tests for a reason that is not theirs."""
    yield
    if "slurm_cluster" in request.fixturenames:
        cancel_every_job()
