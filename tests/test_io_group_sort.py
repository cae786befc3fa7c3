"""spcli/io/group_sort.py: the compiled processing order against its numpy reference (the order directories were
begun in), on odd sizes, with and without records lacking a key, runs sorted by insertion and by stable sorts."""

import numpy as np
import pytest

from spcli.io.group_sort import FEW, order_kernel, reference


@pytest.mark.parametrize("n, num_keys, group_max, keyed_share", [
    (0, 1, 4, 1.0), (1, 1, 4, 1.0), (63, 7, 3, 0.9), (1001, 50, 3, 1.0), (997, 300, 4, 0.7),
    (4099, 3, 7, 0.95), (5003, 20, 64, 1.0), (257, 1, 1000, 1.0), (300, 300, 1, 0.5)])
def test_the_compiled_order_is_the_reference_order(n, num_keys, group_max, keyed_share):
    rng = np.random.default_rng(n)
    keys = rng.integers(0, num_keys, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # spread, as hashes are
    own = rng.integers(0, 5, n).astype(np.uint64)  # few values: ties broken by rows
    rows = np.sort(rng.choice(10 * n + 1, n, replace=False)).astype(np.int64)
    has_key = rng.random(n) < keyed_share
    ref, tri = reference(keys, own, rows, has_key, group_max), order_kernel(keys, own, rows, has_key, group_max)
    assert tri[0].tolist() == ref[0].tolist()  # members
    assert tri[1].tolist() == ref[1].tolist()  # starts
    assert tri[2:] == ref[2:]  # documents, questions, no_key, cut
    if n > FEW * num_keys:
        assert np.bincount(np.unique(keys[has_key], return_inverse=True)[1]).max() > FEW  # the stable-sort branch ran
