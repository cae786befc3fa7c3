"""The `run` step of benches/gpu_check_hf.py: `spcli run --engine hf` as a user runs it, measured from outside.

The CLI's own `main` runs in this process, so that the CUDA allocator's statistics can be read around
it. One probe wraps `spcli.stages.prepare.speculate_prompts` (the speculator loop every engine calls,
left to do its work unchanged) to time each call and to read its peak: the peak is reset when the
call starts, and what it adds to the memory held then, plus the speculator's weights, is the
speculator's peak (what the plan's reserve sizes). TTFT and the rows come from the run's own output
parts. At keep < 1, one speculator pass is then profiled (torch.profiler) to show where its time goes.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from gpu_check_hf_steps import EOS_ID, MIN_TOKENS, PROFILE_ROWS, SCALES, Scale, score_config, shards, write_json
from spcli.config.scoring import PAPER_CHUNK, PAPER_SCORE

SCORING_KERNELS = ("_softmax_stats_kernel", "_pooled_max_kernel")  # spcli/kernels/score_triton.py


class Probe:
    """Wraps prepare.speculate_prompts: per call, its prompt lengths, wall time and peak memory."""

    def __init__(self):
        import torch

        import spcli.stages.prepare as prepare

        self.calls: list[dict] = []
        self.peak = 0  # the process's peak allocated bytes, across the resets below
        real = prepare.speculate_prompts

        def probed(model, prompts, *args, **kwargs):
            before = self._start()
            t0 = time.perf_counter()
            out = real(model, prompts, *args, **kwargs)
            self._sync()
            call = {"lengths": [len(p) for p in prompts], "wall_s": time.perf_counter() - t0,
                    "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
            if before is not None:
                peak = torch.cuda.max_memory_allocated()
                self.peak = max(self.peak, peak)
                call.update(allocated_before=before, peak_above_before=peak - before,
                            speculator_peak_bytes=peak - before + call["weights_bytes"])
            self.calls.append(call)
            return out

        prepare.speculate_prompts = probed

    @staticmethod
    def _is_cuda() -> bool:
        import torch

        return torch.cuda.is_initialized()  # the run put its models on a GPU

    def _sync(self) -> None:
        import torch

        if self._is_cuda():
            torch.cuda.synchronize()

    def _start(self) -> int | None:
        import torch

        if not self._is_cuda():
            return None
        torch.cuda.synchronize()
        self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def process_peak(self) -> int | None:
        import torch

        if not self._is_cuda():
            return None
        return max(self.peak, torch.cuda.max_memory_allocated())


def spcli_argv(work: Path, scale: Scale, keep: float, out_dir: Path) -> list[str]:
    score = {k: str(v) for k, v in PAPER_SCORE.items()}
    inputs = [str(work / "in" / name) for name, _, _ in shards(scale, keep)]
    return ["run", *inputs, "--out", str(out_dir), "--engine", "hf", "--model", str(work / "base"),
            "--speculator", str(work / "speculator"), "--keep", f"{keep:g}", "--max-tokens", str(scale.max_tokens),
            "--batch-size", str(max(b for _, b, _ in shards(scale, keep))), "--dtype", scale.dtype,
            "--device", scale.device, "--speculator-chunk", str(scale.speculator_chunk),
            "--lookahead", score["lookahead"], "--window", score["window"], "--score-layers", score["score_layers"],
            "--pool", score["pool"], "--rows", score["rows"], "--chunk", str(PAPER_CHUNK), "--min-tokens", str(MIN_TOKENS),
            "--score-impl", scale.score_impl, "--commit-interval", "0", "--output-format", "jsonl"]


def read_rows(out_dir: Path) -> list[dict]:
    fields = ("id", "error", "num_prompt_tokens", "num_kept_tokens", "num_output_tokens", "ttft_s", "speculate_s",
              "prefill_s", "decode_s")
    rows = []
    for part in sorted(out_dir.glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            rows.append({k: row.get(k) for k in fields})
    return rows


def profile_speculator(work: Path, scale: Scale) -> dict:
    """One speculator pass on one prompt of scale.profile_length tokens, warm, under torch.profiler: the
    ops by their own device time (CPU time on the CPU) into WORK/profile.txt, the largest in the result."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from spcli.models.load import load_causal_lm
    from spcli.stages.speculate import speculate_batch

    device = torch.device(scale.device)
    model = load_causal_lm(work / "speculator", scale.dtype, device).model
    rng = random.Random(1)
    prompt = [rng.randrange(3, scale.speculator["vocab_size"]) for _ in range(scale.profile_length)]
    run = lambda: speculate_batch(model, [prompt], score_config(scale), {EOS_ID}, device,  # noqa: E731
                                  chunk=scale.speculator_chunk)
    run()
    is_cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])) as prof:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
    averages = prof.key_averages()
    sort = "self_device_time_total" if is_cuda else "self_cpu_time_total"
    (work / "profile.txt").write_text(
        f"one speculator pass, {scale.profile_length} tokens, chunk {scale.speculator_chunk}, {scale.dtype} on "
        f"{scale.device}: {wall:.3f} s wall\n" + averages.table(sort_by=sort, row_limit=PROFILE_ROWS))
    if is_cuda:  # the kernels themselves (an op's own device time would count its kernels twice)
        events = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]
        own = lambda e: e.self_device_time_total  # noqa: E731
    else:
        events, own = list(averages), (lambda e: e.self_cpu_time_total)
    total_us = sum(own(e) for e in events)
    top = sorted(events, key=own, reverse=True)[:12]
    scoring_us = sum(own(e) for e in events if any(k in e.key for k in SCORING_KERNELS))
    return {"tokens": scale.profile_length, "wall_s": wall, "time_kind": "device" if is_cuda else "cpu",
            "total_self_ms": total_us / 1e3, "scoring_kernels_ms": scoring_us / 1e3,
            "top": [{"name": e.key[:120], "calls": e.count, "self_ms": own(e) / 1e3,
                     "share": own(e) / total_us if total_us else None} for e in top]}


def run_step(work: Path, scale: Scale, keep: float) -> None:
    probe = Probe()
    out_dir = work / f"out_{keep:g}"
    argv = spcli_argv(work, scale, keep, out_dir)
    from spcli.cli import main

    sys.argv = ["spcli", *argv]
    t0 = time.perf_counter()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    result = {"keep": keep, "exit": code, "wall_s": time.perf_counter() - t0, "argv": argv,
              "rows": read_rows(out_dir), "speculator_calls": probe.calls, "process_peak_bytes": probe.process_peak()}
    if keep < 1 and code == 0:
        try:
            result["profile"] = profile_speculator(work, scale)
        except Exception as e:  # the run's numbers stand without it; the step fails
            result["profile_error"] = f"{type(e).__name__}: {e}"
    write_json(work / f"run_{keep:g}.json", result)
    sys.exit(code or ("profile_error" in result))


if __name__ == "__main__":
    run_step(Path(sys.argv[1]), SCALES[sys.argv[2]], float(sys.argv[3]))
