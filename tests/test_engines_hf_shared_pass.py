"""The shared base pass (spcli/engines/hf/shared_pass.py): keep 1.0 equals plain generation of each full prompt, a
pruned group equals base_pass on the same kept sets, and the shared part is prefilled once. Tiny model: 3 layers
(SmolLM2-135M: 30)."""

import pytest
import torch

from spcli.engines.hf import base_pass
from spcli.engines.hf.shared_pass import SharedGroup, generate_shared
from spcli.models.files import load_tokenizer
from spcli.models.load import load_causal_lm
from spcli.stages.request import PrunedRequest

CPU = torch.device("cpu")
DOC = list(range(1000, 1061))  # p = 61
QUESTIONS = [list(range(3000, 3009)), list(range(4000, 4003)), list(range(5000, 5017))]


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_causal_lm(tiny_dir, "float32", CPU).model


def request(ids, kept=None, max_tokens=10, **kw):
    kept = torch.arange(len(ids)) if kept is None else kept
    return PrunedRequest("r", ids, kept, max_tokens, **kw)


def run(model, requests, shared, **kw):
    """One group's generations."""
    return run_groups(model, [SharedGroup(requests, shared)], **kw)[0]


def run_groups(model, groups, **kw):
    return generate_shared(model, groups, load_tokenizer(model.name_or_path), set(), 0, CPU, keep_first_logprobs=True,
                           **kw)


def plain(model, requests):
    return base_pass.generate(model, requests, load_tokenizer(model.name_or_path), set(), 0, CPU, keep_first_logprobs=True)


def assert_same(ref, got):
    for b, (r, g) in enumerate(zip(ref, got)):
        assert g.token_ids == r.token_ids, f"request {b}"
        err = (r.first_logprobs - g.first_logprobs).abs().max().item()
        assert torch.allclose(r.first_logprobs, g.first_logprobs, rtol=1e-5, atol=1e-5), f"request {b}: {err:.3g}"


def test_keep_all_equals_plain_generation_of_each_prompt(model):
    requests = [request(DOC + q) for q in QUESTIONS]
    ref = model.generate(torch.tensor([DOC + QUESTIONS[0]]), attention_mask=torch.ones(1, 70, dtype=torch.long),
                         max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = run(model, requests, torch.arange(len(DOC)))
    assert got[0].token_ids == ref[0, 70:].tolist()
    assert_same(plain(model, requests), got)


def test_pruned_group_equals_base_pass_on_the_same_kept_sets(model):
    shared = torch.tensor([0, 1, 2, 3, 11, 12, 13, 29, 30, 44, 45, 46, 47, 58, 59])
    requests = [request(DOC + q, torch.cat([shared, torch.arange(len(DOC), len(DOC) + len(q))])) for q in QUESTIONS]
    got = run(model, requests, shared, max_batch_tokens=70)  # 2 rows x (15 + 17) fit in 70: batches [0, 1], [2]
    assert_same(plain(model, requests), got)


def test_shared_part_is_prefilled_once(model):
    shared = torch.arange(0, len(DOC), 2)  # 31 of the 61
    requests = [request(DOC + q, torch.cat([shared, torch.arange(len(DOC), len(DOC) + len(q))]), max_tokens=3)
                for q in QUESTIONS]
    calls = []
    handle = model.model.embed_tokens.register_forward_hook(lambda _m, args, _o: calls.append(tuple(args[0].shape)))
    try:
        run(model, requests, shared)
    finally:
        handle.remove()
    assert calls == [(1, 31), (3, 17), (3, 1), (3, 1)]  # shared once; own parts left-padded; 2 decode steps


def test_groups_of_two_documents_decode_together_each_prefilled_once(model):
    other = list(range(7000, 7045))  # another document, p = 45
    s1, s2 = torch.tensor([0, 1, 2, 3, 20, 21, 22, 40, 41, 50]), torch.tensor([0, 1, 2, 3, 30, 31])
    g1 = SharedGroup([request(DOC + q, torch.cat([s1, torch.arange(61, 61 + len(q))])) for q in QUESTIONS[:2]], s1)
    g2 = SharedGroup([request(other + q, torch.cat([s2, torch.arange(45, 45 + len(q))])) for q in QUESTIONS[1:]], s2)
    calls = []
    handle = model.model.embed_tokens.register_forward_hook(lambda _m, args, _o: calls.append(tuple(args[0].shape)))
    try:
        got = run_groups(model, [g1, g2])
    finally:
        handle.remove()
    assert calls[:3] == [(1, 10), (1, 6), (4, 17)]  # each shared part once, then all 4 rows' own parts together
    assert_same(plain(model, g1.requests + g2.requests), got[0] + got[1])


def test_top_up_inside_the_document_runs_at_its_positions(model):
    """Own positions before shared ones (a per-question top-up) are an approximation: the same tokens are kept and
    the output is well formed; equal to base_pass only where the top-up is empty."""
    shared = torch.arange(0, 40)
    extra = torch.tensor([50, 51, 52])
    requests = [request(DOC + QUESTIONS[0], torch.cat([shared, extra, torch.arange(61, 70)])),
                request(DOC + QUESTIONS[1], torch.cat([shared, torch.arange(61, 64)]))]
    got = run(model, requests, shared)
    assert len(got[0].token_ids) == 10
    assert_same(plain(model, requests[1:]), got[1:])
    with pytest.raises(AssertionError, match="every shared position"):
        run(model, [request(DOC + QUESTIONS[0], torch.arange(5, 70))], shared)
