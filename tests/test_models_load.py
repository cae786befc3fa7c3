"""The one loader (spcli/models/load.py): a sliding-window speculator is refused at load time."""

from __future__ import annotations

import pytest
import torch

from spcli.models import load

from spcli.models import positions

from spcli.models import files
from spcli.errors import ConfigError


def build_tiny_mistral(dest, tokenizer_dir, sliding_window):
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                           sliding_window=sliding_window, eos_token_id=2, bos_token_id=1)
    MistralForCausalLM(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    return dest


def test_sliding_window_self_speculator_is_refused_naming_the_field(tmp_path, smollm2_dir):
    path = build_tiny_mistral(tmp_path / "mistral", smollm2_dir, sliding_window=256)
    with pytest.raises(ConfigError, match=r"config.json sliding_window = 256 < the 4096 positions"):
        load.load_stack(str(path), "self:1", "float32", "cpu", with_base=False)
    stack = load.load_stack(str(path), "self:1", "float32", "cpu", with_base=False, needs_speculator=False)
    with pytest.raises(ConfigError, match="sliding-window attention"):  # and on first use
        stack.speculator


def test_a_window_no_prompt_can_exceed_is_accepted(tmp_path, smollm2_dir):
    path = build_tiny_mistral(tmp_path / "mistral", smollm2_dir, sliding_window=4096)
    stack = load.load_stack(str(path), "self:1", "float32", "cpu")
    assert stack.speculator.config.num_hidden_layers == 1


def test_full_attention_model_passes(tiny_dir):
    positions.check_full_attention(files.read_config(tiny_dir), 4096, "tiny", "speculator")


def test_an_engine_bound_on_prompt_length_is_an_error_row_naming_its_flag(tiny_dir):
    """vLLM sizes the speculator's GPU share for max_model_len-token prompts: a longer one is refused as an
    error row naming that limit and the flag that raises it, before anything runs out of memory."""
    from spcli.config.run import RunConfig
    from spcli.config.scoring import SelectConfig
    from spcli.stages.prepare import request_for
    from spcli.errors import RecordError
    from spcli.io.records import Record

    stack = load.load_stack(str(tiny_dir), "self:2", "float32", "cpu", with_base=False)
    cfg = RunConfig(inputs=("x",), out="x", select=SelectConfig(chunk=8))  # resolved, as run passes it
    rec = Record(0, 0, "r", prompt="word " * 300)
    assert request_for(rec, cfg, stack).num_prompt_tokens > 200
    stack = load.open_stack(files.read_base(tiny_dir), str(tiny_dir), "self:2", "float32", torch.device("cpu"),
                            with_base=False, max_prompt_len=200,
                            prompt_len_flag="--max-model-len (it sizes the speculator's share of the GPU)")
    with pytest.raises(RecordError) as e:
        request_for(rec, cfg, stack)
    assert str(e.value).endswith(
        "more than the 200 allowed (the speculator's memory plan is sized for 200-token prompts; raise "
        "--max-model-len (it sizes the speculator's share of the GPU)); use --truncate left|middle to cut it")


@pytest.mark.parametrize("config_kwargs, reason", [
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
     "uses longrope"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "uses longrope"),
    ({"model_type": "bloom"}, "uses ALiBi"),
    ({"model_type": "falcon", "alibi": True}, "uses ALiBi"),
    ({"model_type": "mpt", "attn_config": {"alibi": True}}, "uses ALiBi"),
])
def test_longrope_and_alibi_speculators_are_refused_naming_model_and_reason(config_kwargs, reason):
    """Issue 40: positions scoring and kept-position prefill cannot reproduce are refused before anything loads."""
    from types import SimpleNamespace as PretrainedConfig  # config.json's fields as attributes; no validation

    with pytest.raises(ConfigError, match=rf"speculator 'odd-model' {reason}"):
        positions.check_full_attention(PretrainedConfig(**config_kwargs), 4096, "odd-model", "speculator")


@pytest.mark.parametrize("config_kwargs", [{"model_type": "llama"},
                                           {"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                                           {"model_type": "falcon", "alibi": False}])
def test_plain_llama3_rope_and_rope_falcon_pass(config_kwargs):
    from types import SimpleNamespace as PretrainedConfig  # config.json's fields as attributes; no validation

    positions.check_full_attention(PretrainedConfig(**config_kwargs), 4096, "ok-model", "speculator")


def test_a_sliding_window_base_is_refused_before_anything_loads_unless_nothing_is_pruned(tmp_path, smollm2_dir):
    """Issue 40: the base prefills kept tokens at their positions; a window over the cache counts kept tokens, so a
    pruned prompt would attend further back than its full prefill. Refused by the one resolved run (both engines,
    before vLLM is imported); keep 1.0 prunes nothing and runs."""
    from spcli.config.run import RunConfig
    from spcli.config.scoring import SelectConfig
    from spcli.models.resolved import resolve_run

    path = str(build_tiny_mistral(tmp_path / "mistral", smollm2_dir, sliding_window=256))
    for engine in ("hf", "vllm"):
        cfg = RunConfig(inputs=("x",), out="x", model=path, speculator="self:1", engine=engine, device="cpu",
                        select=SelectConfig(keep=0.3))
        with pytest.raises(ConfigError, match=r"base model '.*mistral' uses sliding-window attention \(config.json "
                                              r"sliding_window = 256 < the 4096 positions"):
            resolve_run(cfg)
    whole = RunConfig(inputs=("x",), out="x", model=path, engine="hf", device="cpu", select=SelectConfig(keep=1.0))
    assert resolve_run(whole).model_path.name == "mistral"


@pytest.mark.parametrize("config_kwargs, reason", [
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
     "uses longrope"),
    ({"model_type": "bloom"}, "uses ALiBi"),
    ({"model_type": "mistral", "sliding_window": 512}, "uses sliding-window attention"),
])
def test_base_models_whose_positions_pruning_cannot_keep_are_refused(config_kwargs, reason):
    from types import SimpleNamespace as PretrainedConfig  # config.json's fields as attributes; no validation

    with pytest.raises(ConfigError, match=rf"base model 'odd-base' {reason}"):
        positions.check_base_positions(PretrainedConfig(**config_kwargs), 4096, "odd-base")
    positions.check_base_positions(PretrainedConfig(model_type="mistral", sliding_window=4096), 4096, "ok-base")
    positions.check_base_positions(PretrainedConfig(model_type="qwen2", sliding_window=512, use_sliding_window=False),
                              4096, "ok-base")
