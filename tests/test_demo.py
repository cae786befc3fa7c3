"""`make demo` — the README's first command — runs the default model on examples/ and says where outputs are."""

import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).parent.parent

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo(tmp_path):
    demo = ROOT / "out" / "demo"
    kept = tmp_path / "demo-before"  # a demo already run in this checkout would only be resumed: set it aside
    if demo.exists():
        shutil.move(demo, kept)
    try:
        _check_fresh_demo()
    finally:
        if kept.exists():
            shutil.rmtree(demo, ignore_errors=True)
            shutil.move(kept, demo)


def _check_fresh_demo():
    proc = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 8 rows (0 failed)" in proc.stdout
    assert "outputs: out/demo" in proc.stdout
    rows = [r for p in sorted((ROOT / "out" / "demo").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert len(rows) == 8 and all(r["error"] is None and r["output"] for r in rows)
    assert all(r["num_kept_tokens"] <= 0.31 * r["num_prompt_tokens"] for r in rows)
