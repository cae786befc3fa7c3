"""The speculator replica of vLLM's workers (spcli/engines/vllm/worker/replica.py), exercised without vLLM.

A worker runs `Replica.speculate` on its share; these tests check the shares against hand arithmetic,
the round trip of what crosses the RPC, and that a replica scores exactly as the driver's own loop
(`prepare.speculate_prompts`), for a separate speculator and for `self`'s first layers.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from spcli.config.scoring import ScoreConfig
from spcli.models.load import load_causal_lm
from spcli.stages.prepare import speculate_prompts
from spcli.engines.vllm.worker.replica import Replica, balance, balance_groups, decode, encode, gather
from spcli.models.load import SpeculatorSource
from spcli.stages.speculate import Speculation
from spcli.errors import RecordError

WINDOW = ScoreConfig(lookahead=0, window=8, score_layers="1", pool=3, rows="mean")
LOOKAHEAD = ScoreConfig(lookahead=3, window=4, score_layers="all", pool=1, rows="max")


def test_shares_are_balanced_by_tokens_longest_first():
    # 300 -> r0 (0 | 0); 250 -> r1 (300 | 0); 200 -> r1 (300 | 250); 100 -> r0 (300 | 450); 50 -> r0 (400 | 450)
    assert balance([100, 300, 200, 50, 250], 2) == [[1, 0, 3], [4, 2]]
    assert balance([5, 5, 5], 4) == [[0], [1], [2], []]  # fewer prompts than ranks: some ranks idle
    assert balance([7, 3], 1) == [[0, 1]]


def test_every_prompt_is_in_exactly_one_share_and_the_slowest_rank_is_near_the_mean():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 40))]
        ranks = rng.randrange(1, 9)
        shares = balance(lengths, ranks)
        assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
        loads = [sum(lengths[i] for i in s) for s in shares]
        assert max(loads) <= sum(lengths) / ranks + max(lengths)  # LPT: mean plus one prompt at most


def test_a_document_s_questions_go_to_one_rank_weighed_by_what_its_speculator_reads():
    doc = list(range(100, 400))  # 300 shared tokens
    prompts = [doc + [1, 2], [7] * 250, doc + [3], doc + [4, 5, 6], [8] * 40]
    shares, groups = balance_groups(prompts, [[0, 2, 3]], 2)
    # the group weighs 300 + 2 + 1 + 3 = 306 (not 907): it takes rank 0, the 250-token prompt rank 1, then the 40
    assert shares == [[0, 2, 3], [1, 4]] and groups == [[[0, 1, 2]], []]
    shares, groups = balance_groups(prompts, [[2, 3]], 3)  # a group's indices are into its rank's share
    assert sorted(i for s in shares for i in s) == list(range(5))
    rank = next(r for r, s in enumerate(shares) if 2 in s)
    assert [[shares[rank][i] for i in g] for g in groups[rank]] == [[2, 3]] and sum(map(len, groups)) == 1


def test_what_crosses_the_rpc_comes_back_bit_exact():
    spec = Speculation(torch.rand(37, dtype=torch.float32), 9, [5, 6], 0.25)
    back = decode(encode(spec))
    assert torch.equal(back.importance, spec.importance) and back.importance.dtype == torch.float32
    assert (back.num_query_rows, back.lookahead_ids, back.speculate_s) == (9, [5, 6], 0.25)
    err = decode(encode(RecordError("the speculator ran out of memory on 9 tokens")))
    assert isinstance(err, RecordError) and str(err) == "the speculator ran out of memory on 9 tokens"


def test_gather_puts_replies_back_in_order_and_charges_the_call_wall_time():
    specs = [Speculation(torch.full((n,), float(n)), 1, [], 0.1 * n) for n in (3, 1, 2)]
    shares = [[0, 2], [1]]
    replies = [{"wall_s": 0.5, "results": [encode(specs[0]), encode(specs[2])]},
               {"wall_s": 0.1, "results": [encode(specs[1])]}]
    got = gather(shares, replies, 3, wall_s=1.0)  # the slowest rank took 0.5 s of the call's 1.0 s
    assert [g.importance[0].item() for g in got] == [3.0, 1.0, 2.0]
    assert [round(g.speculate_s, 6) for g in got] == [0.6, 0.2, 0.4]


def prompts_of(lengths: list[int]) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(10, 49000) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("score", [WINDOW, LOOKAHEAD], ids=["window-early-exit", "lookahead"])
def test_a_replica_scores_as_the_driver_does(tiny_dir, score):
    prompts = prompts_of([40, 23, 40, 9])
    model = load_causal_lm(tiny_dir, "float32", torch.device("cpu")).model
    ref = speculate_prompts(model, prompts, score, {2}, torch.device("cpu"))
    replica = Replica(torch.device("cpu"))
    source = SpeculatorSource(str(tiny_dir), "float32").to_dict()
    reply = replica.speculate(source, prompts, dataclasses.asdict(score), [2])
    got = [decode(item) for item in reply["results"]]
    for r, g in zip(ref, got, strict=True):
        assert torch.equal(r.importance, g.importance)
        assert (r.num_query_rows, r.lookahead_ids) == (g.num_query_rows, g.lookahead_ids)
    first = replica.model
    replica.speculate(source, prompts[:1], dataclasses.asdict(score), [2])
    assert replica.model is first  # loaded once per worker


@pytest.mark.parametrize("score", [WINDOW, LOOKAHEAD], ids=["window-early-exit", "lookahead"])
def test_a_replica_reads_a_group_s_document_once_and_scores_each_question_as_alone(tiny_dir, score, monkeypatch):
    from spcli.stages import speculate_shared

    doc = prompts_of([60])[0]
    prompts = [doc + [11, 12, 13], prompts_of([23])[0], doc + [14, 15], doc + [16, 17, 18, 19]]
    model = load_causal_lm(tiny_dir, "float32", torch.device("cpu")).model
    ref = speculate_prompts(model, prompts, score, {2}, torch.device("cpu"))
    passes = []
    prefill = speculate_shared.prefill_prefix
    monkeypatch.setattr(speculate_shared, "prefill_prefix", lambda m, ids, *a: passes.append(len(ids)) or prefill(m, ids, *a))
    reply = Replica(torch.device("cpu")).speculate(SpeculatorSource(str(tiny_dir), "float32").to_dict(), prompts,
                                                   dataclasses.asdict(score), [2], groups=[[0, 2, 3]])
    assert passes == [60]  # the document once, for its three questions
    for r, item in zip(ref, reply["results"], strict=True):
        g = decode(item)
        torch.testing.assert_close(g.importance, r.importance, rtol=1e-4, atol=1e-6)
        assert (r.num_query_rows, r.lookahead_ids) == (g.num_query_rows, g.lookahead_ids)


def test_a_self_replica_reads_only_the_first_layers(tiny_dir):
    """`self` on vLLM: the replica loads the base's first 2 of 3 layers; scoring at layer 1 equals the
    whole model's (early exit stops there anyway)."""
    prompts = prompts_of([30, 12])
    whole = load_causal_lm(tiny_dir, "float32", torch.device("cpu")).model
    ref = speculate_prompts(whole, prompts, WINDOW, {2}, torch.device("cpu"))
    replica = Replica(torch.device("cpu"))
    reply = replica.speculate(SpeculatorSource(str(tiny_dir), "float32", num_layers=2, total=3).to_dict(), prompts,
                              dataclasses.asdict(WINDOW), [2])
    assert replica.model.config.num_hidden_layers == 2
    for r, item in zip(ref, reply["results"], strict=True):
        assert torch.equal(r.importance, decode(item).importance)


