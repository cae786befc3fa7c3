"""Metrics: fidelity, task scores and bootstrap intervals, each on values worked out by hand."""

import math

import torch

from spcli.evaluate import metrics as M


def test_bootstrap_interval_contains_the_mean_counts_samples_and_is_seeded():
    values = [1, 0, 1, 1, 0, 1, 1, 1, None, 0.5, 1, 0]
    ci = M.bootstrap(values, num_resamples=1000, seed=3)
    assert ci.n == 11
    assert math.isclose(ci.mean, 7.5 / 11)
    assert ci.lo < ci.mean < ci.hi
    assert 0.0 <= ci.lo and ci.hi <= 1.0
    assert ci == M.bootstrap(values, num_resamples=1000, seed=3)
    assert ci != M.bootstrap(values, num_resamples=1000, seed=4)
    wider = M.bootstrap(values[:4], num_resamples=1000, seed=3)
    assert wider.hi - wider.lo > ci.hi - ci.lo  # fewer samples, wider interval


def test_bootstrap_of_constant_or_empty_values():
    assert M.bootstrap([1.0] * 5) == M.Interval(1.0, 1.0, 1.0, 5)
    empty = M.bootstrap([None, None])
    assert empty.n == 0 and math.isnan(empty.mean) and str(empty) == "-"


def test_bootstrap_ratio_is_a_ratio_of_sums_with_a_paired_interval():
    ci = M.bootstrap_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0], seed=0)
    assert math.isclose(ci.mean, 12 / 4) and ci.n == 3
    assert ci.lo <= ci.mean <= ci.hi
    assert M.bootstrap_ratio([3.0] * 4, [1.5] * 4) == M.Interval(2.0, 2.0, 2.0, 4)


def test_kl_is_zero_for_identical_distributions_and_matches_the_formula():
    p = torch.log_softmax(torch.tensor([1.0, 2.0, 3.0]), -1)
    q = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0]), -1)
    assert M.kl_divergence(p, p) == 0.0
    expected = float((p.exp() * (p - q)).sum())
    assert math.isclose(M.kl_divergence(p, q), expected, rel_tol=1e-6) and expected > 0


def test_token_agreement():
    assert M.first_token_agrees([5, 6], [5, 9]) == 1.0
    assert M.first_token_agrees([5], [6]) == 0.0
    assert M.first_token_agrees([], []) == 1.0
    ref = list(range(20))
    assert M.prefix_matches(ref, ref[:16] + [99], 16) == 1.0
    assert M.prefix_matches(ref, ref[:15] + [99], 16) == 0.0
    assert M.prefix_matches(ref[:3], ref[:3], 16) == 1.0
    assert M.prefix_matches(ref[:3], ref[:4], 16) == 0.0


def test_answer_scores():
    assert M.contains("The magic number is 4417.", ("4417",), False) == 1.0
    assert M.contains("The magic number is 44170.", ("4417",), False) == 0.0
    assert M.contains("AB and CD", ("ab", "cd", "ef"), True) == 2 / 3
    assert M.exact_match(" Teal! ", ("teal", "green"), False) == 1.0
    assert M.exact_match("the teal door", ("teal",), False) == 0.0
    assert math.isclose(M.token_f1("born in Corrin Bay town", ("Corrin Bay",), False), 2 * 0.4 * 1 / 1.4)
    assert M.token_f1("nothing", ("Corrin Bay",), False) == 0.0


def test_overlap_and_coverage():
    assert M.jaccard(torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])) == 0.5
    assert M.covered(torch.tensor([0, 5, 6, 9]), [(5, 8)]) == 2 / 3
    assert M.covered(torch.tensor([0]), []) is None
