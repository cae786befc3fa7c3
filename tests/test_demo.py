"""`make demo` — the README's first command — runs the default model on examples/ and says where outputs are.

Outside `make test` (`extended`: `make test-extended` runs it): the demo's 8 real SmolLM2 rows took 4.6 min
beside the rest of the suite on 2 cores, the largest single item of a suite that must end within 20 minutes; the
README's other job (tests/test_readme_job.py) runs the same embedded model through `spcli run` in `make test`,
and every session checks `make demo` from a clean clone before it stops."""

import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.extended]


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
