"""Base pass: keep=1.0 equals plain generation; gappy prefill equals step-by-step; batching is exact."""

import torch
from transformers import DynamicCache

from spcli.engine.load import load_causal_lm
from spcli.engine.prefill import PrunedPrompt, generate_pruned

CPU = torch.device("cpu")


def full(ids, max_tokens=12):
    ids = torch.tensor(ids)
    return PrunedPrompt(ids, torch.arange(ids.numel()), ids.numel(), max_tokens)


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
