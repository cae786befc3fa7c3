"""`--model FILE.gguf`: any GGUF file is converted once into the model cache (atomic, keyed by the file's
identity), then scores with the fallback for a model spcli has no preset for.

The GGUF file is a tiny random Llama written with the `gguf` package (2 layers, hidden 64, a 262-token
byte-level BPE; the real SmolLM2-135M GGUF has 30 layers, hidden 576 and 49,152 tokens), with its token
embedding quantized to Q8_0 so that dequantization runs."""

from tiny_models import ALWAYS_PRUNE
import json

import numpy as np
import pytest
import torch

from spcli.models import lookup


from spcli.models import profiles
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]


def byte_tokens() -> list[str]:
    """GPT-2's 256 byte-level symbols (bytes_to_unicode)."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = [], 0
    for b in range(256):
        if b in visible:
            codes.append(b)
        else:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


def write_tiny_gguf(path, seed=0):
    import gguf

    rng = np.random.default_rng(seed)
    tokens = SPECIAL + byte_tokens() + [m.replace(" ", "") for m in MERGES]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama for spcli tests")
    w.add_block_count(LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def tensor(name, *shape):  # gguf lists shapes innermost first; numpy arrays are [rows, cols]
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    embedding = (rng.standard_normal((len(tokens), HIDDEN)) * 0.05).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(embedding, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    tensor("output.weight", len(tokens), HIDDEN)
    kv = HIDDEN // HEADS * KV_HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        tensor(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, embedding


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPCLI_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_file_is_converted_once_into_the_cache(tmp_path, cache):
    from spcli.models.load import load_causal_lm
    from spcli.models.files import load_tokenizer
    from spcli.stages.tokenize import tokenize
    from spcli.io.records import Record

    gguf_file, embedding = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert lookup.local_folder(str(gguf_file)) is None and not lookup.is_available(str(gguf_file))
    folder = lookup.locate(str(gguf_file))
    assert folder.parent == cache / "models" and folder.name.startswith("gguf-tiny-")
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "no temp folder left beside it"
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["dtype"]) == (LAYERS, HIDDEN, "bfloat16")
    assert "quantization_config" not in config

    built = (folder / "config.json").stat().st_mtime_ns
    assert lookup.locate(str(gguf_file)) == folder and (folder / "config.json").stat().st_mtime_ns == built, "not converted twice"
    assert lookup.is_available(str(gguf_file))

    model = load_causal_lm(folder, "bfloat16", torch.device("cpu")).model
    got = model.get_input_embeddings().weight.float()
    assert torch.allclose(got, torch.from_numpy(embedding), atol=0.05 * 2 / 127 + 0.01), "Q8_0 dequantized to the weights"
    assert not torch.equal(model.lm_head.weight, model.get_input_embeddings().weight), "a separate output.weight stays untied"
    tokenizer = load_tokenizer(folder)
    assert tokenizer.decode(tokenizer.encode("the cat in", add_special_tokens=False)) == "the cat in"
    ids = tokenize(Record(0, 0, "r", messages=[{"role": "user", "content": "hi"}]), tokenizer, 100, "error")
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "the file's chat template"


def test_a_changed_gguf_file_is_converted_afresh(tmp_path, cache):
    gguf_file, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = lookup.locate(str(gguf_file))
    write_tiny_gguf(gguf_file, seed=1)  # same name, other weights
    second = lookup.locate(str(gguf_file))
    assert second != first and (second / "config.json").is_file()


def test_a_model_without_preset_falls_back_to_self_with_early_exit_at_its_middle_layer(tmp_path, cache, tiny_dir):
    gguf_file, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = lookup.locate(str(gguf_file))
    for name, path, num_layers in ((str(gguf_file), folder, LAYERS), (str(tiny_dir), tiny_dir, 3)):
        assert lookup.default_speculator(name) == "self"
        defaults, source = profiles.score_defaults(name, path, "self")
        assert defaults == {"window": 32, "lookahead": 0, "score_layers": str((num_layers - 1) // 2),
                            "pool": 13, "rows": "mean", "chunk": 32}
        assert source == "fallback: early exit at the middle layer"
    assert profiles.score_defaults(str(tiny_dir), tiny_dir, "self:1")[0]["score_layers"] == "0"  # within the K layers
    written = profiles.write_profile(folder, "self", {"window": 16, "lookahead": 0, "score_layers": "1"}, {})
    assert profiles.score_defaults(str(gguf_file), folder, "self")[1] == f"profile {written}", "a profile beats the fallback"


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path, cache):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(lookup.ModelError, match="cannot convert the GGUF file .*broken.gguf"):
        lookup.locate(str(bad))
    assert list((cache / "models").iterdir()) == [], "nothing half-written left"


def test_spcli_run_on_a_gguf_file_uses_the_fallback_and_says_so(tmp_path, cache, write_jsonl):
    from typer.testing import CliRunner

    from spcli.cli import app
    from test_job_run import read_outputs

    gguf_file, _ = write_tiny_gguf(tmp_path / "tiny.gguf")
    src = write_jsonl([{"id": f"r{i}", "prompt": "the cat in the hat " * (30 + i)} for i in range(2)])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(src), "--out", str(out), "--model", str(gguf_file), "--keep", "0.5",
                                   "--min-tokens", "16", *ALWAYS_PRUNE, "--keep-last", "8", "--max-tokens", "3", "--device", "cpu"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    line = next(l for l in res.output.splitlines() if l.startswith("INFO speculator: "))
    from test_job_run import speculator_dtype_text

    assert line == (f"INFO speculator: self, same tokenizer{speculator_dtype_text('float32')} (lookahead 0, window 32, "
                    "score_layers 0, pool 13, rows mean, "
                    "impl auto, restate True); settings from "
                    f"fallback: early exit at the middle layer; `spcli calibrate --model {gguf_file} --speculator self` "
                    "measures them for this model")
    rows = read_outputs(out)
    assert len(rows) == 2 and all(r["error"] is None and 0 < r["num_kept_tokens"] < r["num_prompt_tokens"] for r in rows)
