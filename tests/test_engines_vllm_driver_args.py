"""vLLM arguments (spcli/engines/vllm/driver/args.py): pure, no vLLM needed. The speculator's GPU share: test_plan_memory.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spcli.config.run import RunConfig, VllmConfig
from spcli.engines.vllm.driver import args as vllm_args
from spcli.engines.vllm.driver.args import engine_args
from spcli.errors import ConfigError


def run_config(**kw) -> RunConfig:
    return RunConfig(inputs=("in.jsonl",), out="out", **kw)


def test_presets_map_to_vllm_arguments(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    args = engine_args(run_config(model="llama-405b-fp8"), tmp_path, is_cpu=False)
    assert args["tensor_parallel_size"] == 8 and args["max_model_len"] == 32768 and args["dtype"] == "bfloat16"
    assert args["engine_kwargs"] == {"quantization": "fp8"}  # a bf16 checkpoint: vLLM quantizes on load
    assert "gpu_memory_utilization" not in args and args["enforce_eager"] is False
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fbgemm_fp8"}}))
    assert engine_args(run_config(model="llama-405b-fp8"), tmp_path, False)["engine_kwargs"] == {}  # vLLM reads it

    args = engine_args(run_config(model="llama-70b"), tmp_path, is_cpu=False)
    assert (args["tensor_parallel_size"], args["max_model_len"], args["engine_kwargs"]) == (8, 65536, {})
    args = engine_args(run_config(model=str(tmp_path), dtype="float32"), tmp_path, is_cpu=True)
    assert (args["tensor_parallel_size"], args["max_model_len"], args["dtype"], args["enforce_eager"]) == (1, None, "float32", True)


def test_flags_override_the_preset(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    v = VllmConfig(tp=4, max_model_len=8192, gpu_memory_utilization=0.5, max_num_batched_tokens=64, enforce_eager=False)
    args = engine_args(run_config(model="llama-405b-fp8", vllm=v), tmp_path, is_cpu=True)
    assert (args["tensor_parallel_size"], args["max_model_len"], args["gpu_memory_utilization"]) == (4, 8192, 0.5)
    assert (args["max_num_batched_tokens"], args["enforce_eager"]) == (64, False)


def test_vllm_config_is_validated_and_not_fingerprinted():
    for bad, match in ((dict(tp=0), "--tp"), (dict(max_model_len=0), "--max-model-len"),
                       (dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
                       (dict(max_num_batched_tokens=0), "--max-num-batched-tokens")):
        with pytest.raises(ConfigError, match=match):
            VllmConfig(**bad)
    plain, tuned = run_config(), run_config(vllm=VllmConfig(tp=8, max_model_len=4096, gpu_memory_utilization=0.7))
    assert plain.fingerprint_fields() == tuned.fingerprint_fields()
    assert tuned.to_dict()["vllm"]["tp"] == 8


def test_cli_flags_map_onto_vllm_config(monkeypatch):
    import spcli.job.run

    seen = {}

    def fake_run(cfg, progress):
        seen["cfg"] = cfg
        raise ConfigError("stop here")

    monkeypatch.setattr(spcli.job.run, "run", fake_run)
    res = CliRunner().invoke(__import__("spcli.cli", fromlist=["app"]).app, [
        "run", "in.jsonl", "--out", "o", "--engine", "vllm", "--tp", "2", "--max-model-len", "4096",
        "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "512", "--enforce-eager"])
    assert isinstance(res.exception, ConfigError), res.output
    assert seen["cfg"].vllm == VllmConfig(tp=2, max_model_len=4096, gpu_memory_utilization=0.8, max_num_batched_tokens=512,
                                          enforce_eager=True)


def test_cpu_defaults_bind_every_allowed_cpu(monkeypatch):
    monkeypatch.setattr(vllm_args.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    one = vllm_args.cpu_env_defaults(1)
    assert (one["VLLM_CPU_OMP_THREADS_BIND"], one["OMP_NUM_THREADS"]) == ("0,1,2,3", "4")
    assert one["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and one["VLLM_CPU_KVCACHE_SPACE"] == "2"
    two = vllm_args.cpu_env_defaults(2)
    assert (two["VLLM_CPU_OMP_THREADS_BIND"], two["OMP_NUM_THREADS"]) == ("0,1|2,3", "2")


def test_auto_dtype_follows_vllms_device_type(tmp_path):
    """--dtype auto: the model's dtype on CUDA; on the CPU build float32 unless the CPU has AMX, as spcli run
    resolves it for the fingerprint, so base and speculator replicas load the same dtype."""
    from spcli.models.dtype import cpu_has_amx

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    cfg = run_config(model="smollm2-135m", dtype="auto")
    assert engine_args(cfg, tmp_path, is_cpu=False)["dtype"] == "bfloat16"
    assert engine_args(cfg, tmp_path, is_cpu=True)["dtype"] == ("bfloat16" if cpu_has_amx() else "float32")
    assert engine_args(run_config(model="smollm2-135m", dtype="float16"), tmp_path, is_cpu=True)["dtype"] == "float16"
