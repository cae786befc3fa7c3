"""The distribution: a wheel built from this tree installs into a fresh venv, where `spcli` works.

Nothing big is downloaded: the wheel is built without build isolation (this venv's setuptools) and
installed with --no-deps; the fresh venv sees this venv's packages (torch, transformers...) through a
.pth line, while spcli itself comes from the wheel (checked by its path).
"""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from spcli import DISTRIBUTION, __version__

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")  # a copy: the build writes build/ and *.egg-info beside its sources
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "spcli", src / "spcli", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist, src,
       timeout=180)
    (whl,) = dist.glob("*.whl")
    return whl


def test_wheel_is_the_free_name_with_the_extras(wheel):
    assert wheel.name.startswith(f"{DISTRIBUTION.replace('-', '_')}-{__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"{DISTRIBUTION.replace('-', '_')}-{__version__}.dist-info/METADATA").decode()
        entry_points = z.read(f"{DISTRIBUTION.replace('-', '_')}-{__version__}.dist-info/entry_points.txt").decode()
        names = z.namelist()
    assert f"Name: {DISTRIBUTION}" in meta
    for extra in ("vllm", "vllm-cpu", "ray", "test"):
        assert f"Provides-Extra: {extra}" in meta
    assert "Requires-Dist: vllm==0.32.0; extra == \"vllm\"" in meta
    assert "Requires-Dist: ray[data]==2.60.0; extra == \"ray\"" in meta
    assert "spcli = spcli.cli:main" in entry_points
    assert "spcli/api.py" in names and not any(n.startswith("tests/") for n in names)
    assert "spcli/evaluate/data/essay_qa.json" in names  # package data: essay-qa's questions


def test_wheel_installs_into_a_fresh_venv_and_runs(wheel, tmp_path, tiny_dir):
    venv = tmp_path / "venv"
    sh(sys._base_executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co, not spcli's own code
    sh(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)

    spcli = venv / "bin" / "spcli"
    assert sh(spcli, "--version", cwd=tmp_path).stdout.strip() == f"spcli {__version__}"
    where = sh(python, "-c", "import spcli; print(spcli.__file__)", cwd=tmp_path).stdout.strip()
    assert where.startswith(str(site)), f"spcli imported from {where}, not from the wheel in {site}"

    records = tmp_path / "in.jsonl"
    records.write_text("".join(json.dumps({"id": f"r{i}", "prompt": " ".join(f"w{j % 37}" for j in range(90 + 9 * i))})
                               + "\n" for i in range(3)))
    res = sh(spcli, "-q", "run", records, "--out", tmp_path / "out", "--model", tiny_dir, "--keep", "0.3",
             "--min-tokens", "16", *ALWAYS_PRUNE, "--keep-last", "8", "--max-tokens", "4", "--dtype", "float32",
             "--speculator", "self:2", "--lookahead", "2", cwd=tmp_path, timeout=300)
    assert res.stdout.startswith("done: 3 rows (0 failed)"), res.stdout + res.stderr
    assert list((tmp_path / "out").glob("part-*.parquet"))
