"""`spcli plan` against hand calculations written out here (not calling spcli.plan's helpers).

llama-405b-fp8 + llama-8b on 8 x 80 GiB (the presets' shipped configs: no weights here), and the
real smollm2-135m folder (config.json + safetensors headers) on one 16 GiB GPU.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from spcli.cli import app
from spcli.config.scoring import ScoreConfig
from spcli.errors import ConfigError
from spcli.plan.plan import PlanConfig, make_plan

GPU_80 = 80 * 2**30  # --gpu-memory 80 (GiB) = 85,899,345,920 B

# Llama-3.1-405B: 126 layers, h 16384, 128 heads, 8 KV heads, D 128, I 53248, V 128256, untied
L405_LAYER_MATMULS = 16384 * 16384 + 2 * 16384 * 1024 + 16384 * 16384 + 3 * 16384 * 53248  # q, k+v, o, MLP
L405_EMBED = 128256 * 16384  # embed_tokens; lm_head is the same size
# Llama-3.1-8B: 32 layers, h 4096, 32 heads, 8 KV heads, D 128, I 14336
L8_LAYER_MATMULS = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336


def hand_405b_plan():
    """Every number of the 405B/8B plan at n = 32768, keep 0.1, batch 16, by hand."""
    assert L405_LAYER_MATMULS == 3_187_671_040
    assert 126 * (L405_LAYER_MATMULS + 2 * 16384) + 2 * L405_EMBED + 16384 == 405_853_388_800  # Meta's count
    # Weights per GPU: matmuls 1 B (fp8), embeddings + LM head 2 B, split over 8; norms 2 B on each GPU.
    weights = (126 * L405_LAYER_MATMULS * 1 + 2 * L405_EMBED * 2) // 8 + (2 * 126 + 1) * 16384 * 2
    # The 8B speculator, paper's recipe (look-ahead 8, all 32 layers, one prompt row: R = 9), prompts up to
    # --max-prompt-len 32768 (= the batched pass's 32768 tokens), chunks of 8192 tokens.
    reserve = (8_030_261_248 * 2  # weights, bf16
               + 2 * 32 * 8 * 128 * (32768 + 8) * 2  # the cache, all layers
               + 2 * 32 * 128 * 32768 * 2  # one layer's K, V repeated to 32 heads
               + 32 * 32 * 9 * 128 * 2  # query rows
               + 32768 * (3 * 14336 + 4 * 4096) * 2  # one chunk of 8192 columns across a group's 4 rows
               + 2**24 * (1 + 2)  # one block of the chunk's mask (2^24 of its 8192 x 32768): booleans + a bf16 copy
               + 2 * 32 * 9 * 32768 * 4  # scoring, fp32
               + 2**30)  # CUDA context
    util = math.floor(100 * (GPU_80 - reserve) / GPU_80) / 100
    kv_bytes = int(util * GPU_80) - weights - 3 * 10**9
    kv_tokens = kv_bytes // (64_512 * 16) * 16
    return dict(weights=weights, reserve=reserve, util=util, kv_bytes=kv_bytes, kv_tokens=kv_tokens)


def hand_405b_flops():
    n, m = 32768, 3277  # ceil(0.1 * 32768)
    full = 2 * 126 * L405_LAYER_MATMULS * n + 2 * 126 * 128 * 128 * n * (n + 1) + 2 * 128256 * 16384
    pruned = 2 * 126 * L405_LAYER_MATMULS * m + 2 * 126 * 128 * 128 * m * (m + 1) + 2 * 128256 * 16384
    spec = (2 * 32 * L8_LAYER_MATMULS * n + 2 * 32 * 32 * 128 * n * (n + 1)  # prefill, every layer
            + 8 * (2 * 32 * L8_LAYER_MATMULS + 4 * 32 * 32 * 128 * n)  # 8 look-ahead tokens over n keys
            + 9 * 2 * 128256 * 4096  # LM head: the prompt's last row + 8 steps
            + 2 * 32 * 32 * 9 * 128 * n)  # scoring: q.k for 9 rows at 32 layers
    driver = 16 * full / (16 * pruned + 8 * 16 * spec)  # GPU 0 runs all 16 while 7 GPUs wait
    workers = 16 * full / (16 * pruned + 8 * 2 * spec)  # each rank runs 2 of the 16
    return full, pruned, spec, driver, workers


def test_405b_fp8_with_an_8b_speculator_on_8_h100():
    hand = hand_405b_plan()
    p = make_plan(PlanConfig(model="llama-405b-fp8", tp=8, gpu_memory_gib=80, length=32768, keep=0.1, batch=16,
                             max_prompt_len=32768))
    # The 50.6 GB counts 405e9 params at 1 B. Exactly: all 405.85e9 at 1 B, plus the second byte of
    # the bf16 embeddings and LM head (split over 8), plus the norms held whole (2 B) on every GPU.
    assert round(405e9 * 1 / 8 / 1e9, 1) == 50.6
    norms = (2 * 126 + 1) * 16384
    assert hand["weights"] == 405_853_388_800 // 8 + 2 * L405_EMBED // 8 + (norms * 2 - norms // 8)
    assert p.base_weights == hand["weights"] == 51_264_782_336  # 51.26 GB
    assert p.kv_per_token == 126 * 2 * 1 * 128 * 2 == 64_512  # one KV head per GPU at tp 8
    assert p.reserve.total == hand["reserve"] and round(hand["reserve"] / 1e9, 2) == 25.99
    assert p.gpu_memory_utilization == hand["util"] == 0.69
    assert p.kv_bytes == hand["kv_bytes"] and p.kv_tokens == hand["kv_tokens"] == 77_584
    assert p.prompts_at_once == 77_584 // (3277 + 64) == 23 and p.full_prompts_at_once == 2
    fp8 = make_plan(PlanConfig(model="llama-405b-fp8", length=32768, kv_cache_dtype="fp8", max_prompt_len=32768))
    assert fp8.kv_per_token == 32_256 and fp8.kv_tokens == hand["kv_bytes"] // (32_256 * 16) * 16


def test_405b_speedup_limit_for_both_placements():
    full, pruned, spec, driver, workers = hand_405b_flops()
    p = make_plan(PlanConfig(model="llama-405b-fp8", tp=8, gpu_memory_gib=80, length=32768, keep=0.1, batch=16))
    by = {lim.placement: lim for lim in p.limits}
    assert (by["driver"].full_flops, by["driver"].pruned_flops, by["driver"].speculator_flops) == (16 * full, 16 * pruned, 16 * spec)
    assert by["driver"].limit == pytest.approx(driver, rel=1e-12) and round(driver, 2) == 3.58
    assert by["workers"].limit == pytest.approx(workers, rel=1e-12) and round(workers, 2) == 9.00
    assert round(spec / full, 3) == 0.024  # the speculator's FLOP share


def test_smollm2_from_its_folder_on_one_gpu(smollm2_dir):
    """The real config.json and safetensors headers: 30 layers, h 576, 9 heads, 3 KV heads, D 64, I 1536,
    V 49152, tied embeddings (one copy stored). self: layers 0-14, window 32, scored at layer 14."""
    layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536 + 2 * 576  # matmuls + 2 norms
    params = 49152 * 576 + 30 * layer + 576
    assert params == 134_515_008
    spec_params = 49152 * 576 + 15 * layer + 576
    n, t = 8192, 32768  # prompts up to max_position_embeddings 8192; one batched pass holds up to 32768 tokens
    reserve = (spec_params * 2 + 2 * 15 * 3 * 64 * t * 2 + 2 * 9 * 64 * t * 2 + 1 * 9 * 32 * 64 * 2
               + 32768 * (3 * 1536 + 4 * 576) * 2 + 2**24 * (1 + 2) + 2 * 9 * 32 * n * 4 + 2**30)  # 4 rows x 8192
    total = 16 * 2**30
    util = math.floor(100 * (total - reserve) / total) / 100
    kv_bytes = int(util * total) - params * 2 - 3 * 10**9

    p = make_plan(PlanConfig(model="smollm2-135m", gpu_memory_gib=16, length=4096, keep=0.1, batch=4,
                             score=ScoreConfig(lookahead=0, window=32, score_layers="14")))
    assert p.base.source == str(smollm2_dir / "config.json") and p.tp == 1
    assert p.base.num_params == params and p.speculator.num_params == spec_params
    assert p.base_weights == params * 2 and p.kv_per_token == 30 * 2 * 3 * 64 * 2 == 23_040
    assert p.reserve.total == reserve and p.gpu_memory_utilization == util == 0.87
    assert p.kv_tokens == kv_bytes // (23_040 * 16) * 16
    lm, m = 2 * 49152 * 576, 410
    matmuls = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    full = 2 * 30 * matmuls * 4096 + 2 * 30 * 9 * 64 * 4096 * 4097 + lm
    pruned = 2 * 30 * matmuls * m + 2 * 30 * 9 * 64 * m * (m + 1) + lm
    spec = 2 * 15 * matmuls * 4096 + 2 * 15 * 9 * 64 * 4096 * 4097 + 2 * 1 * 9 * 32 * 64 * 4096  # no LM head
    for lim in p.limits:  # one GPU: driver and workers are the same
        assert lim.limit == pytest.approx(full / (pruned + spec), rel=1e-12)


def test_plan_cli_prints_the_numbers():
    res = CliRunner().invoke(app, ["plan", "--model", "llama-405b-fp8", "--tp", "8", "--gpu-memory", "80",
                                   "--length", "32768", "--keep", "0.1", "--batch", "16", "--max-prompt-len", "32768"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for expected in (
        "GPUs        8 x 80 GiB = 85.90 GB each (GB = 10^9 B)",
        "  gpu_memory_utilization             0.69   floor(100 x (85.90 - 25.99) / 85.90) / 100, at most 0.9; "
        "one value for every rank",
        "  KV per token                   64,512 B   126 layers x 2 (K, V) x 1 KV heads x 128 x 2 B (bfloat16)",
        "  KV capacity               77,584 tokens   whole blocks of 16",
        "  prompts at once                      23   at keep 0.1, 3341 tokens each; full prefill 2 (32832 each)",
        "  speculator reserve             25.99 GB   weights 16.06, kv 4.30, repeated_kv 0.54, activations 3.89, mask "
        "0.05, scoring 0.08, context 1.07; prompts up to 32768 (--max-prompt-len), chunk 8192",
        "  placement driver                  3.58x   full / (pruned + 8 x speculator): it runs on GPU 0 alone while "
        "7 GPUs wait",
        "  placement workers                 9.00x   full / (pruned + 1 x speculator): each of 8 ranks scores 2 of "
        "the 16 prompts",
    ):
        assert expected in lines, f"{expected!r} not in:\n{res.output}"
    assert any(line.startswith("  base weights                   51.26 GB   405.85e9 params") for line in lines)
    one = CliRunner().invoke(app, ["plan", "--placement", "workers", "--kv-cache-dtype", "fp8"])
    assert one.exit_code == 0 and not any(line.startswith("  placement driver") for line in one.output.splitlines())
    assert "  KV per token                   32,256 B   126 layers x 2 (K, V) x 1 KV heads x 128 x 1 B (fp8)" in one.output


def test_keep_one_runs_no_speculator():
    p = make_plan(PlanConfig(model="llama-70b", keep=1.0))
    assert p.reserve is None and p.gpu_memory_utilization == 0.9 and p.limits == ()
    assert p.base_weights == (80 * 8192 * (2 * 8192 + 2 * 1024 + 3 * 28672) + 2 * 128256 * 8192) * 2 // 8 + 161 * 8192 * 2


def test_bad_plans_are_refused_with_the_flag_named():
    for kw, match in ((dict(placement="gpu0"), "--placement"), (dict(kv_cache_dtype="int4"), "--kv-cache-dtype"),
                      (dict(keep=0.0), "--keep"), (dict(speculator_chunk=0), "--speculator-chunk")):
        with pytest.raises(ConfigError, match=match):
            PlanConfig(**kw)
    # the default --max-prompt-len: the longest (in steps of 1024) whose reserve leaves one 32768-token request room
    assert make_plan(PlanConfig(length=53248)).max_prompt_len == 53248
    with pytest.raises(ConfigError, match="--length 65536 exceeds max_prompt_len 53248: pass --max-prompt-len"):
        make_plan(PlanConfig(length=65536))
    with pytest.raises(ConfigError, match="needs 32832 KV tokens per request .* beyond max_model_len 32768"):
        make_plan(PlanConfig(length=32768, keep=1.0))
    with pytest.raises(ConfigError, match="transformers cannot run its quantized layers"):
        make_plan(PlanConfig(speculator="self:8", score=ScoreConfig(lookahead=0, window=32, score_layers="7")))
    long = CliRunner().invoke(app, ["plan", "--max-model-len", "131072"])  # the 8B's cache for 131072 tokens: 17.2 GB
    assert long.exit_code == 0 and "  DOES NOT FIT: max_model_len 131,072 > KV capacity 0 tokens" in long.output
    res = CliRunner().invoke(app, ["plan", "--tp", "3"])
    assert isinstance(res.exception, ConfigError) and "--tp 3 does not divide" in str(res.exception)


def test_a_part_wheel_preset_is_planned_from_its_built_folder(tmp_path, monkeypatch, tiny_dir):
    """qwen2.5-coder-1.5b (built by `make models-qwen` into the model cache) is read from that folder, as
    `spcli run` finds it; before it is built the error says how to build it."""
    import shutil

    from spcli.errors import ModelError
    from spcli.models.lookup import preset_folder

    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="make models-qwen"):
        make_plan(PlanConfig(model="qwen2.5-coder-1.5b", speculator="self", length=1024, keep=0.1, batch=1))
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        shutil.copytree(tiny_dir, preset_folder(name))
    # the preset scores the 0.5B at its layer 7: the stand-in speculator needs the 0.5B's 24 layers
    config_path = preset_folder("qwen2.5-coder-0.5b") / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "num_hidden_layers": 24}))
    p = make_plan(PlanConfig(model="qwen2.5-coder-1.5b", length=1024, keep=0.1, batch=1))
    assert p.base.source == str(preset_folder("qwen2.5-coder-1.5b") / "config.json")
    assert p.speculator.source == str(preset_folder("qwen2.5-coder-0.5b") / "config.json")
