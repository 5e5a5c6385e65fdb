"""The fixed-point limbs of prbmrm.kernels.fixed against the numpy steps they replace, entry by entry,
and the float64 sums decoded from them.

The reference rounds each entry with numpy's ufuncs (a product by a power of
two, floor, a difference, rint, a cast) and sums the limbs as int64 arrays:
the compiled pass must give the same integers, and the same column maxima.
"""

import numpy as np
import pytest

from prbmrm.kernels.fixed import column_max_abs, fixed_point_limbs, fixed_point_sums


def numpy_limbs(partials, exponent, bits):
    scaled = partials * np.ldexp(1.0, 2 * bits - exponent)
    high = np.floor(scaled * 2.0 ** -bits)
    low = np.rint(scaled - high * 2.0 ** bits)
    return high.astype(np.int64).sum(axis=0), low.astype(np.int64).sum(axis=0)


def partials_of(seed, k, n):
    rng = np.random.default_rng(seed)
    partials = rng.normal(size=(k, n)) * 10.0 ** rng.integers(-12, 12, size=(k, n))
    partials[rng.random((k, n)) < 0.2] = 0.0
    partials[0, : n // 2] = -0.0
    # Entries on the grid's half points: rint rounds them to even.
    partials[-1, :] = np.ldexp(rng.integers(-8, 8, size=n) + 0.5, -20)
    return partials


@pytest.mark.parametrize("k, n, bits", [(1, 7, 52), (256, 124, 52), (3, 300, 60), (40, 1, 40)])
def test_limbs_are_the_numpy_steps_bitwise(k, n, bits):
    partials = partials_of(k * n, k, n)
    # Bounds as FixedPointSum sets them (some components far above their entries).
    exponent = np.frexp(np.abs(partials).max(axis=0))[1] + 4
    exponent = np.maximum(exponent, exponent.max() - 40)
    high, low = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    assert fixed_point_limbs(partials, np.ldexp(1.0, 2 * bits - exponent), bits, high, low)
    expected_high, expected_low = numpy_limbs(partials, exponent, bits)
    np.testing.assert_array_equal(high, expected_high)
    np.testing.assert_array_equal(low, expected_low)
    assert (low >= 0).all()


@pytest.mark.parametrize("bits", [40, 51, 52, 53, 60])
def test_limbs_of_entries_at_the_roundings_edges_are_the_numpy_steps(bits):
    # On the grid: halfway points (rint to even), the limbs' boundaries and the floats next to them, integers
    # from 2^51 to 2^53 (where float64 loses its fraction bits), the largest entry allowed below 2^(2 bits),
    # signed zeros and subnormal partials.
    up = 2.0 ** bits
    edges = np.array([0.5, 1.5, 2.5, 2.0 ** 51 - 0.5, 2.0 ** 51 + 0.5, 2.0 ** 52 - 0.5, 2.0 ** 52, 2.0 ** 52 + 1,
                      2.0 ** 53 + 2, up - 0.5, up - 1.0, up, up + 0.5, 3 * up, np.nextafter(up, 0),
                      np.nextafter(up, np.inf), np.nextafter(2.0 ** (2 * bits), 0)])
    grid = np.concatenate([edges, -edges, [0.0, -0.0]])
    exponent = np.arange(len(grid)) % 7 - 3
    scale = np.ldexp(1.0, 2 * bits - exponent)
    partials = np.vstack([grid / scale, np.full(len(grid), 5e-324), np.full(len(grid), -1e-310)])
    high, low = np.empty(len(grid), dtype=np.int64), np.empty(len(grid), dtype=np.int64)
    for row in partials:  # each entry's limbs alone, then their sums
        fixed_point_limbs(row[None], scale, bits, high, low)
        expected_high, expected_low = numpy_limbs(row[None], exponent, bits)
        np.testing.assert_array_equal(high, expected_high)
        np.testing.assert_array_equal(low, expected_low)
    fixed_point_limbs(partials, scale, bits, high, low)
    np.testing.assert_array_equal(np.stack([high, low]), np.stack(numpy_limbs(partials, exponent, bits)))


def test_limbs_of_mostly_zero_partials_are_the_numpy_steps():
    """Zero entries (+0.0 and -0.0, skipped by the kernel) add limbs of 0, as the numpy steps make them."""
    partials = partials_of(50 * 40, 50, 40)
    partials[np.random.default_rng(2).random(partials.shape) < 0.9] = 0.0
    partials[0, :5], partials[:, 7] = -0.0, -0.0
    exponent = np.frexp(np.abs(partials).max(axis=0))[1] + 4
    high, low = np.empty(40, dtype=np.int64), np.empty(40, dtype=np.int64)
    assert fixed_point_limbs(partials, np.ldexp(1.0, 2 * 52 - exponent), 52, high, low)
    np.testing.assert_array_equal(np.stack([high, low]), np.stack(numpy_limbs(partials, exponent, 52)))


@pytest.mark.parametrize("bits", [40, 52])
def test_limbs_refuse_an_entry_at_or_beyond_its_bound(bits):
    """The pass is the bound check: True while every entry lies below 2^(2 bits) on the grid (its component's
    bound 2^exponent), False at the first entry on or beyond it, infinite or NaN, whichever row or column."""
    exponent = np.array([0, 3, -2])
    scale = np.ldexp(1.0, 2 * bits - exponent)
    bound = np.ldexp(1.0, exponent)
    high, low = np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64)
    below = np.vstack([np.nextafter(bound, 0), -np.nextafter(bound, 0), np.zeros(3)])
    assert fixed_point_limbs(below, scale, bits, high, low)
    for bad in (bound[1], -bound[1], 2 * bound[1], np.inf, -np.inf, np.nan):
        partials = below.copy()
        partials[2, 1] = bad
        assert not fixed_point_limbs(partials, scale, bits, high, low)


