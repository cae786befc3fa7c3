"""The random 8B/405B-ratio pair: FLOP ratio from the published configs, built once and cached."""

import json

import pytest

from spcli.models import random_pair as pair


def test_shape_flops_match_a_hand_count():
    s = pair.Shape(hidden=8, ffn=16, layers=2, heads=2, kv_heads=1, head_dim=4)
    q, kv = 8, 4
    per_layer = 2 * 8 * (2 * q + 2 * kv) + 6 * 8 * 16 + 2 * q * (10 + 1)
    assert s.flops_per_token(10) == 2 * per_layer


def test_llama_flops_are_about_twice_the_parameters():
    # 2 FLOPs per weight per token (no embeddings); attention adds ~1% at 2k for 405B
    assert pair.LLAMA_8B.flops_per_token(0) / 2 == pytest.approx(6.98e9, rel=0.01)
    assert pair.LLAMA_405B.flops_per_token(0) / 2 == pytest.approx(401.6e9, rel=0.01)


def test_pair_matches_the_8b_405b_ratio_at_the_bench_length():
    ours, target = pair.pair_ratio(pair.PAIR_LENGTH)
    assert target == pytest.approx(0.0179, abs=5e-4)
    assert ours == pytest.approx(target, rel=0.02)
    spec = pair.speculator_shape()
    assert spec.ffn % 16 == 0 and spec.layers < pair.BASE.layers


def test_ensure_pair_builds_once_under_spcli_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path))
    built = []

    def fake_build(dest, shape, tokenizer_dir, seed):
        dest.mkdir()
        (dest / "config.json").write_text(json.dumps({"hidden": shape.hidden}))
        built.append(shape)

    monkeypatch.setattr(pair, "_build", fake_build)
    monkeypatch.setattr(pair, "smollm2_gguf", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(pair, "convert_gguf", lambda gguf, dest: tmp_path / "tok")
    first = pair.ensure_pair()
    assert set(first) == {pair.BASE_NAME, pair.SPECULATOR_NAME}
    assert all(p.parent == tmp_path / "models" for p in first.values())
    assert [s.hidden for s in built] == [pair.BASE.hidden, pair.speculator_shape().hidden]
    assert pair.ensure_pair() == first and len(built) == 2  # cached: nothing rebuilt


def test_llama_config_carries_the_shape():
    c = pair._llama_config(pair.BASE, vocab_size=49152, eos_id=2)
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (1024, 3328, 6)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 2, 64)
