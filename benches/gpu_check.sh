#!/usr/bin/env bash
# NOT RUNNABLE IN THIS WORKPLACE: the GPU machine the `device` tool lends has no vLLM and cannot fetch it (a call
# carries at most 64 MiB; vLLM 0.32.0's CUDA wheel alone is 311 MiB and pins torch 2.13.0 with CUDA, flashinfer-python,
# nvidia-cutlass-dsl and more), so the vLLM-on-GPU path cannot be measured here. This script stays for a user's own
# GPU node with vLLM installed. What the lent GPU can measure (the hf engine, the scoring kernel, the plan) is
# benches/gpu_check_hf.sh (docs/gpu-check.md).
#
# --engine vllm on one CUDA GPU, sized for an H200 (141 GB), in under 10 minutes:
#   1. tests on CUDA: the vLLM parity tests (tests/test_engines_vllm_driver_engine.py: gapped positions vs transformers,
#      chunked prefill, prefix-cache salt, refusals), the start-up check (tests/test_engines_vllm_startup.py: no
#      CUDA runtime call before vLLM forks), the plan (tests/test_plan*.py, tests/test_engines_vllm_driver_args.py), and
#      the scoring kernel compiled for the GPU against its reference in bf16 (tests/test_kernels_score*.py,
#      TRITON_INTERPRET unset);
#   2. `spcli run --engine vllm` end to end, a real start-up on CUDA (fork safety for real), with a
#      random-weight Llama-3.2-1B-shape base and a 2-layer speculator, 16 x 8k prompts prefilled by the
#      speculator in 4 chunks (the later ones' masks in row blocks), once per
#      --speculator-placement (workers, driver): the workers vs driver TTFT ratio (on one GPU both
#      placements share it: this checks the replica path costs nothing, not the 8-GPU gain);
#   2b. the same run with vLLM's GPU defaults (torch.compile + CUDA graphs, async scheduling), again with
#      --speculator-overlap on, and with --tp 2 where 2 GPUs are visible: kept tokens equal to the eager run's,
#      outputs compared row by row (issue 40);
#   3. benches/vllm_peer.py on an 8B-shaped pair: Llama-3.1-8B shape with vLLM's random "dummy" weights
#      as the base, a random Llama-3.2-1B-shape speculator: spcli (keep 0.1, both placements) vs plain
#      vLLM full prefill TTFT;
#   4. benches/vllm_ttft.py (full prefill vs kept tokens, keep 0.1/0.3/0.5) on random weights of
#      Llama-3.1-8B shape and of Llama-3.1-70B layer shape (40 of its 80 layers: the whole 70B in bf16,
#      141 GB, does not fit one GPU; depth scales full and pruned alike, so the ratio holds).
# Nothing is downloaded: models are built from configs; the base weights of 3-4 are vLLM's "dummy" ones.
# Needs a Python with vllm==0.32.0 (CUDA) and the torch it pins, plus transformers, pyarrow, typer,
# rich, orjson, tqdm, triton and pytest; spcli itself is used from this checkout. Writes gpu.txt,
# tests.txt, run_workers.txt, run_driver.txt, peer.txt, ttft_8b.txt, ttft_70b.txt under $OUT
# (default out/gpu_vllm).
# GPU_CHECK_SCALE=tiny runs the same steps with tiny shapes (on vLLM's CPU build, to check the script).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_vllm}"
PY="${PYTHON:-python3}"
SCALE="${GPU_CHECK_SCALE:-full}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_V2_MODEL_RUNNER=0 TOKENIZERS_PARALLELISM=false

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
  "$PY" -c "import vllm; print('vllm', vllm.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "vLLM is not importable with $PY: install vllm==0.32.0 (CUDA) and its torch first (the device tool's GPU" \
    "machine cannot: the vLLM path is not measurable there; benches/gpu_check_hf.sh is its check)" | tee -a "$OUT/gpu.txt"
  exit 3
fi

KERNEL_TESTS=""
[ "$SCALE" = full ] && KERNEL_TESTS="tests/test_kernels_score.py tests/test_kernels_score_triton.py"
(unset TRITON_INTERPRET; timeout 180 "$PY" -m pytest tests/test_engines_vllm_driver_engine.py tests/test_engines_vllm_driver_args.py \
  tests/test_engines_vllm_startup.py tests/test_plan.py tests/test_plan_memory.py tests/test_plan_shapes.py $KERNEL_TESTS \
  -q -p no:cacheprovider -rs -k "not speculator_shape and not smollm2") 2>&1 | tee "$OUT/tests.txt"
tests_rc=${PIPESTATUS[0]}  # (tests that need the SmolLM2 tokenizer skip or are deselected: it is not there)

# Models from configs: a WordLevel tokenizer ("w0", "w1", ...) shared by base and speculator.
cat > "$WORK/e2e.py" <<'EOF'
import json, math, random, subprocess, sys, time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

work, scale, variant = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
# variant: a placement (workers, driver: eager, as before), or the GPU defaults the eager runs leave out (issue 40):
# graphs = workers with torch.compile + CUDA graphs and vLLM's async scheduling (its GPU default), overlap = that
# plus --speculator-overlap on (the replica's own CUDA stream: its clock waits for that stream only, and the driver
# asks for readiness by time), tp2 = graphs on 2 GPUs (a replica per rank)
placement = "workers" if variant in ("graphs", "overlap", "tp2") else variant
extra = {"workers": ["--enforce-eager"], "driver": ["--enforce-eager"], "graphs": ["--no-enforce-eager"],
         "overlap": ["--no-enforce-eager", "--speculator-overlap", "on"],
         "tp2": ["--no-enforce-eager", "--tp", "2"]}[variant]
if not gpu:  # the tiny check on vLLM's CPU build: compiling there costs minutes; the steps are what it checks
    extra = ["--enforce-eager" if a == "--no-enforce-eager" else a for a in extra]
gpu = scale == "full"
vocab = 128256 if gpu else 4096
# Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 KV heads, ffn 8192 (tied embeddings).
base = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8) if gpu else dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2)
spec = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2) if gpu else dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                    num_attention_heads=2, num_key_value_heads=1)
n, rows, max_len = (8192, 16, 16384) if gpu else (600, 4, 2048)

