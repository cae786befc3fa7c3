"""The hf engine, the scoring kernel and the plan measured on one GPU, in one call of under 8 minutes (issue 32).

    python3 benches/gpu_check_hf.py --scale full --out DIR     on the H200 (benches/gpu_check_hf.sh runs this)
    python3 benches/gpu_check_hf.py --tiny --out DIR           here, on the CPU, in about a minute

Steps, each in its own process (benches/gpu_check_hf_steps.py), each with its exit status and a time limit
inside one deadline:
  kernel    part 1: the Triton scoring kernel (compiled on CUDA; TRITON_INTERPRET=1 at tiny scale) against the
            torch reference, bf16 and float32, one layer's window rows at n = 8k, 32k, 128k: parity, time,
            achieved bandwidth; and the rate of a plain square matmul in bf16 (what "the matmul rate" means)
  build     random-weight models from configs (Llama-3.1-8B's shape as the base, Llama-3.2-1B's as the
            speculator), word-level prompts, and spcli plan's FLOP limits and speculator reserves for them
  run 1.0   `spcli run --engine hf --keep 1.0` (full prefill) on 16 x 8k and 4 x 32k prompts
  run 0.1   the same at keep 0.1 (the paper's recipe), plus one 128k prompt (part 3: chunked speculator
            prefill, --speculator-chunk 8192) and a profile of one speculator pass
  pytest    the kernel parity tests (tests/test_kernels_score*.py), compiled for the GPU
Writes summary.txt, gpu_check_hf.json, log.txt, pytest.txt and profile.txt under --out. Exit 0 when every
step exited 0 and every check on the rows held, else 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # spcli from this checkout, installed or not (the device's Python has no spcli)

from gpu_check_hf_report import assemble, summary_lines  # noqa: E402
from gpu_check_hf_steps import SCALES  # noqa: E402
STEPS_SCRIPT = Path(__file__).resolve().parent / "gpu_check_hf_steps.py"
RUN_SCRIPT = Path(__file__).resolve().parent / "gpu_check_hf_run.py"
PACKAGES = ("torch", "transformers", "triton", "tokenizers", "safetensors", "accelerate", "pyarrow", "numpy",
            "typer", "orjson", "pytest")
# seconds per step, within the deadline; the longest step at full scale is the keep-0.1 run (128k prompt)
TIMEOUTS = {"full": {"kernel": 90, "build": 150, "run_1.0": 120, "run_0.1": 210, "pytest": 150},
            "tiny": {"kernel": 120, "build": 120, "run_1.0": 120, "run_0.1": 150, "pytest": 120}}
DEADLINES = {"full": 470, "tiny": 600}  # the device call is one command of at most 10 minutes; the issue asks 8
PYTEST_FILES = ("tests/test_kernels_score.py", "tests/test_kernels_score_triton.py")
PYTEST_SELECT = {"full": "not smollm2",  # its tokenizer is not on the device
                 "tiny": "n33-D64-S8-pool13-bfloat16 or n33-D64-S8-pool13-float32"}  # interpreted


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def nvidia_smi() -> dict | None:
    """The GPU as nvidia-smi sees it, clocks included; None where there is none."""
    fields = ("name", "memory.total", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.limit", "temperature.gpu", "pstate")
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": (out.stderr or out.stdout).strip()[:200]}
    return dict(zip(fields, (v.strip() for v in out.stdout.strip().splitlines()[0].split(","))))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def startup_info(scale: str) -> dict:
    return {"scale": scale, "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "executable": sys.executable, "host": platform.node(),
            "cpus": os.cpu_count(), "packages": versions(), "spcli_commit": git_commit(), "gpu": nvidia_smi()}


def step_env(scale_name: str, name: str) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("TRITON_INTERPRET", None)  # compiled kernels on the GPU
    if scale_name == "tiny":
        env["OMP_NUM_THREADS"] = "1"  # tiny matmuls: threads only spin against each other on a shared CPU
        if name == "kernel":
            env["TRITON_INTERPRET"] = "1"  # read when triton is imported: the kernels run in the interpreter
    return env


def run_step(name: str, argv: list[str], timeout: float, env: dict, log_path: Path) -> dict:
    """One step in its own process group, its output appended to log_path; exit 124 when it ran out of time."""
    t0 = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"\n===== {name}: {' '.join(argv)} (limit {timeout:.0f} s)\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = 124
    seconds = time.perf_counter() - t0
    print(f"step {name}: exit {code} in {seconds:.1f} s", flush=True)
    return {"name": name, "exit": code, "seconds": round(seconds, 2), "limit_s": round(timeout, 1),
            "timed_out": code == 124}


def steps_for(scale: str, work: Path, out: Path) -> list[tuple[str, list[str], Path]]:
    py, steps = sys.executable, str(STEPS_SCRIPT)
    pytest = [py, "-m", "pytest", *PYTEST_FILES, "-q", "-p", "no:cacheprovider", "-rs", "-k", PYTEST_SELECT[scale]]
    return [("kernel", [py, steps, "kernel", str(work), scale], out / "log.txt"),
            ("build", [py, steps, "build", str(work), scale], out / "log.txt"),
            ("run_1.0", [py, str(RUN_SCRIPT), str(work), scale, "1.0"], out / "log.txt"),
            ("run_0.1", [py, str(RUN_SCRIPT), str(work), scale, "0.1"], out / "log.txt"),
            ("pytest", pytest, out / "pytest.txt")]


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_summary(out: Path, result: dict) -> list[str]:
    try:
        lines = summary_lines(result)
    except Exception as e:  # a part not as expected: the JSON still holds what there is
        lines = [f"summary failed ({type(e).__name__}: {e}); see gpu_check_hf.json", json.dumps(result.get("steps"))]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return lines


def check(scale: str, out: Path, work: Path, deadline_s: float) -> dict:
    t_start = time.perf_counter()
    result = {"check": "benches/gpu_check_hf.sh", "issue": 32, "startup": startup_info(scale), "steps": []}
    print("start: " + json.dumps(result["startup"]), flush=True)
    for name, argv, log_path in steps_for(scale, work, out):
        left = deadline_s - (time.perf_counter() - t_start)
        if name.startswith("run") and not any(s["name"] == "build" and s["exit"] == 0 for s in result["steps"]):
            result["steps"].append({"name": name, "exit": None, "skipped": "the build step failed"})
            continue
        if left < 10:
            result["steps"].append({"name": name, "exit": None, "skipped": f"the {deadline_s:.0f} s deadline"})
            continue
        result["steps"].append(run_step(name, argv, min(TIMEOUTS[scale][name], left), step_env(scale, name), log_path))
        parts = {k: load(work / f"{k}.json") for k in ("kernel", "build", "run_1", "run_0.1")}
        try:
            result.update(assemble(SCALES[scale], parts, result["steps"], out / "pytest.txt"))
        except Exception as e:  # a step's JSON not as expected: the steps' statuses and the log still come back
            result.update(ok=False, report_error=f"{type(e).__name__}: {e}")
        result["wall_s"] = round(time.perf_counter() - t_start, 1)
        (out / "gpu_check_hf.json").write_text(json.dumps(result, indent=1))  # after every step: a kill keeps them
        write_summary(out, result)
    if (work / "profile.txt").exists():
        shutil.copy(work / "profile.txt", out / "profile.txt")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default=os.environ.get("GPU_CHECK_SCALE", "tiny"),
                    help="full: the H200 shapes; tiny: this CPU (default: $GPU_CHECK_SCALE, else tiny)")
    ap.add_argument("--tiny", action="store_true", help="the same as --scale tiny")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu_check_hf")))
    ap.add_argument("--work", type=Path, default=None, help="models, shards and outputs (default: a temporary folder)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for every step together")
    args = ap.parse_args(argv)
    scale = "tiny" if args.tiny else args.scale
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("log.txt", "pytest.txt", "profile.txt", "summary.txt", "gpu_check_hf.json"):
        (args.out / name).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_hf_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = check(scale, args.out, work, args.deadline or DEADLINES[scale])
    print("\n".join(write_summary(args.out, result)), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
