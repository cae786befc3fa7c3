"""spcli/models/dtype.py: `--dtype auto` per device, and what a run records and says about it."""

from __future__ import annotations

import dataclasses
import json

import torch
from typer.testing import CliRunner

from spcli.cli import app
from spcli.models.dtype import CPU_DTYPE, CPU_FEATURES, cpu_features, cpu_flags, cpu_has_amx, resolve_dtype
from test_job_run import ARGS, prompt_rows

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_auto_picks_per_device():
    assert resolve_dtype("auto", "smollm2-135m", CUDA) == ("bfloat16", "auto: the model's dtype on cuda")
    assert resolve_dtype(None, "smollm2-135m", CUDA)[0] == "bfloat16"  # None is auto
    dtype, why = resolve_dtype("auto", "smollm2-135m", CPU, has_amx=False)
    assert dtype == "float32" and "no AMX" in why and "bfloat16 is slower than float32" in why
    dtype, why = resolve_dtype("auto", "smollm2-135m", CPU, has_amx=True)
    assert dtype == "bfloat16" and "AMX" in why
    assert resolve_dtype("auto", "/some/folder", CPU, has_amx=False)[0] == "float32"  # a folder: bfloat16 by default


# first lines of /proc/cpuinfo on three CPUs (flags cut to the ones that matter and a few others)
SAPPHIRE_RAPIDS = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
HASWELL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 fma avx2\n"


def test_cpu_features_come_from_the_flags_and_torchs_amx_probe():
    assert cpu_features(cpu_flags(SAPPHIRE_RAPIDS), has_amx=True) == ("amx", "avx512_bf16", "avx2")
    assert cpu_features(cpu_flags(ZEN4), has_amx=False) == ("avx512_bf16", "avx2")
    assert cpu_features(cpu_flags(HASWELL), has_amx=False) == ("avx2",)
    assert cpu_features(cpu_flags(""), has_amx=False) == ()  # no flags line (another architecture)
    # AMX is what torch's dispatch sees (vLLM's CPU kernels ask the same probe), not the flag alone
    assert cpu_features(cpu_flags(SAPPHIRE_RAPIDS), has_amx=False) == ("avx512_bf16", "avx2")
    assert ("amx" in cpu_features()) == cpu_has_amx()  # this machine
    assert set(cpu_features()) <= set(CPU_FEATURES)


def test_the_cpu_rule_per_engine_and_feature():
    """The measured table (docs/results/dtype.md): the model's bf16 only with AMX, float32 below it, both engines."""
    for engine in ("hf", "vllm"):
        for flags, amx, want in ((SAPPHIRE_RAPIDS, True, "bfloat16"), (ZEN4, False, "float32"),
                                 (HASWELL, False, "float32"), ("", False, "float32")):
            features = cpu_features(cpu_flags(flags), has_amx=amx)
            dtype, why = resolve_dtype("auto", "smollm2-135m", CPU, engine=engine, features=features)
            assert dtype == want, (engine, features)
            name = {"hf": "transformers", "vllm": "vLLM"}[engine]
            assert ("AMX" in why) and (want == "bfloat16" or f"in {name}" in why), why
        assert resolve_dtype("auto", "smollm2-135m", CUDA, engine=engine)[0] == "bfloat16"  # any GPU: the model's
    assert "has AVX512-BF16 but no AMX" in resolve_dtype("auto", "smollm2-135m", CPU, features=("avx512_bf16", "avx2"))[1]
    assert "has no AMX" in resolve_dtype("auto", "smollm2-135m", CPU, features=())[1]
    assert set(CPU_DTYPE) == {"hf", "vllm"} and all(set(t) == {*CPU_FEATURES, None} for t in CPU_DTYPE.values())
    # the vllm engine loads its speculator in its base's dtype, and the fingerprint records one dtype: rows that
    # differ need both made per engine first (spcli/engines/vllm/driver/engine.py, spcli/job/run.py)
    assert CPU_DTYPE["hf"] == CPU_DTYPE["vllm"]


def test_a_given_dtype_wins_everywhere():
    for device, amx in ((CPU, False), (CPU, True), (CUDA, None)):
        assert resolve_dtype("bfloat16", "smollm2-135m", device, has_amx=amx) == ("bfloat16", "--dtype")
    assert resolve_dtype("float16", "llama-8b", CUDA) == ("float16", "--dtype")


def test_this_machine_answers_what_torch_sees():
    assert resolve_dtype("auto", "smollm2-135m", CPU)[0] == ("bfloat16" if cpu_has_amx() else "float32")
    for engine in ("hf", "vllm"):
        assert resolve_dtype("auto", "smollm2-135m", CPU, engine=engine) == resolve_dtype(
            "auto", "smollm2-135m", CPU, engine=engine, features=cpu_features())