def build(dest, shape):
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(dest)
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=max_len, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if gpu else torch.float32)
    model.save_pretrained(dest)
    del model
    if gpu:
        torch.cuda.empty_cache()  # vLLM's start-up wants its share of the GPU free
    return dest

t0 = time.time()
base_dir, spec_dir = work / "base", work / "spec"
if not base_dir.exists():  # the first placement builds what both use
    build(base_dir, base), build(spec_dir, spec)
    rng = random.Random(0)
    with open(work / "in.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{rng.randrange(3, vocab - 3)}" for _ in range(n))}) + "\n")
    print(f"built models and {rows} prompts of {n} words in {time.time() - t0:.0f} s", flush=True)
main = "import sys\nfrom spcli.cli import main\nif __name__ == '__main__':\n    sys.argv[0] = 'spcli'\n    main()"
out_dir = work / f"out_{variant}"
cmd = [sys.executable, "-c", main, "run", str(work / "in.jsonl"), "--out", str(out_dir), "--engine", "vllm",
       "--speculator-placement", placement,
       "--model", str(base_dir), "--speculator", str(spec_dir), "--keep", "0.1", "--max-tokens", "16",
       "--batch-size", str(rows), "--max-model-len", str(max_len), "--dtype", "bfloat16" if gpu else "float32",
       "--speculator-chunk", str(n // 4),  # 4 prefill calls: the later ones attend in row blocks (capture.RowBlocks)
       *extra]  # eager for the placements: torch.compile + CUDA graphs cost minutes of start-up
proc = subprocess.run(cmd, capture_output=True, text=True)
lines = [l for l in proc.stderr.splitlines() if not l.startswith("(")]  # vLLM's own lines start "(Engine..."
print("\n".join(lines[-12:]))
print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no stdout)")
# the replicas' prompt bound measured once vLLM is up (issue 40: mem_get_info in each worker, not only the plan)
measured = [l for l in proc.stderr.splitlines() if "free on a GPU" in l]
print(measured[-1] if measured else f"{variant}: replica prompt bound as planned (vLLM left the reserve free)")
import pyarrow.parquet as pq
out = [r for p in sorted(out_dir.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
ok = proc.returncode == 0 and len(out) == rows and all(r["error"] is None for r in out)
ok = ok and all(r["num_kept_tokens"] == max(math.ceil(0.1 * r["num_prompt_tokens"]), 4 + 64) for r in out)
ttft = sorted(r["ttft_s"] for r in out)
print(f"e2e {variant} {'OK' if ok else 'FAILED'}: exit {proc.returncode}, {len(out)} rows, ttft median {ttft[len(ttft) // 2]:.3f} s"
      if out else f"e2e FAILED: exit {proc.returncode}, no rows")
sys.exit(0 if ok else 1)
EOF
run_rc=0
for placement in workers driver; do
  timeout 150 "$PY" "$WORK/e2e.py" "$WORK" "$SCALE" "$placement" 2>&1 | tee "$OUT/run_$placement.txt"
  rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && run_rc=$rc
done
"$PY" - "$OUT" <<'EOF' 2>&1 | tee -a "$OUT/gpu.txt"
import re, sys
from pathlib import Path
med = {p: float(re.search(r"ttft median ([0-9.]+) s", (Path(sys.argv[1]) / f"run_{p}.txt").read_text()).group(1))
       for p in ("workers", "driver")}
print(f"placement workers vs driver TTFT ratio (e2e, median row): {med['driver'] / med['workers']:.2f}x")
EOF
# The GPU defaults against the eager run (issue 40): same kept tokens (the speculator decides them), and the
# outputs compared row by row (greedy on random bf16 weights: compiled kernels may round a near-tie another way,
# so equal texts are counted, not required); TP 2 only where 2 GPUs are visible.
variants="graphs overlap"
[ "$SCALE" = full ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && variants="$variants tp2"
for variant in $variants; do
  timeout 300 "$PY" "$WORK/e2e.py" "$WORK" "$SCALE" "$variant" 2>&1 | tee "$OUT/run_$variant.txt"
  rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && run_rc=$rc
done
"$PY" - "$WORK" $variants <<'EOF' 2>&1 | tee -a "$OUT/gpu.txt"
import sys
from pathlib import Path
import pyarrow.parquet as pq
work = Path(sys.argv[1])
rows = lambda v: {r["id"]: r for p in sorted((work / f"out_{v}").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()}
eager = rows("workers")
for variant in sys.argv[2:]:
    other = rows(variant)
    same_kept = sum(other[i]["kept_indices"] == r["kept_indices"] for i, r in eager.items() if i in other)
    same_text = sum(other[i]["output"] == r["output"] for i, r in eager.items() if i in other)
    print(f"{variant} vs eager workers: {len(other)}/{len(eager)} rows, kept tokens equal {same_kept}, outputs equal {same_text}")
    if same_kept != len(eager):
        sys.exit(f"{variant}: the kept tokens differ from the eager run's")
EOF
[ "${PIPESTATUS[0]}" -ne 0 ] && run_rc=1
[ "$SCALE" = full ] && [[ "$variants" != *tp2* ]] && echo "tp2: skipped (one GPU visible)" | tee -a "$OUT/gpu.txt"

# spcli vs plain vLLM on an 8B-shaped pair: the base's folder holds config.json + tokenizer (weights: dummy),
# the speculator is a random Llama-3.2-1B shape saved with the same tokenizer.
cat > "$WORK/pair.py" <<'EOF'
import json, sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

work, gpu = Path(sys.argv[1]), sys.argv[2] == "full"
vocab = 128256 if gpu else 4096
words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(vocab - 3)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
common = dict(vocab_size=vocab, max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
base = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8) if gpu else dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2)
spec = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8) if gpu else dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                     num_attention_heads=2, num_key_value_heads=1)
for name, shape in (("pair_base", base), ("pair_spec", spec)):
    dest = work / name
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(dest)
    config = LlamaConfig(**common, **shape, dtype="bfloat16" if gpu else "float32")
    if name == "pair_base":
        config.save_pretrained(dest)  # vLLM's dummy weights
        continue
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        LlamaForCausalLM(config).to(torch.bfloat16 if gpu else torch.float32).save_pretrained(dest)
    if gpu:
        torch.cuda.empty_cache()
print(json.dumps({"base": base, "speculator": spec}))
EOF
if [ "$SCALE" = full ]; then PEER="--n 16384 --batch 8 --repeats 2 --dtype bfloat16 --max-model-len 32768"
else PEER="--n 512 --batch 2 --repeats 1 --dtype float32 --max-model-len 2048"; fi
{ timeout 60 "$PY" "$WORK/pair.py" "$WORK" "$SCALE" &&
  timeout 200 "$PY" benches/vllm_peer.py --model "$WORK/pair_base" --speculator "$WORK/pair_spec" --keep 0.1 \
    --placements workers,driver --load-format dummy $PEER; } 2>&1 | tee "$OUT/peer.txt"
peer_rc=${PIPESTATUS[0]}

# TTFT with vLLM's random weights: folders hold config.json + tokenizer only; the bench's engine config
# gets load_format="dummy" (wrapped here, so benches/vllm_ttft.py stays as it is).
cat > "$WORK/ttft.py" <<'EOF'
import json, sys
from pathlib import Path


def main(dest: Path, shape: dict, argv: list[str]) -> None:
    sys.path.insert(0, "benches")
    import vllm_ttft
    from transformers import LlamaConfig

    import spcli.engines.vllm.driver.base_pass as vllm_pass

    dest.mkdir(parents=True)  # build_model for its tokenizer; the weights come from load_format="dummy"
    tiny = dict(shape, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32)
    vllm_ttft.build_model(dest, tiny)
    for f in dest.glob("*.safetensors"):
        f.unlink()
    LlamaConfig(**shape, dtype="bfloat16").save_pretrained(dest)
    config = vllm_pass.VllmRunnerConfig
    vllm_pass.VllmRunnerConfig = lambda **kw: config(
        **{**kw, "engine_kwargs": {**kw.get("engine_kwargs", {}), "load_format": "dummy"}})
    print(f"{dest.name}: {json.dumps(shape)}", flush=True)
    vllm_ttft.main(["--model", str(dest), *argv])


if __name__ == "__main__":  # vLLM's spawned processes import this file as __mp_main__
    main(Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:])
