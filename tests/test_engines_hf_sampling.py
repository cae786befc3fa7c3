"""The hf engine's sampling settings (spcli/engines/hf/sampling.py): each processor and filter against a plain
reference (`ref`) with odd sizes, then each field applied by the base pass (hf_pass.generate) on the tiny model.
The vLLM engine's side, and both engines on one record: tests/test_engines_vllm_sampling.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from spcli.config.sampling import Sampling
from spcli.engines.hf import base_pass as hf_pass
from spcli.engines.hf.sampling import (PresenceFrequencyPenalty, RepetitionPenalty, SamplingRules, min_p_filter,
                                       top_k_top_p_filter)
from spcli.models.files import load_tokenizer
from spcli.models.load import load_causal_lm
from spcli.stages.request import PrunedRequest

CPU = torch.device("cpu")
B, V, T = 3, 61, 7  # rows, vocabulary, output tokens so far


def assert_close(name: str, ref: torch.Tensor, got: torch.Tensor, tol: float = 1e-6) -> None:
    err = (ref - got).abs().nan_to_num(0.0).max().item()
    assert torch.equal(ref.isinf(), got.isinf()) and err <= tol, f"{name}: max abs error {err:.2e} > {tol:.0e}"


def test_presence_and_frequency_penalties_are_openais():
    torch.manual_seed(0)
    scores, output = torch.randn(B, V), torch.randint(0, V, (B, T))
    presence, frequency = torch.tensor([0.5, -1.0, 0.0]), torch.tensor([0.25, 0.0, 2.0])
    ref = scores.clone()
    for b in range(B):
        for t in set(output[b].tolist()):
            count = output[b].tolist().count(t)
            ref[b, t] -= frequency[b] * count + presence[b]
    prompt = torch.randint(0, V, (B, 5))  # a prompt's tokens are not counted
    got = PresenceFrequencyPenalty(presence, frequency, prompt_len=5)(torch.cat([prompt, output], 1), scores)
    assert_close("presence/frequency", ref, got)


def test_repetition_penalty_is_transformers_on_prompt_and_output():
    torch.manual_seed(1)
    scores, prompt, output = torch.randn(B, V), torch.randint(0, V, (B, 9)), torch.randint(0, V, (B, T))
    penalty = torch.tensor([1.3, 0.7, 1.0])
    mask = torch.zeros(B, V, dtype=torch.bool).scatter_(1, prompt, True)
    got = RepetitionPenalty(penalty, mask)(output, scores)
    for b in range(B):
        ref = RepetitionPenaltyLogitsProcessor(float(penalty[b]))(torch.cat([prompt, output], 1)[b:b + 1], scores[b:b + 1])
        assert_close(f"repetition row {b}", ref[0], got[b])  # vLLM multiplies by 1/p where transformers divides


def test_min_p_top_k_top_p_keep_what_their_definitions_keep():
    torch.manual_seed(2)
    logits = torch.randn(B, V) * 3
    logits[0, :4] = logits[0].max() + 1  # a tie at the top
    probs = logits.softmax(-1)
    ref = logits.clone()
    min_p = torch.tensor([0.2, 0.0, 0.9])
    for b in range(B):
        ref[b, probs[b] < min_p[b] * probs[b].max()] = float("-inf")
    assert_close("min_p", ref, min_p_filter(logits, min_p))

    k, p = torch.tensor([1, 5, V]), torch.tensor([1.0, 0.5, 0.3])
    ref = torch.full_like(logits, float("-inf"))
    for b in range(B):
        order = logits[b].argsort(descending=True)
        keep = set(order[: int(k[b])].tolist()) | {i for i in range(V) if logits[b, i] == logits[b, order[int(k[b]) - 1]]}
        kept = torch.tensor(sorted(keep))
        sub = torch.full((V,), float("-inf"))
        sub[kept] = logits[b, kept]
        probs, above = sub.softmax(-1), 0.0  # top p: a token stays while the tokens more likely than it hold < p
        for i in probs.argsort(descending=True).tolist():
            if above >= p[b] < 1.0:
                break
            ref[b, i] = sub[i]
            above += float(probs[i])
    got = top_k_top_p_filter(logits, k, p)
    assert_close("top_k/top_p", ref, got, tol=1e-6)
    assert got[0].isfinite().sum() == 4, "ties at the k-th value stay"


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_causal_lm(tiny_dir, "float32", CPU).model


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


PROMPT = list(range(1000, 1040))


def request(max_tokens: int = 16, temperature: float = 0.0, seed: int = 0, **sampling) -> PrunedRequest:
    return PrunedRequest("r", PROMPT, torch.arange(len(PROMPT)), max_tokens, temperature=temperature, seed=seed,
                         sampling=Sampling(**sampling))


def generate(model, tokenizer, *requests):
    return hf_pass.generate(model, list(requests), tokenizer, {2}, 2, CPU)


def test_a_stop_string_ends_the_output_before_it(model, tokenizer):
    (plain,) = generate(model, tokenizer, request())
    stop = tokenizer.decode(plain.token_ids[5:6]).strip()
    assert stop and plain.text.find(stop) > 0
    other = request(stop=("never generated",))
    stopped, unchanged = generate(model, tokenizer, request(stop=("not this", stop)), other)
    assert stopped.text == plain.text[: plain.text.find(stop)] and stopped.finish_reason == "stop"
    assert stopped.token_ids == plain.token_ids[: len(stopped.token_ids)] and len(stopped.token_ids) <= 6
    assert (unchanged.token_ids, unchanged.finish_reason) == (plain.token_ids, plain.finish_reason), "its own stops only"


def test_top_k_1_top_p_and_min_p_at_their_tightest_equal_greedy(model, tokenizer):
    (greedy,) = generate(model, tokenizer, request())
    free, *tight = generate(model, tokenizer, request(temperature=1.0, seed=3),
                            request(temperature=1.0, seed=3, top_k=1), request(temperature=1.0, seed=3, top_p=1e-6),
                            request(temperature=1.0, seed=3, min_p=1.0))
    assert free.token_ids != greedy.token_ids, "sampling at temperature 1 leaves greedy"
    assert all(g.token_ids == greedy.token_ids for g in tight)


def test_top_k_keeps_each_sampled_token_among_the_k_most_likely(model, tokenizer):
    def outside_top(req):
        req.num_logprobs = 5  # the raw logprobs' top 5 at each step
        (g,) = generate(model, tokenizer, req)
        return sum(t.token_id not in [i for i, _ in t.top] for t in g.logprobs)

    assert outside_top(request(temperature=3.0, seed=1)) > 0
    assert outside_top(request(temperature=3.0, seed=1, top_k=5)) == 0


def test_a_seed_repeats_its_sample_whatever_the_batch(model, tokenizer):
    a = generate(model, tokenizer, request(temperature=1.0, seed=11))[0].token_ids
    b, c = generate(model, tokenizer, request(temperature=1.0, seed=12), request(temperature=1.0, seed=11))
    assert c.token_ids == a != b.token_ids


@pytest.mark.parametrize("penalty", [dict(frequency_penalty=-2.0), dict(presence_penalty=-2.0),
                                     dict(presence_penalty=0.7, frequency_penalty=1.5)])
def test_presence_and_frequency_penalties_in_the_base_pass(model, tokenizer, penalty):
    """Against transformers' generate with the same processor (counts over the output only, greedy); negative
    penalties make the random model repeat, so the output changes."""
    (plain,) = generate(model, tokenizer, request())
    (got,) = generate(model, tokenizer, request(**penalty))
    s = Sampling(**penalty)
    processor = PresenceFrequencyPenalty(torch.tensor([s.presence_penalty]), torch.tensor([s.frequency_penalty]),
                                         prompt_len=len(PROMPT))
    ref = model.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                         max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                         logits_processor=LogitsProcessorList([processor]))
    assert got.token_ids == ref[0, len(PROMPT):].tolist()
    if min(penalty.values()) < 0:
        assert got.token_ids != plain.token_ids and len(set(got.token_ids)) < len(got.token_ids)


@pytest.mark.parametrize("penalty", [0.25, 1.8])
def test_repetition_penalty_in_the_base_pass_is_transformers(model, tokenizer, penalty):
    (plain,) = generate(model, tokenizer, request())
    (got,) = generate(model, tokenizer, request(repetition_penalty=penalty))
    ref = model.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                         max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0, repetition_penalty=penalty)
    assert got.token_ids == ref[0, len(PROMPT):].tolist()
    if penalty < 1:
        assert got.token_ids != plain.token_ids, "prompt tokens favoured"


def test_penalties_read_the_kept_tokens_as_the_prompt():
    """A pruned row's repetition penalty covers what the base read (its kept tokens), as vLLM's sampler sees them."""
    kept = torch.tensor([0, 1, 2, 3, 20, 21, 22, 38, 39])
    pruned = dataclasses.replace(request(repetition_penalty=0.5), kept=kept)
    rules = SamplingRules([pruned, request(presence_penalty=1.0)], [], 2000, CPU)
    repetition, presence = rules.processors
    assert isinstance(repetition, RepetitionPenalty) and isinstance(presence, PresenceFrequencyPenalty)
    assert repetition.prompt_mask[0].nonzero()[:, 0].tolist() == [PROMPT[i] for i in kept.tolist()]
    assert repetition.penalty.tolist() == [0.5, 1.0] and presence.presence.tolist() == [0.0, 1.0]
    assert rules.min_p is None and rules.top_k is None, "no filter asked for"