def test_run_banner_and_fingerprint_carry_the_resolved_dtype(tmp_path, tiny_dir, write_jsonl):
    src = write_jsonl(prompt_rows(2))
    out = tmp_path / "out"
    args = [a for a in ARGS if a not in ("--dtype", "float32")]  # the default: auto
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--device", "cpu", *args])
    assert res.exit_code == 0, res.output
    want, why = resolve_dtype("auto", str(tiny_dir), CPU)
    assert f"INFO model: {tiny_dir}, {want} ({why})" in res.output.splitlines()
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["fingerprint_fields"]["dtype"] == want and doc["config"]["dtype"] == want
    # a directory made with the other dtype is refused, naming the change (README: the upgrade note)
    other = "bfloat16" if want == "float32" else "float32"
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(tiny_dir), "--device", "cpu",
                                   *args, "--dtype", other, "--max-tokens", "5"])
    assert f"dtype: '{want}' -> '{other}'" in str(res.exception), res.output


def test_the_speculators_dtype_per_device_and_cpu():
    from spcli.models.dtype import resolve_speculator_dtype as spec

    assert spec("auto", "bfloat16", CUDA)[0] == "bfloat16"  # an accelerator: the run's
    assert spec(None, "float32", CUDA)[0] == "float32"
    assert spec("auto", "float32", CPU, features=("avx512_bf16", "avx2"))[0] == "bfloat16"
    assert spec("auto", "float32", CPU, features=("amx", "avx512_bf16", "avx2"))[0] == "bfloat16"
    assert spec("auto", "float32", CPU, features=("avx2",)) == (
        "float32", "auto: the run's dtype (this CPU has no native bf16 matmul)")
    assert spec("auto", "float32", CPU, features=())[0] == "float32"
    assert spec("auto", "float16", CPU, features=("avx512_bf16",))[0] == "float16"  # only a float32 run changes
    assert spec("float32", "float32", CPU, features=("amx",)) == ("float32", "--speculator-dtype")
    assert spec("bfloat16", "float32", CUDA) == ("bfloat16", "--speculator-dtype")


def _specs_dtypes(out):
    doc = json.loads((out / "manifest.json").read_text())
    return doc["fingerprint_fields"].get("speculator_dtype"), doc["config"]["speculator_dtype"]


def test_a_bf16_speculator_beside_a_float32_base_is_said_recorded_and_resumed(tmp_path, tiny_dir, write_jsonl):
    """--speculator-dtype bfloat16 under --dtype float32: the banner says it, the fingerprint records it (a directory
    scored in float32 is refused it), and auto resumes a directory as its rows were scored."""
    from spcli.engines.hf.engine import HFEngine
    from spcli.models.resolved import resolve_run
    from spcli.api import run_config

    src = write_jsonl(prompt_rows(3))
    out = tmp_path / "bf16"
    base = ["run", str(src), "--model", str(tiny_dir), "--device", "cpu", *ARGS]
    res = CliRunner().invoke(app, [*base, "--out", str(out), "--speculator-dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    assert any(ln.startswith("INFO speculator: self:2") and ", bfloat16 (--speculator-dtype)" in ln
               for ln in res.output.splitlines()), res.output
    assert _specs_dtypes(out) == ("bfloat16", "bfloat16")
    # the engine's speculator is its own bf16 copy of the base's first layers; the base stays float32
    engine = HFEngine(resolve_run(run_config([str(src)], str(tmp_path / "x"), model=str(tiny_dir), device="cpu",
                                             speculator="self:2", dtype="float32", speculator_dtype="bfloat16")))
    assert next(engine.stack.speculator.parameters()).dtype == torch.bfloat16
    assert next(engine.stack.base.parameters()).dtype == torch.float32
    # a stack copied with another self:K (eval's compared speculators) runs it in bf16 too: its own copy of 1 layer
    other = dataclasses.replace(engine.stack, speculator_name="self:1", _speculator=None, speculator_layers=None)
    assert next(other.speculator.parameters()).dtype == torch.bfloat16
    assert other.speculator.config.num_hidden_layers == 1 and other.speculator_dtype_used == "bfloat16"
    # scored in float32 (the flag given): no field, as directories made before the flag
    old = tmp_path / "f32"
    res = CliRunner().invoke(app, [*base, "--out", str(old), "--speculator-dtype", "float32"])
    assert res.exit_code == 0, res.output
    assert _specs_dtypes(old) == (None, "float32")
    # refused the other dtype, naming it
    res = CliRunner().invoke(app, [*base, "--out", str(old), "--speculator-dtype", "bfloat16", "--max-tokens", "4"])
    assert "speculator_dtype" in str(res.exception), res.output
    # auto on it: float32, as its rows were scored, on any CPU (here a finished directory: nothing to do, not refused)
    res = CliRunner().invoke(app, [*base, "--out", str(old)])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    from spcli.job.manifest import speculator_dtype_for

    auto = resolve_run(run_config([str(src)], str(old), model=str(tiny_dir), device="cpu", speculator="self:2",
                                  dtype="float32"))
    if auto.speculator_dtype == "bfloat16":  # this CPU multiplies bf16 natively
        assert speculator_dtype_for(auto, old, None).speculator_dtype == "float32"
        assert speculator_dtype_for(auto, out, None).speculator_dtype == "bfloat16"
