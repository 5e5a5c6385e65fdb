"""The exact sum of the risk oracle (:class:`prbmrm.distributed.exact.FixedPointSum`): bitwise independent of
how the blocks are grouped on ranks and of the order of the integer additions, and as accurate as stated
(against ``math.fsum``, the correctly rounded sum)."""

import math

import numpy as np

from prbmrm.distributed.comm import SerialComm, SupportRows
from prbmrm.distributed.exact import FAILED, OVERFLOW, FixedPointSum


def _partials(seed, k=40, n=300):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(k, n)) * 10.0 ** rng.integers(-8, 8, size=(k, n))


def _reduce(partials, groups, order, state):
    """What an Allreduce of the ranks' buffers gives: each group (rank) encodes its rows, the buffers are
    added as integers in `order`; the sum is decoded."""
    buffers = []
    for rows in groups:
        state.encode(partials[rows])
        buffers.append(state.buffer.copy())
    total = np.zeros_like(state.buffer)
    for i in order:
        total += buffers[i]
    state.buffer[:] = total
    return state.decode()


def test_any_grouping_and_order_gives_the_same_bits_within_the_stated_bound():
    partials = _partials(0)
    k, n = partials.shape
    state = FixedPointSum(n, k)
    reference = SerialComm().exact_sum(partials, state)  # the first sum sets the bounds
    assert state.retries == 1
    rng = np.random.default_rng(1)
    for ranks in (1, 2, 3, 7, 40):
        cuts = np.sort(rng.choice(np.arange(1, k), size=ranks - 1, replace=False))
        groups = np.split(np.arange(k), cuts)
        got = _reduce(partials, groups, rng.permutation(ranks), state)
        np.testing.assert_array_equal(got, reference)
    exact = np.array([math.fsum(column) for column in partials.T])
    largest = np.abs(partials).max(axis=0)
    unit = np.ldexp(1.0, state.exponent - 2 * state.bits)
    assert np.all(unit <= np.ldexp(largest, 5 - 2 * state.bits) + np.ldexp(largest.max(), -100))
    bound = k * unit + 2 * np.spacing(np.abs(exact))
    assert np.all(np.abs(reference - exact) <= bound)


def test_rows_kept_on_their_supports_give_the_bits_of_dense_rows():
    rng = np.random.default_rng(2)
    dense = _partials(3, k=6, n=50)
    supports = [np.sort(rng.choice(49, size=10, replace=False)) for _ in range(6)]
    rows = SupportRows(supports, 50)
    masked = np.zeros_like(dense)
    for i, support in enumerate(supports):
        index = np.append(support, 49)
        masked[i, index] = dense[i, index]
        rows.store(i, masked[i])
    a, b = FixedPointSum(50, 6), FixedPointSum(50, 6)
    np.testing.assert_array_equal(SerialComm().exact_sum(rows, a), SerialComm().exact_sum(masked, b))
    assert not np.any(np.signbit(SerialComm().exact_sum(rows, a)[masked.any(axis=0) == 0]))


def test_a_partial_beyond_the_bounds_raises_them_and_a_failure_makes_the_sum_nan():
    partials = _partials(4, k=5, n=20)
    state = FixedPointSum(20, 5)
    SerialComm().exact_sum(partials, state)
    grown = partials * 1e6
    np.testing.assert_array_equal(SerialComm().exact_sum(grown, state),
                                  SerialComm().exact_sum(grown, FixedPointSum(20, 5)))
    assert state.retries == 2 and state.status[OVERFLOW] == 0
    assert np.all(np.isnan(SerialComm().exact_sum(partials, state, failed=True)))
    assert state.status[FAILED] == 1
    partials[2, 3] = np.inf
    assert np.all(np.isnan(SerialComm().exact_sum(partials, state)))


def test_one_limb_gives_the_same_bits_for_any_grouping_within_its_error_bound():
    # The precision statement of prbmrm/distributed/exact.py for one limb, against math.fsum.
    partials = _partials(5)
    k, n = partials.shape
    state = FixedPointSum(n, k, limbs=1)
    reference = SerialComm().exact_sum(partials, state)
    assert len(state.buffer) == n + len(state.status)
    rng = np.random.default_rng(6)
    for ranks in (2, 5, 40):
        cuts = np.sort(rng.choice(np.arange(1, k), size=ranks - 1, replace=False))
        got = _reduce(partials, np.split(np.arange(k), cuts), rng.permutation(ranks), state)
        np.testing.assert_array_equal(got, reference)
    exact = np.array([math.fsum(column) for column in partials.T])
    bound = state.error_bound(reference)
    assert np.all(np.abs(reference - exact) <= bound)
    # Not vacuous: about a rounding per block at the largest partial's scale (2^-(W - MARGIN_BITS - 1)).
    largest = np.abs(partials).max(axis=0)
    assert np.all(bound <= k * np.ldexp(largest, 5 - state.bits) + 2.0 ** -52 * np.abs(exact)
                  + np.ldexp(largest.max(), 2 - state.bits - 40))
    assert state.error_bound(reference).max() > 0 and FixedPointSum(n, k).error_bound(reference) is None


def test_switching_limbs_keeps_the_bounds_and_two_limbs_are_the_closer_sum():
    partials = _partials(7, k=12, n=80)
    state = FixedPointSum(80, 12)
    two = SerialComm().exact_sum(partials, state)
    exponent = state.exponent.copy()
    state.set_limbs(1)
    one = SerialComm().exact_sum(partials, state)
    np.testing.assert_array_equal(state.exponent, exponent)
    assert state.retries == 1
    exact = np.array([math.fsum(column) for column in partials.T])
    assert np.all(np.abs(one - exact) <= state.error_bound(one))
    assert np.all(np.abs(two - exact) <= np.abs(one - exact) + 2 * np.spacing(np.abs(exact)))
    state.set_limbs(2)
    np.testing.assert_array_equal(SerialComm().exact_sum(partials, state), two)


def test_chunks_of_any_size_give_the_bits_of_one_pass(monkeypatch):
    """Encoding, measuring, rescaling and decoding a few components at a time (what keeps the temporaries
    small at d in the millions) gives what one pass over all components gives, dense rows and rows kept
    on their supports alike, into a given array too."""
    from prbmrm.distributed import exact

    rng = np.random.default_rng(5)
    dense = _partials(6, k=4, n=103)
    supports = [np.sort(rng.choice(102, size=30, replace=False)) for _ in range(4)]
    rows = SupportRows(supports, 103)
    for i, support in enumerate(supports):
        rows.store(i, np.where(np.isin(np.arange(103), np.append(support, 102)), dense[i], 0.0))
    grown = dense * 1e5  # beyond the first bounds: a rescale that keeps the larger of old and new
    expected = []
    for chunk in (exact.CHUNK, 7, 1):
        monkeypatch.setattr(exact, "CHUNK", chunk)
        state, out = FixedPointSum(103, 4), np.empty(103)
        got = [SerialComm().exact_sum(dense, state), SerialComm().exact_sum(rows, state),
               SerialComm().exact_sum(grown, state, out=out), state.exponent.copy()]
        assert got[2] is out and state.retries == 2
        # Alone with an `out`, the limbs are decoded chunk by chunk, never stored: the bits of the stored ones.
        np.testing.assert_array_equal(SerialComm().exact_sum(grown, state), out)
        alone = FixedPointSum(103, 4)
        np.testing.assert_array_equal(SerialComm().exact_sum(dense, alone, out=np.empty(103)), got[0])
        assert not alone.buffer[:2 * 103].any()
        if not expected:
            expected = got
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
