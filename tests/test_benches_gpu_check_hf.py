"""benches/gpu_check_hf.py at tiny scale, here on the CPU: every step runs and the JSON holds the four parts.

The same steps run at full scale on an H200 (benches/gpu_check_hf.sh); here the models are tiny random-weight
Llamas (base: 4 layers, hidden 128; speculator: 2 layers, hidden 64; real sizes: Llama-3.1-8B and Llama-3.2-1B,
spcli.plan.configs), the prompts 512-2048 words, the scoring kernel runs under TRITON_INTERPRET=1. Times are not
judged (a shared CPU); what is checked is that each part was measured and agrees with itself and with the plan.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.xdist_group("gpu_check_hf")  # one worker: its module fixture (~1-2 min) runs once


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[dict, Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("gpu_check_hf")
    proc = subprocess.run([sys.executable, str(ROOT / "benches" / "gpu_check_hf.py"), "--tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert (out / "gpu_check_hf.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_check_hf.json").read_text()), out, proc


def test_every_step_ran_and_passed(check):
    result, out, proc = check
    steps = {s["name"]: s for s in result["steps"]}
    assert list(steps) == ["kernel", "build", "run_1.0", "run_0.1", "pytest"]
    failed = {k: s for k, s in steps.items() if s["exit"] != 0}
    assert not failed, f"{failed}\n{(out / 'log.txt').read_text()[-4000:]}"
    assert proc.returncode == 0 and result["ok"] is True
    assert all(0 < s["seconds"] <= s["limit_s"] for s in steps.values())


def test_startup_names_versions_and_device(check):
    start = check[0]["startup"]
    assert start["scale"] == "tiny" and start["python"].count(".") == 2
    for name in ("torch", "transformers", "triton", "pyarrow"):
        assert start["packages"][name], name
    assert "gpu" in start  # None without nvidia-smi; on the H200 its name, driver and clocks
    summary = (check[1] / "summary.txt").read_text()
    assert summary.startswith("gpu_check_hf (tiny)") and "result: ok" in summary
    for part in ("part 1", "part 2", "part 3", "steps: kernel exit 0"):
        assert part in summary, part


def test_part1_kernel_parity_and_times(check):
    kernel = check[0]["kernel"]
    assert kernel["interpreted"] is True and kernel["matmul"]["tflops"] > 0
    cases = {(c["dtype"], c["n"]): c for c in kernel["cases"]}
    assert set(cases) == {(d, n) for d in ("bfloat16", "float32") for n in (64, 128, 256)}
    for c in cases.values():
        assert c["parity_ok"] and c["max_rel_err"] <= c["rtol"], c
        assert c["kernel_ms"] > 0 and c["reference_ms"] > 0
        assert c["key_bytes"] == 2 * c["n"] * 32 * (2 if c["dtype"] == "bfloat16" else 4)  # KVH=2, D=32
        assert c["bandwidth_gbs"] == pytest.approx(2 * c["key_bytes"] / c["kernel_ms"] / 1e6)
    pytest_line = kernel["pytest"]
    assert pytest_line["passed"] == 2 and "failed" not in pytest_line, pytest_line


def test_part2_ttft_ratio_limit_speculator_and_reserve(check):
    e2e = check[0]["e2e"]
    assert e2e["score"]["lookahead"] == 8 and e2e["base"]["layers"] == 4 and e2e["speculator"]["layers"] == 2
    assert [(c["batch"], c["n"]) for c in e2e["cases"]] == [(16, 512), (4, 1024)]
    for c in e2e["cases"]:
        assert not c["problems"], c["problems"]  # every row: no error, n tokens, the kept count selection gives
        assert c["ttft_full_s"] > 0 and c["ttft_spec_s"] > 0
        assert c["ttft_ratio"] == pytest.approx(c["ttft_full_s"] / c["ttft_spec_s"])
        assert c["ratio_of_limit"] == pytest.approx(c["ttft_ratio"] / c["flop_limit"])
        assert 1 < c["flop_limit"] <= c["plan_limit"]  # selection keeps at least ceil(0.1 n): the plan's count
        assert c["plan_kept_per_prompt"] == math.ceil(0.1 * c["n"]) <= c["kept_per_prompt"] < c["n"]
        assert 0 < c["speculator_s"] < c["ttft_spec_s"]
        assert c["speculator_tflops"] == pytest.approx(c["speculator_flops"] / c["speculator_s"] / 1e12)
        assert c["speculator_matmul_share"] == pytest.approx(c["speculator_tflops"] / e2e["matmul_tflops"])
        assert c["speculator_peak_bytes"] is None  # the CPU has no allocator statistic; CUDA does
        terms = c["reserve_terms"]
        assert c["reserve_bytes"] == terms["total"] == sum(v for k, v in terms.items() if k != "total")
    profile = e2e["profile"]
    assert profile["tokens"] == 1024 and profile["wall_s"] > 0 and profile["top"], e2e.get("profile_error")


def test_part3_chunked_prefill_against_the_plan(check):
    chunked = check[0]["chunked"]
    assert chunked["speculator_chunk"] == 256
    small, large = chunked["cases"]
    assert (small["n"], large["n"]) == (1024, 2048) and small["is_measured"] and large["is_measured"]
    assert small["plan_growing_bytes"] < large["plan_growing_bytes"]  # the cache grows with n ...
    assert small["plan_rest_bytes"] == large["plan_rest_bytes"]  # ... the rest is the chunk's, flat
    assert large["speculator_s"] > 0


def test_targets_are_not_judged_at_tiny_scale(check):
    targets = check[0]["targets"]
    assert targets["judged"] is False
    assert set(targets) == {"judged", "ttft_ratio_of_flop_limit_4x1024", "speculator_matmul_share"}
    assert all(t["met"] is None and t["value"] is not None for k, t in targets.items() if k != "judged")
