"""tests/skips.py: which skips of a `make test` are accounted for, and which fail it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from skips import ALLOWED, Allowed, account

SKIPS = Path(__file__).with_name("skips.py")
LACKS = (Allowed(r"^needs a thing", "things are rare", lambda: "no thing here"),)
HAS = (Allowed(r"^needs a thing", "things are rare", lambda: None),)


def report(ran: list[str], skipped: dict[str, str]) -> dict:
    return {"python": "python", "ran": ran, "skipped": [{"test": t, "reason": r} for t, r in skipped.items()]}


def test_a_skip_that_ran_in_the_other_suite_is_accounted_for_module_and_xdist_group_alike():
    reports = {"hf": report(["tests/a.py::test_x"], {"tests/b.py": "vLLM is not installed here",
                                                     "tests/c.py::test_y@slurm": "needs a thing"}),
               "vllm": report(["tests/b.py::test_one", "tests/c.py::test_y"], {"tests/a.py::test_x": "other"})}
    counts, holes = account(reports, LACKS)
    assert holes == []
    assert counts == {"vLLM is not installed here [ran in the vllm suite]": 1,
                      "needs a thing [ran in the vllm suite]": 1, "other [ran in the hf suite]": 1}


def test_an_allowed_reason_counts_only_where_the_machine_lacks_what_it_names():
    reports = {"hf": report([], {"tests/a.py::test_x": "needs a thing: install it"})}
    assert account(reports, LACKS) == ({"needs a thing [allowed: no thing here]": 1}, [])
    counts, holes = account(reports, HAS)
    assert counts == {"needs a thing [NOT ALLOWED]": 1}
    assert holes == ["hf: tests/a.py::test_x: skipped (needs a thing: install it): this machine has what it needs "
                     "(things are rare)"]


def test_a_reason_on_no_list_is_a_hole():
    counts, holes = account({"hf": report([], {"tests/a.py::test_x": "flaky today"})}, LACKS)
    assert holes == ["hf: tests/a.py::test_x: skipped (flaky today): no allowed reason matches it"]


def test_every_allowed_reason_says_why():
    assert all(a.why and a.pattern for a in ALLOWED)


def test_the_script_fails_on_a_hole_and_prints_the_count_line(tmp_path):
    (tmp_path / "hf.json").write_text(json.dumps(report(["tests/a.py::test_x"], {"tests/b.py::test_y": "flaky today"})))
    proc = subprocess.run([sys.executable, str(SKIPS), str(tmp_path / "hf.json")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout == "skips: 1 skipped, 1 ran (hf); by reason: flaky today [NOT ALLOWED]: 1\n"
    assert "tests/b.py::test_y: skipped (flaky today)" in proc.stderr
    proc = subprocess.run([sys.executable, str(SKIPS), str(tmp_path / "vllm.json")], capture_output=True, text=True)
    assert proc.returncode == 1 and "vllm.json: no test report" in proc.stderr
