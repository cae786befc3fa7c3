"""The skips of a `make test`: one line counting them by reason, and a failure where this machine could have run one.

    python3 tests/skips.py out/test-reports/hf.json out/test-reports/vllm.json

Each report is what tests/conftest.py writes where $SPCLI_TEST_REPORT names a file (the Makefile's test recipes):
the tests that ran and the ones skipped, with pytest's reason. A skipped test is accounted for when

- it ran in another report given (the vLLM tests skip in the hf suite and run in the vLLM one; the test of the
  error without vLLM skips there and runs in the hf suite), or
- its reason is on ALLOWED below and the machine really lacks what that reason names (checked here, not taken on
  the test's word: a skip for "not root" on a root machine is not allowed).

Anything else fails (exit 1), naming the test and its reason: a green `make test` means the suite ran. Stdlib only
(it runs with the machine's python3 after both suites, whatever venv failed to build).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _cannot_install_debian_packages() -> str | None:
    """Why `make test` could not install Debian packages here (tests/system_packages.sh), or None if it could."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("apt-get") is None:
        return "no apt-get"
    return None


def _not_root() -> str | None:
    return None if os.geteuid() == 0 else "not root"


def _cannot_mount_tmpfs() -> str | None:
    """Why a tmpfs cannot be mounted here (a container without CAP_SYS_ADMIN), tried for real; None if it can."""
    if os.geteuid() != 0:
        return "not root"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True, text=True)
        if proc.returncode:
            return f"mount refused: {proc.stderr.strip() or proc.returncode}"
        subprocess.run(["umount", d], capture_output=True)
    return None


def _no_gpu() -> str | None:
    return None if shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists() else "no NVIDIA GPU"


@dataclass(frozen=True)
class Allowed:
    pattern: str  # a regular expression searched in pytest's skip reason
    why: str  # why such a skip is no hole in the suite
    lacking: Callable[[], str | None]  # what this machine lacks for it (None: it lacks nothing, the skip is a hole)


ALLOWED = (
    Allowed(r"^the local Slurm cluster needs root",
            "slurmd and munged run as root (tests/slurm/cluster.sh)", _not_root),
    Allowed(r"^Slurm is not installed and cannot be installed",
            "Slurm's Debian packages need root and apt-get (tests/system_packages.sh installs them where it can, "
            "and fails `make test` when that install fails)", _cannot_install_debian_packages),
    Allowed(r"^chromium is not installed",
            "Debian's chromium needs root and apt-get (tests/system_packages.sh, as for Slurm)",
            _cannot_install_debian_packages),
    Allowed(r"^mounting a tmpfs needs root|cannot mount a (read-only )?tmpfs here",
            "a real full or read-only filesystem needs a tmpfs mount (root, CAP_SYS_ADMIN); the ENOSPC injection "
            "and chmod tests cover the same paths without one", _cannot_mount_tmpfs),
    Allowed(r"\bno (CUDA |NVIDIA )?GPU\b|CUDA is not available",
            "GPU tests need an NVIDIA GPU (benches/gpu_check*.sh run them on one)", _no_gpu),
)


def base_id(test: str) -> str:
    """A test's id without pytest-xdist's `@group` suffix (--dist loadgroup)."""
    return re.sub(r"@[\w.-]+$", "", test)


def ran_elsewhere(test: str, ran: set[str]) -> bool:
    """Whether a skipped test (or a skipped module: all of its tests) ran in another suite."""
    return test in ran or any(r.startswith(test + "::") for r in ran)


def account(reports: dict[str, dict], allowed: tuple[Allowed, ...] = ALLOWED) -> tuple[Counter, list[str]]:
    """(skips by reason and verdict, one line per skip that is a hole)."""
    counts: Counter = Counter()
    holes = []
    lacking_cache: dict[int, str | None] = {}
    for name, report in reports.items():
        others = {other: {base_id(t) for t in r["ran"]} for other, r in reports.items() if other != name}
        for skip in report["skipped"]:
            test, reason = base_id(skip["test"]), skip["reason"]
            short = reason.split(";")[0].split(":")[0].strip()
            other = next((o for o, ran in others.items() if ran_elsewhere(test, ran)), None)
            if other is not None:
                counts[f"{short} [ran in the {other} suite]"] += 1
                continue
            rule = next((i for i, a in enumerate(allowed) if re.search(a.pattern, reason)), None)
            if rule is not None and rule not in lacking_cache:
                lacking_cache[rule] = allowed[rule].lacking()
            lacks = None if rule is None else lacking_cache[rule]
            if lacks is not None:
                counts[f"{short} [allowed: {lacks}]"] += 1
                continue
            counts[f"{short} [NOT ALLOWED]"] += 1
            verdict = ("no allowed reason matches it" if rule is None else
                       f"this machine has what it needs ({allowed[rule].why})")
            holes.append(f"{name}: {skip['test']}: skipped ({reason}): {verdict}")
    return counts, holes


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    reports = {}
    for arg in argv:
        path = Path(arg)
        if not path.is_file():
            print(f"skips: {path}: no test report (did that suite run?)", file=sys.stderr)
            return 1
        reports[path.stem] = json.loads(path.read_text())
    counts, holes = account(reports)
    ran = sum(len(r["ran"]) for r in reports.values())
    by_reason = "; ".join(f"{reason}: {n}" for reason, n in counts.most_common()) or "none"
    print(f"skips: {sum(counts.values())} skipped, {ran} ran ({', '.join(reports)}); by reason: {by_reason}")
    for hole in holes:
        print(f"skips: {hole}", file=sys.stderr)
    if holes:
        print(f"skips: {len(holes)} test(s) skipped that this machine can run: a green run must mean the suite ran "
              "(fix the cause, or add the reason to ALLOWED in tests/skips.py with why)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
