"""vLLM arguments and the speculator's GPU share (spcli/engine/vllm_args.py): pure, no vLLM needed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from spcli.config import RunConfig, ScoreConfig, VllmConfig
from spcli.engine import vllm_args
from spcli.engine.vllm_args import GiB, SpeculatorShape, engine_args, gpu_memory_utilization, speculator_reserve_bytes
from spcli.errors import ConfigError

# Llama-3.1-8B-Instruct (config.json of meta-llama/Llama-3.1-8B-Instruct; 8,030,261,248 parameters).
LLAMA_8B = SpeculatorShape(num_params=8_030_261_248, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                           hidden_size=4096, intermediate_size=14336)
H100_BYTES = 81559 * (1 << 20)  # nvidia-smi's total for an H100 80GB SXM


def run_config(**kw) -> RunConfig:
    return RunConfig(inputs=("in.jsonl",), out="out", **kw)


def test_reserve_of_an_8b_speculator_for_a_32k_prompt():
    n, a, b = 32768, 8, 2
    terms = {
        "weights": 8_030_261_248 * b,  # 16.06 GB
        "kv": 2 * 32 * 8 * 128 * (n + a) * b,  # 128 KiB per token: 4.30 GB
        "activations": n * (3 * 14336 + 4 * 4096) * b,  # 3.89 GB
        "queries": 32 * 32 * (a + 1) * 128 * b,  # the scored rows of every layer, copies: 9.4 MB
        "mask": n * n,  # 1.07 GB
        "scoring": 2 * 32 * (a + 1) * n * 4,  # 0.08 GB
        "context": GiB,
    }
    reserve = speculator_reserve_bytes(LLAMA_8B, n, ScoreConfig(lookahead=a, window=0, score_layers="all"), b)
    assert reserve == sum(terms.values())
    assert round(reserve / 1e9, 1) == 26.5  # the docstring's number
    assert gpu_memory_utilization(H100_BYTES, reserve) == 0.69  # floor((85.52 - 26.48) / 85.52, 2)
    assert gpu_memory_utilization(H100_BYTES, 2 * GiB) == 0.9  # vLLM's default caps it


def test_reserve_of_an_early_exit_speculator_holds_only_the_scored_layer():
    """Window 32, layer 13 of 32, no look-ahead (GemFilter's Llama-3.1-8B layer), first 14 layers loaded."""
    n, b = 32768, 2
    shape = dataclasses.replace(LLAMA_8B, num_layers=14, num_params=LLAMA_8B.num_params * 14 // 32)
    reserve = speculator_reserve_bytes(shape, n, ScoreConfig(lookahead=0, window=32, score_layers="13"), b)
    kv = 3 * 8 * 128 * n * b  # keys of the one scored layer + one layer's k, v in flight: 0.2 GB, not 4.3
    assert reserve == (shape.num_params * b + kv + 32 * 32 * 128 * b + n * (3 * 14336 + 4 * 4096) * b + n * n
                       + 2 * 32 * 32 * n * 4 + GiB)
    full = speculator_reserve_bytes(LLAMA_8B, n, ScoreConfig(lookahead=8, window=0, score_layers="all"), b)
    assert reserve < 0.6 * full


def test_a_speculator_that_leaves_too_little_is_refused():
    with pytest.raises(ConfigError, match="leaving too little for the base model: lower --max-model-len"):
        gpu_memory_utilization(16 * GiB, 15 * GiB)


def test_speculator_shape_is_read_from_the_folder(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = SpeculatorShape.from_folder(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (3, 4, 2, 16)
    first = SpeculatorShape.from_folder(tiny_dir, num_layers=1)  # self:1 on vLLM loads layer 0 only
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert first.num_layers == 1 and first.num_params == shape.num_params - 2 * per_layer
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no \\*.safetensors files.*--gpu-memory-utilization"):
        SpeculatorShape.from_folder(tmp_path)


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
    import spcli.run

    seen = {}

    def fake_run(cfg, progress):
        seen["cfg"] = cfg
        raise ConfigError("stop here")

    monkeypatch.setattr(spcli.run, "run", fake_run)
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