def test_a_prompt_that_runs_out_of_memory_in_a_replica_comes_back_as_its_error(tiny_dir, monkeypatch):
    """The replica runs prepare's loop, OOM retry included: a pass that runs out of memory is retried one
    prompt at a time, and the prompt that still does comes back as its RecordError; the others score. Inside a vLLM
    worker the allocator's cache is never handed back to CUDA (issue 40: it holds vLLM's step workspace too)."""
    import spcli.stages.prepare as prepare

    releases = []
    real_free = prepare.free_memory
    monkeypatch.setattr(prepare, "free_memory", lambda release_cache=True: releases.append(release_cache)
                        or real_free(release_cache))
    model = load_causal_lm(tiny_dir, "float32", torch.device("cpu")).model
    first = model.model.layers[0]  # shared by the early-exit view the speculator runs
    real_forward = first.forward

    def forward(hidden_states, *args, **kwargs):
        if hidden_states.shape[1] > 30:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(hidden_states, *args, **kwargs)

    first.forward = forward
    source = SpeculatorSource(str(tiny_dir), "float32")
    replica = Replica(torch.device("cpu"))
    replica.model, replica.source = model, source  # already loaded: the instrumented copy
    prompts = prompts_of([40, 12, 20])
    reply = replica.speculate(source.to_dict(), prompts, dataclasses.asdict(WINDOW), [2])
    got = [decode(item) for item in reply["results"]]
    assert isinstance(got[0], RecordError) and str(got[0]) == "the speculator ran out of memory on 40 tokens"
    assert all(isinstance(g, Speculation) and g.importance.shape == (len(p),) for g, p in zip(got[1:], prompts[1:]))
    assert releases and not any(releases), "every out-of-memory pass in the replica kept the cache"
    prepare.speculate_prompts(model, prompts[:1], WINDOW, {2}, torch.device("cpu"))
    assert releases[-1] is True, "the driver's own loop (hf engine) still hands its cache back"
