"""One writer per output directory (per Slurm task): a lock file held with flock for the run."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import orjson

from spcli.errors import OutputError

BUSY_TRIES, BUSY_WAIT_S = 3, 0.05  # a held lock is asked again this often before the run is refused


class WriterLock:
    """One writer per directory (per Slurm task): `.lock[-task-N]` holding host, pid and job id.

    The holder keeps an flock on the file, which the kernel drops when the process dies in any way
    (SIGKILL included), so a lock whose flock is free is stale whatever pid it names. Where the file
    system has no flock, a lock naming a dead pid on this host is stale. A lock from another host
    is only taken over by the same Slurm job (a requeue), since its pid cannot be checked from here.
    """

    def __init__(self, out: Path, task_index: int | None, warn=print, job: str | None = None):
        self.path = out / (".lock" if task_index is None else f".lock-task-{task_index:05d}")
        self.warn = warn
        self.job = job  # a Ray run's id (spcli/ray/driver.py): its actors take over each other's locks, as a requeue does
        self.held = False
        self._fd: int | None = None

    def acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "job": self.job or os.environ.get("SLURM_JOB_ID"), "time": time.time()}
        for attempt in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputError(f"{self.path.parent}: output directory is not writable ({e.strerror})") from e
            try:
                has_flock = _try_flock(fd)
                if has_flock is False and attempt < BUSY_TRIES:  # maybe `spcli status` probing it (is_held): a moment
                    os.close(fd)
                    time.sleep(BUSY_WAIT_S)
                    continue
                if has_flock is False:
                    raise self._busy(self._owner(fd))
                if not _same_file(fd, self.path):
                    os.close(fd)
                    continue  # its holder released (unlinked) it while we opened it: start again
                owner = self._owner(fd)
                if owner is not None and owner.get("pid") is not None:
                    if not self._is_stale(owner, me, has_flock is None):
                        raise self._busy(owner)
                    self.warn(f"taking over a stale lock {self.path} (host {owner.get('host')}, pid {owner.get('pid')})")
                os.ftruncate(fd, 0)
                os.pwrite(fd, orjson.dumps(me), 0)
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                raise OutputError(f"{self.path.parent}: output directory is not writable ({e.strerror})") from e
            except BaseException:
                os.close(fd)
                raise
            self._fd, self.held = fd, True
            return
        raise OutputError(f"{self.path}: could not take the lock (it keeps changing); is another run starting here?")

    def _busy(self, owner: dict | None) -> OutputError:
        owner = owner or {}
        return OutputError(
            f"{self.path.parent}: another spcli run writes here (host {owner.get('host', '?')}, pid {owner.get('pid', '?')}); "
            f"wait for it, or remove {self.path} if that run is gone"
        )

    @staticmethod
    def _owner(fd: int) -> dict | None:
        try:
            data = os.pread(fd, 1 << 16, 0)
            owner = orjson.loads(data) if data else None
            return owner if isinstance(owner, dict) else None
        except (OSError, orjson.JSONDecodeError):
            return None

    @staticmethod
    def _is_stale(owner: dict, me: dict, pid_only: bool) -> bool:
        if owner.get("job") and owner.get("job") == me["job"]:
            return True  # the same Slurm job, requeued: its earlier attempt is gone
        if owner.get("host") != me["host"]:
            return False
        if not pid_only:
            return True  # we hold the flock: whoever wrote this lock is gone
        pid = owner.get("pid")
        return not isinstance(pid, int) or pid == me["pid"] or not _pid_alive(pid)

    def release(self) -> None:
        if not self.held:
            return
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)  # unlink before unlocking: nobody can lock a file about to vanish
        finally:
            os.close(self._fd)
            self._fd, self.held = None, False


def is_held(path: Path) -> bool:
    """Whether a live writer holds the lock file `path` (for `spcli status`): False where there is none or its
    holder is gone (killed: the kernel dropped its flock). A lock written on another host counts as held, as
    `acquire` does not take it over: its process cannot be checked from here (a local flock may not see it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        owner = WriterLock._owner(fd) or {}
        if owner.get("host") not in (None, socket.gethostname()):
            return True
        got = _try_flock(fd, shared=True)  # released when fd closes (a run taking it now asks again)
        if got is not None:
            return not got
        pid = owner.get("pid")  # no flock on this file system: the pid it names
        return isinstance(pid, int) and _pid_alive(pid)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    """A process of this host with that pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_flock(fd: int, shared: bool = False) -> bool | None:
    """True: locked (`shared`: a shared lock, as a probe takes); False: another process holds it; None: this file
    system has no flock."""
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return None
        raise


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
