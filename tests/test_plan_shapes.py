"""Model shapes from configs and safetensors headers (spcli/plan/shapes.py, spcli/plan/configs.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from spcli.errors import ModelError
from spcli.plan.configs import SHIPPED, SHIPPED_CONFIGS, model_shape
from spcli.plan.memory import base_weight_bytes_per_gpu
from spcli.plan.shapes import ModelShape


@pytest.mark.parametrize("name, params", [
    ("llama-1b", 1_235_814_400), ("llama-8b", 8_030_261_248), ("llama-70b", 70_553_706_496),
    ("llama-405b-fp8", 405_853_388_800),
])
def test_shipped_configs_give_the_published_parameter_counts(name, params):
    shape = ModelShape.from_config(name, SHIPPED_CONFIGS[name], SHIPPED)
    assert shape.num_params == params


def test_smollm2_shipped_config_is_its_folders(smollm2_dir):
    real = json.loads((smollm2_dir / "config.json").read_text())
    assert {k: real[k] for k in SHIPPED_CONFIGS["smollm2-135m"]} == SHIPPED_CONFIGS["smollm2-135m"]
    from_folder = model_shape("smollm2-135m")  # the folder is here: config.json + headers
    shipped = ModelShape.from_config("smollm2-135m", SHIPPED_CONFIGS["smollm2-135m"], SHIPPED)
    assert from_folder.source.endswith("config.json") and dataclasses.replace(from_folder, source=SHIPPED) == shipped
    assert from_folder.num_params == shipped.num_params == 134_515_008  # tied: one embedding stored
    assert model_shape("llama-405b-fp8").source == SHIPPED  # no weights here
    for name, match in (("random-405b", "random-weight model"), ("no-such-model", "unknown model")):
        with pytest.raises(ModelError, match=match):
            model_shape(name)  # nothing is built or downloaded


def test_shape_is_read_from_the_folder(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = ModelShape.from_folder(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (3, 4, 2, 16)
    first = ModelShape.from_folder(tiny_dir, num_layers=1)  # self:1 on vLLM loads layer 0 only
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert first.num_layers == 1 and first.num_params == shape.num_params - 2 * per_layer
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="config.json has no 'num_attention_heads'"):
        ModelShape.from_folder(tmp_path)


def test_a_checkpoint_stored_in_fp8_counts_its_stored_bytes(tmp_path):
    """Headers, not the config, say what is stored: fp8 matmuls (+ their scales), bf16 embeddings and norms."""
    config = dict(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                  intermediate_size=16, vocab_size=32, quantization_config={"quant_method": "fbgemm_fp8"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    p = "model.layers.0."
    tensors = {"model.embed_tokens.weight": torch.zeros(32, 8, dtype=bf16), "lm_head.weight": torch.zeros(32, 8, dtype=bf16),
               "model.norm.weight": torch.zeros(8, dtype=bf16), p + "input_layernorm.weight": torch.zeros(8, dtype=bf16),
               p + "self_attn.q_proj.weight": torch.zeros(8, 8, dtype=fp8),
               p + "self_attn.q_proj.weight_scale": torch.zeros(8, 1, dtype=torch.float32),
               p + "mlp.up_proj.weight": torch.zeros(16, 8, dtype=fp8)}
    save_file(tensors, tmp_path / "model.safetensors")
    shape = ModelShape.from_folder(tmp_path)
    assert shape.is_quantized and shape.num_params == 2 * 256 + 16 + 64 + 8 + 128
    stored = 2 * 256 * 2 + 16 * 2 + 64 * 1 + 8 * 4 + 128 * 1
    assert base_weight_bytes_per_gpu(shape, 1, "fp8") == stored  # not quantized again