def test_column_maxima_are_numpys_and_keep_nan():
    partials = partials_of(5, 30, 20)
    partials[4, 3], partials[7, 5], partials[9, 5] = np.nan, np.inf, np.nan
    partials[:, 6] = 0.0
    out = np.full(20, -1.0)
    column_max_abs(partials, out)
    expected = np.maximum(np.max(partials, axis=0, initial=0.0), -np.min(partials, axis=0, initial=0.0))
    np.testing.assert_array_equal(out, expected)  # NaN where numpy has NaN; +0.0 and -0.0 compare equal
    assert np.isnan(out[3]) and np.isnan(out[5]) and out[6] == 0.0


def test_shapes_that_do_not_agree_are_refused():
    with pytest.raises(ValueError):
        fixed_point_limbs(np.zeros((2, 3)), np.ones(2), 52, np.empty(3, np.int64), np.empty(3, np.int64))
    with pytest.raises(ValueError):
        column_max_abs(np.zeros((2, 3)), np.empty(2))


def numpy_sums(high, low, exponent, bits):
    """The float64 sums of two-limb sums, with numpy's ufuncs (the form fixed_point_sums replaces)."""
    high = high + (low >> bits)  # the carry of the low sums, which are >= 0
    low = low & ((1 << bits) - 1)
    return np.ldexp(high.astype(np.float64), exponent - bits) + np.ldexp(low.astype(np.float64), exponent - 2 * bits)


@pytest.mark.parametrize("bits", [40, 52, 53, 60])
def test_sums_are_the_numpy_steps_bitwise(bits):
    rng = np.random.default_rng(bits)
    n = 4000
    # Limb sums of up to 2^62 in size: high of either sign, low >= 0 with carries; exponents from
    # subnormal results to large ones, as FixedPointSum keeps them (int16).
    high = rng.integers(-2 ** 62, 2 ** 62, n) >> rng.integers(0, 62, n)
    low = rng.integers(0, 2 ** 62, n) >> rng.integers(0, 62, n)
    exponent = rng.integers(-1000, 1000, n).astype(np.int16)
    high[:4], low[:4] = [0, -1, 2 ** 61, -(2 ** 61)], [0, (1 << bits) - 1, 1 << bits, (1 << bits) + 1]
    out = np.empty(n)
    fixed_point_sums(high, low, exponent, bits, out)
    expected = numpy_sums(high, low, exponent, bits)
    np.testing.assert_array_equal(out.view(np.int64), expected.view(np.int64))  # the bits, signed zeros too