EOF
ttft() {  # name, timeout, shape json, bench args...
  local name=$1 limit=$2 shape=$3; shift 3
  timeout "$limit" "$PY" "$WORK/ttft.py" "$WORK/$name" "$shape" "$@" 2>&1 | tee "$OUT/ttft_$name.txt"
  return "${PIPESTATUS[0]}"
}
# Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, ffn 14336, vocab 128256.
LLAMA_8B='{"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}'
# Llama-3.1-70B layers: hidden 8192, 64 heads, 8 KV heads, ffn 28672 (40 of 80 layers, see above).
LLAMA_70B_40L='{"vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}'
if [ "$SCALE" = full ]; then
  ttft 8b 100 "$LLAMA_8B" --n 16384 --batch 8 --repeats 2 --dtype bfloat16; ttft8_rc=$?
  ttft 70b 120 "$LLAMA_70B_40L" --n 8192 --batch 4 --repeats 2 --dtype bfloat16; ttft70_rc=$?
else
  SMALL='{"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false}'
  ttft 8b 100 "$SMALL" --n 512 --batch 2 --repeats 1 --dtype float32; ttft8_rc=$?
  ttft70_rc="skipped (tiny)"
fi
echo "tests exit $tests_rc, run exit $run_rc, peer exit $peer_rc, ttft 8b exit $ttft8_rc, ttft 70b exit $ttft70_rc" | tee -a "$OUT/gpu.txt"
# a step skipped at tiny scale counts as passed; any other value but 0 fails the check
for rc in "$tests_rc" "$run_rc" "$peer_rc" "$ttft8_rc" "$ttft70_rc"; do
  [ "$rc" = 0 ] || [ "$rc" = "skipped (tiny)" ] || exit 1
done
