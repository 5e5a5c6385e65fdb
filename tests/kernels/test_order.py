"""The order kernels of prbmrm.kernels.order against numpy: order keys against float comparisons, the sort
against numpy's stable sort and lexsort (ties, near ties, tags, NaN, -0.0), the split into ranges against a
comparison with every splitter, and the ROC area's weights against counting every pair.
"""

import numpy as np
import pytest

from prbmrm.kernels.order import order_keys, order_values, roc_weights, sorted_order, split_ranges

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-300, -1e-300, 1.0, -1.0, 2.0 ** 60,
                    -(2.0 ** 60), np.finfo(float).max, -np.finfo(float).max])


def keys_of(values):
    keys = np.empty(len(values), dtype=np.uint64)
    order_keys(np.ascontiguousarray(values, dtype=np.float64), keys)
    return keys


def test_order_keys_compare_as_the_values():
    values = np.r_[SPECIAL, np.random.default_rng(0).normal(size=200) * 10.0 ** np.arange(-100, 100)]
    keys = keys_of(values)
    numbers = ~np.isnan(values)
    a, b = np.meshgrid(values[numbers], values[numbers])
    ka, kb = np.meshgrid(keys[numbers], keys[numbers])
    np.testing.assert_array_equal(ka < kb, a < b)
    np.testing.assert_array_equal(ka == kb, a == b)
    assert np.all(keys[np.isnan(values)] > keys[numbers].max())
    back = np.empty(values.size)
    order_values(keys, back)
    # Back to the same values, -0.0 as 0.0 (the keys do not tell them apart).
    np.testing.assert_array_equal(back.view(np.uint64)[numbers], (values[numbers] + 0.0).view(np.uint64))
    assert np.all(np.isnan(back[~numbers]))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 100_000])
@pytest.mark.parametrize("kind", ["distinct", "ties", "near_ties", "equal", "special"])
def test_sorted_order_is_numpys_stable_sort(n, kind):
    rng = np.random.default_rng(n)
    values = {"distinct": lambda: rng.normal(size=n),
              "ties": lambda: rng.integers(0, 7, size=n).astype(np.float64),
              # Keys that differ in their lowest bits only: the packed sort leaves them out of order.
              "near_ties": lambda: 1.0 + rng.integers(0, 4, size=n) * 2.0 ** -52 + rng.integers(0, 3, size=n),
              "equal": lambda: np.full(n, 0.5),
              "special": lambda: rng.choice(SPECIAL, size=n)}[kind]()
    keys = keys_of(values)
    expected = np.argsort(np.where(values == 0.0, 0.0, values), kind="stable")  # numpy: -0.0 == 0.0, NaN last
    np.testing.assert_array_equal(sorted_order(keys), expected)
    tags = rng.permutation(n).astype(np.int64) - n // 2
    np.testing.assert_array_equal(sorted_order(keys, tags), np.lexsort((tags, keys)))
    # Columns of int64 rows, as the sample sort receives them.
    rows = np.column_stack([keys.view(np.int64), tags])
    np.testing.assert_array_equal(sorted_order(rows[:, 0].view(np.uint64), rows[:, 1]), np.lexsort((tags, keys)))


@pytest.mark.parametrize("n", [2, 3, 64, 5000])
def test_sorted_order_of_any_bits(n):
    # Keys about the middle (where the packing puts the sign of a score) and over the whole range of 64 bits.
    rng = np.random.default_rng(n)
    middle = np.uint64(2 ** 63)
    for keys in (np.array([middle, middle - np.uint64(1)] + [middle] * (n - 2), dtype=np.uint64),
                 middle + rng.integers(-3 * n, 3 * n, size=n).astype(np.int64).astype(np.uint64),
                 rng.integers(0, 2 ** 64 - 1, size=n, dtype=np.uint64, endpoint=True)):
        np.testing.assert_array_equal(sorted_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("splits", [0, 1, 2, 5, 40])
@pytest.mark.parametrize("with_tags", [False, True])
def test_split_ranges_compares_with_every_splitter(splits, with_tags):
    rng = np.random.default_rng(splits)
    n, first = 3000, 1234
    keys = keys_of(rng.integers(0, 20, size=n).astype(np.float64))
    tags = rng.permutation(10 * n)[:n].astype(np.int64) if with_tags else None
    ties = tags if with_tags else first + np.arange(n)
    chosen = np.sort(rng.choice(n, size=splits, replace=False))
    by_key = np.lexsort((ties, keys))[chosen]
    split_keys, split_tags = keys[by_key], np.ascontiguousarray(ties[by_key])
    rows = np.empty((n, 3 if with_tags else 2), dtype=np.int64)
    local = np.empty(n, dtype=np.intp)
    counts = np.empty(splits + 1, dtype=np.int64)
    payload = rng.integers(-5, 5, size=n)
    split_ranges(keys, payload, tags, first, split_keys, split_tags, rows, local, counts)
    # The range of a key: the splitters at or below (key, tie).
    below = (split_keys[None, :] < keys[:, None]) | ((split_keys[None, :] == keys[:, None])
                                                      & (split_tags[None, :] <= ties[:, None]))
    ranges = below.sum(axis=1)
    np.testing.assert_array_equal(counts, np.bincount(ranges, minlength=splits + 1))
    np.testing.assert_array_equal(local, np.argsort(ranges, kind="stable"))
    np.testing.assert_array_equal(rows[:, 0].view(np.uint64), keys[local])
    np.testing.assert_array_equal(rows[:, 1], payload[local])
    if with_tags:
        np.testing.assert_array_equal(rows[:, 2], tags[local])


@pytest.mark.parametrize("seed", range(5))
def test_roc_weights_count_the_pairs(seed):
    rng = np.random.default_rng(seed)
    n = 60
    positive = (rng.random(n) < 0.4).astype(np.int8)
    values = rng.integers(0, 6, size=n).astype(np.float64)
    order = sorted_order(keys_of(values))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    # A range of a larger order: 7 examples before it (3 positive), 11 negatives in all beyond these.
    before, positives_before, negatives = 7, 3, int(n - positive.sum()) + 4 + 11
    out = np.full(n, np.nan)
    roc_weights(positive, order, positives_before, before, negatives, out)
    for i in range(n):
        earlier = rank < rank[i]
        if positive[i]:
            after = negatives - (before - positives_before) - np.sum(earlier & (positive == 0))
            assert out[i] == -after
        else:
            assert out[i] == positives_before + np.sum(earlier & (positive == 1))
