"""Base pass: keep=1.0 equals plain generation; gappy prefill equals step-by-step; batching is exact."""

import torch
from transformers import DynamicCache

from spcli.engines.hf import base_pass as hf_pass
from spcli.models.load import load_causal_lm
from spcli.models.files import load_tokenizer
from spcli.stages.request import PrunedRequest

CPU = torch.device("cpu")


def PrunedPrompt(kept_ids, kept, n, max_tokens, temperature=0.0, seed=0):
    """A request for an n-token prompt whose kept tokens (at `kept`) are `kept_ids`."""
    token_ids = [0] * n
    for k, t in zip(kept.tolist(), kept_ids.tolist()):
        token_ids[k] = t
    return PrunedRequest("r", token_ids, kept, max_tokens, temperature=temperature, seed=seed)


def full(ids, max_tokens=12):
    ids = torch.tensor(ids)
    return PrunedPrompt(ids, torch.arange(ids.numel()), ids.numel(), max_tokens)


def generate_pruned(model, prompts, eos_ids, pad_id, device, keep_first_logprobs=False):
    tokenizer = load_tokenizer(model.name_or_path)
    return hf_pass.generate(model, prompts, tokenizer, eos_ids, pad_id, device, keep_first_logprobs), None


def test_keep_all_equals_transformers_generate(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(1000, 1050))
    ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, 50, dtype=torch.long),
                         max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    gens, _ = generate_pruned(model, [full(ids)], eos_ids=set(), pad_id=0, device=CPU)
    assert gens[0].token_ids == ref[0, 50:].tolist()
    assert gens[0].finish_reason == "length"


def test_gappy_prefill_matches_step_by_step_reference(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = torch.arange(500, 560)
    kept = torch.tensor([0, 1, 2, 3, 17, 18, 30, 31, 32, 50, 58, 59])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        for j, k in enumerate(kept.tolist()):
            out = model(input_ids=ids[k].view(1, 1), attention_mask=torch.ones(1, j + 1, dtype=torch.long),
                        position_ids=torch.tensor([[k]]), past_key_values=cache, use_cache=True)
    ref_logprobs = torch.log_softmax(out.logits[0, -1].float(), -1)
    gens, _ = generate_pruned(model, [PrunedPrompt(ids[kept], kept, 60, 4)], set(), 0, CPU, keep_first_logprobs=True)
    torch.testing.assert_close(gens[0].first_logprobs, ref_logprobs, rtol=1e-5, atol=1e-5)
    # and the second token is decoded at position n = 60, not at m = 12
    first = int(ref_logprobs.argmax())
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[first]]), attention_mask=torch.ones(1, 13, dtype=torch.long),
                    position_ids=torch.tensor([[60]]), past_key_values=cache, use_cache=True)
    assert gens[0].token_ids[:2] == [first, int(out.logits[0, -1].argmax())]


def test_batch_of_different_lengths_equals_one_at_a_time(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    prompts = [
        PrunedPrompt(torch.arange(100, 140)[torch.tensor([0, 5, 9, 30, 39])], torch.tensor([0, 5, 9, 30, 39]), 40, 8),
        full(list(range(2000, 2025)), 8),
        PrunedPrompt(torch.arange(7, 71), torch.arange(64), 64, 5),
    ]
    together, _ = generate_pruned(model, prompts, set(), 0, CPU, keep_first_logprobs=True)
    for p, g in zip(prompts, together):
        alone, _ = generate_pruned(model, [p], set(), 0, CPU, keep_first_logprobs=True)
        assert g.token_ids == alone[0].token_ids
        torch.testing.assert_close(g.first_logprobs, alone[0].first_logprobs, rtol=1e-4, atol=1e-4)


def test_eos_stops_a_row_and_max_tokens_another(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(1000, 1050))
    free, _ = generate_pruned(model, [full(ids)], set(), 0, CPU)
    eos = free[0].token_ids[3]
    gens, _ = generate_pruned(model, [full(ids), full(list(range(5, 30)), 3)], {eos}, 0, CPU)
    assert gens[0].token_ids == free[0].token_ids[: free[0].token_ids.index(eos)]
    assert gens[0].finish_reason == "stop"
    assert len(gens[1].token_ids) <= 3


def test_sampling_is_seeded_per_row(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = torch.arange(10, 60)
    p = lambda seed: PrunedPrompt(ids, torch.arange(50), 50, 10, temperature=1.0, seed=seed)
    a, _ = generate_pruned(model, [p(1)], set(), 0, CPU)
    b, _ = generate_pruned(model, [p(1), p(2)], set(), 0, CPU)
    c, _ = generate_pruned(model, [p(2)], set(), 0, CPU)
    assert a[0].token_ids == b[0].token_ids
    assert b[1].token_ids == c[0].token_ids
    assert a[0].token_ids != c[0].token_ids


def test_buckets_never_pad_short_to_long():
    lengths = [2000, 8, 12, 1900, 40, 600, 9, 1950]
    buckets = hf_pass.length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(8))
    assert [lengths[b[0]] for b in buckets] == sorted(lengths[b[0]] for b in buckets), "shortest bucket first"
    for b in buckets:
        width, real = max(lengths[i] for i in b), sum(lengths[i] for i in b)
        assert width * len(b) <= hf_pass.MAX_PADDING * real + hf_pass.PADDING_SLACK * len(b)
    assert {8, 9, 12, 40} == {lengths[i] for i in buckets[0]}
    assert not any({1, 0} <= set(b) for b in buckets)


def test_bucketed_batch_keeps_order_and_each_row_its_own_ttft(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    prompts = [full(list(range(100, 1100)), 4), full(list(range(7, 15)), 4), full(list(range(300, 1290)), 4),
               full(list(range(20, 29)), 4)]
    gens, _ = generate_pruned(model, prompts, set(), 0, CPU)
    plain = hf_pass.generate(model, prompts, load_tokenizer(model.name_or_path), set(), 0, CPU, bucket=False)
    for p, g, q in zip(prompts, gens, plain):
        alone, _ = generate_pruned(model, [p], set(), 0, CPU)
        assert g.token_ids == alone[0].token_ids == q.token_ids
    short, long = max(gens[1].ttft_s, gens[3].ttft_s), min(gens[0].ttft_s, gens[2].ttft_s)
    assert gens[1].ttft_s == gens[3].ttft_s, "one bucket"
    assert short < long, "the short prompts' first token does not wait for the long prefill"
    assert len({q.ttft_s for q in plain}) == 1


def test_logprobs_are_the_log_softmax_of_each_step(tiny_dir):
    model = load_causal_lm(tiny_dir, "float32", CPU).model
    ids = list(range(1000, 1030))
    p = full(ids, 5)
    p.num_logprobs = 3
    plain = full(list(range(40, 47)), 5)  # a row that asks for none, in the same call
    gens, _ = generate_pruned(model, [p, plain], set(), 0, CPU)
    g = gens[0]
    assert gens[1].logprobs is None
    assert [t.token_id for t in g.logprobs] == g.token_ids
    seq = list(ids)
    for t in g.logprobs:
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
        top = ref.topk(3)
        assert [i for i, _ in t.top] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([lp for _, lp in t.top]), top.values, rtol=1e-4, atol=1e-4)
        assert abs(t.logprob - float(ref[t.token_id])) < 1e-4
        assert t.top[0][0] == t.token_id  # greedy: the best is the pick
        seq.append(t.token_id)
