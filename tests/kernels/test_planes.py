"""The compiled loops over sparse planes (prbmrm.kernels.planes) against dense numpy.

References: the planes written out as dense vectors, and numpy's ``np.dot``,
``np.flatnonzero`` and ``out[index] += weight * values``; bitwise where the
loops promise numpy's order (a sum from 0.0 in index order).
"""

import numpy as np
import pytest

from prbmrm.kernels.planes import (CHUNK, GROUP, fill_support, scatter_add_group, sparse_dot, sparse_dot_group,
                                   sparse_dots)


def random_planes(rng, d, count, dtype):
    planes = []
    for p in range(count):
        nonzeros = int(rng.integers(0, d // 3)) if p % 5 else 0
        index = np.sort(rng.choice(d, nonzeros, replace=False)).astype(dtype)
        planes.append((index, rng.normal(size=nonzeros) * np.exp(rng.normal(size=nonzeros) * 4)))
    return planes


def dense(plane, d):
    index, values = plane
    a = np.zeros(d)
    a[index] = values
    return a


def in_order(values):
    """``0.0 + values[0] + values[1] + ...`` added in order."""
    total = 0.0
    for value in values:
        total += value
    return total


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_dots_equal_numpy_in_index_order(dtype):
    rng = np.random.default_rng(0)
    d = 2 * CHUNK + 5
    x, y = rng.normal(size=d), rng.normal(size=d)
    for plane in random_planes(rng, d, 6, dtype):
        index, values = plane
        expected = in_order(values * x[index])
        assert sparse_dot(index, values, x) == expected
        assert sparse_dots(index, values, x, y) == (expected, in_order(values * y[index]))
        assert sparse_dot(index, values, x) == pytest.approx(dense(plane, d) @ x, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_group_dot_and_scatter_equal_plane_by_plane_numpy(dtype):
    rng = np.random.default_rng(1)
    d = 3 * CHUNK + 17
    planes = random_planes(rng, d, GROUP - 1, dtype)
    x = rng.normal(size=d) * np.exp(rng.normal(size=d) * 5)  # wide exponents make order show in the bits
    out = np.empty(GROUP)
    planes.append((np.zeros(0, dtype=dtype), np.zeros(0)))  # padding: an empty plane
    sparse_dot_group(*map(tuple, zip(*planes)), x, out)
    np.testing.assert_array_equal(out, [in_order(v * x[i]) for i, v in planes])
    np.testing.assert_allclose(out, [dense(p, d) @ x for p in planes], rtol=1e-9, atol=1e-9 * np.abs(x).sum())
    planes[-1] = (np.zeros(0, dtype=dtype), rng.normal(size=d))  # a dense plane: no indices, d values
    indices, values = zip(*planes)
    with pytest.raises(ValueError):
        sparse_dot_group(indices, values, x, out)  # the group dot takes sparse planes only
    weights = rng.random(GROUP)
    weights[3] = 0.0
    total = np.zeros(d)
    scatter_add_group(indices, values, weights, total)
    reference = np.zeros(d)
    for (index, value), weight in zip(planes, weights):
        if weight == 0.0:
            continue
        if index.size == 0 and value.size == d:
            reference += weight * value
        else:
            reference[index] += weight * value
    np.testing.assert_array_equal(total, reference)
    np.testing.assert_allclose(total, sum(w * dense(p, d) if p[0].size or p[1].size != d else w * p[1]
                                          for p, w in zip(planes, weights)), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_fill_support_is_flatnonzero(dtype):
    rng = np.random.default_rng(2)
    a = rng.normal(size=10000) * (rng.random(10000) < 0.2)
    count = np.count_nonzero(a)
    index, values = np.empty(count + 1, dtype=dtype), np.empty(count + 1)
    fill_support(a, index, values)
    np.testing.assert_array_equal(index[:count], np.flatnonzero(a))
    np.testing.assert_array_equal(values[:count], a[a != 0])
    with pytest.raises(ValueError):
        fill_support(a, index[:count], values[:count])  # no spare slot


def test_planes_outside_the_vector_or_of_other_types_are_refused():
    x = np.zeros(10)
    with pytest.raises(IndexError):
        sparse_dot(np.array([3, 10], dtype=np.int32), np.ones(2), x)
    with pytest.raises(ValueError):
        sparse_dot(np.array([3], dtype=np.int32), np.ones(2), x)
    empty = (np.zeros(0, dtype=np.int16), np.zeros(0))
    with pytest.raises(TypeError):
        sparse_dot_group((empty[0],) * GROUP, (empty[1],) * GROUP, x, np.empty(GROUP))
    bad = [(np.zeros(0, dtype=np.int32), np.zeros(0))] * (GROUP - 1) + [(np.array([11], dtype=np.int32), np.ones(1))]
    with pytest.raises(IndexError):
        scatter_add_group(*map(tuple, zip(*bad)), np.ones(GROUP), x)
