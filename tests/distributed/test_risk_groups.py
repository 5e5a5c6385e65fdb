"""The risk oracle's work per group of blocks (issue 13, P8): the CSR pass of scalar losses and the line objects.

References: a brute-force numpy loop over each block's rows (scipy's product
per block, the old path's arithmetic), oracles holding only some of the
blocks (as a rank does, with the group cuts elsewhere), and the risk
evaluated afresh along the line.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import prbmrm.kernels.blocks
from helpers import load_svmlight
from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.losses.line import block_sums
from prbmrm.distributed.oracle import DistributedRisk

LOSSES = ["hinge", "logistic", "squared_hinge", "huber_hinge"]


@pytest.fixture
def small_groups(monkeypatch):
    """Chunks of about 3,000 nonzeros and groups of at most 700 rows: blocks are cut and packed."""
    monkeypatch.setattr(prbmrm.kernels.blocks, "_CHUNK_NONZEROS", 3000)
    monkeypatch.setattr(prbmrm.kernels.blocks, "_GROUP_ROWS", 700)


def blocks_of(n):
    """Uneven block boundaries over n rows: tiny, empty, and blocks of several chunks."""
    return np.array([0, 3, 3, 150, 400, 401, 1300, 1500, 1700, 1750, n])


def a9a_rows(n=2500):
    X, y = load_svmlight("a9a.xz")
    return sp.csr_matrix(X[:n]), y[:n]


def partials_at(oracle, w):
    """The oracle's per-block partial sums at w, as its observer sees them (before they are added)."""
    seen = []
    oracle.observer = lambda _, partials: seen.append(partials.copy())
    oracle(w)
    return seen[0]


def per_block_reference(loss, X, y, bounds, w):
    """Risk and gradient of each block, by a plain numpy loop over its rows (one product per block)."""
    rows = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        f = X[a:b] @ w
        gradient = np.zeros(X.shape[1])
        for i in range(b - a):
            row = X[a + i]
            gradient[row.indices] += row.data * loss.derivative(f[i:i + 1], y[a + i:a + i + 1])[0]
        rows.append(np.append(gradient, np.sum(loss.value(f, y[a:b]))))
    return np.array(rows)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_grouped_pass_equals_the_per_block_reference(small_groups, loss_name):
    X, y = a9a_rows()
    bounds = blocks_of(X.shape[0])
    loss = get_loss(loss_name)
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    assert len(oracle._groups) > 3 and any(len(set(owners)) > 1 for _, _, _, owners in oracle._groups)
    rng = np.random.default_rng(1)
    for scale in (0.0, 0.05, 1.0):  # all, some and few rows active
        w = scale * rng.normal(size=X.shape[1])
        expected = per_block_reference(loss, X, y, bounds, w)
        np.testing.assert_allclose(partials_at(oracle, w), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_a_blocks_sums_do_not_depend_on_the_blocks_held_with_it(small_groups, loss_name):
    """Oracles holding blocks 2-5 or 4-8 alone (as ranks do) form those blocks' sums bitwise as one holding all."""
    X, y = a9a_rows()
    bounds = blocks_of(X.shape[0])
    w = 0.05 * np.random.default_rng(2).normal(size=X.shape[1])
    whole = partials_at(DistributedRisk(get_loss(loss_name), X, y, len(y), SerialComm(), bounds), w)
    for first, end in ((2, 6), (4, 9)):
        a, b = bounds[first], bounds[end]
        part = DistributedRisk(get_loss(loss_name), X[a:b], y[a:b], len(y), SerialComm(), bounds[first:end + 1] - a)
        np.testing.assert_array_equal(partials_at(part, w), whole[first:end])


@pytest.mark.parametrize("loss_name", ["hinge", "squared_hinge"])
def test_gathering_the_active_rows_or_not_gives_the_same_bits(small_groups, loss_name, monkeypatch):
    """X^T l' over the rows with l' != 0 alone (gathered) or over all rows: the same sums, bitwise."""
    X, y = a9a_rows()
    bounds = blocks_of(X.shape[0])
    rng = np.random.default_rng(4)
    for scale in (0.0, 0.05, 1.0):
        w = scale * rng.normal(size=X.shape[1])
        results = []
        for fraction in (0.0, 1.01):  # never, always gather
            monkeypatch.setattr(prbmrm.kernels.blocks, "_ACTIVE_FRACTION", fraction)
            results.append(partials_at(DistributedRisk(get_loss(loss_name), X, y, len(y), SerialComm(), bounds), w))
        np.testing.assert_array_equal(*results)


def test_block_sums_are_those_of_each_block_alone():
    values = np.random.default_rng(3).normal(size=1000) * 1e3
    starts = np.array([0, 0, 1, 17, 17, 500, 999, 1000])
    sums = block_sums(values, starts)
    for total, a, b in zip(sums, starts[:-1], starts[1:]):
        assert total == block_sums(values[a:b].copy(), [0, b - a])[0]
        assert total == pytest.approx(np.sum(values[a:b]), rel=1e-12, abs=1e-9)
    assert np.array_equal(block_sums(np.empty(0), [0, 0, 0]), [0.0, 0.0])


def line_case(loss_name):
    X, y = a9a_rows()
    bounds = blocks_of(X.shape[0])
    oracle = DistributedRisk(get_loss(loss_name), X, y, len(y), SerialComm(), bounds)
    rng = np.random.default_rng(4)
    return oracle, X, y, bounds, 0.05 * rng.normal(size=X.shape[1]), 0.05 * rng.normal(size=X.shape[1])


@pytest.mark.parametrize("loss_name", ["hinge", "logistic", "epsilon_insensitive", "least_squares"])
def test_line_sums_per_block_equal_each_block_alone(small_groups, loss_name):
    """The rank's line objects give every block the sums of that block's own line object, bitwise, round after round."""
    if loss_name in ("epsilon_insensitive", "least_squares"):
        X, _ = a9a_rows()
        y = np.random.default_rng(5).normal(size=X.shape[0])
        bounds = blocks_of(X.shape[0])
        loss = get_loss(loss_name)
        rng = np.random.default_rng(4)
        w, d = 0.05 * rng.normal(size=X.shape[1]), 0.05 * rng.normal(size=X.shape[1])
    else:
        oracle, X, y, bounds, w, d = line_case(loss_name)
        loss = oracle.loss
    F0, dF = X @ w, X @ d
    together = loss.lines(F0, dF, y, bounds)
    alone = [loss.lines(F0[a:b], dF[a:b], y[a:b], [0, b - a]) for a, b in zip(bounds[:-1], bounds[1:])]
    k = 16 if together.exact else 3
    lo, hi = 0.0, np.inf
    for _ in range(3):
        etas = lo + np.linspace(0.0, 1.0 if hi == np.inf else hi - lo, k + 1, endpoint=False)[1:]
        sums, ends = together.evaluate_parts(etas, lo, hi)
        assert sums.shape == (len(alone), 3, k)
        for part, line in zip(sums, alone):
            np.testing.assert_array_equal(part, line.evaluate_parts(etas, lo, hi)[0][0])
        lo, hi = etas[k // 3], etas[k // 3 + 1]


@pytest.mark.parametrize("loss_name", ["hinge", "logistic"])
def test_line_rounds_match_the_risk_evaluated_along_the_line(small_groups, loss_name):
    """R_emp and its one-sided slopes from a round equal fresh evaluations at w + eta d (finite differences)."""
    oracle, X, y, bounds, w, d = line_case(loss_name)
    line = oracle.line(w, d)
    assert line.exact == (loss_name == "hinge")
    etas = np.array([0.0, 0.3, 1.0]) if not line.exact else np.linspace(0.0, 3.0, 16)
    values, left, right, below, above = line(etas, 0.0, np.inf)
    line.close()
    for eta, value, slope_left, slope_right, start, end in zip(etas, values, left, right, below, above):
        risk = oracle(w + eta * d)[0]
        assert value == pytest.approx(risk, rel=1e-12)
        if line.exact:
            # Linear between the breakpoints nearest eta: the difference quotients are the one-sided slopes.
            h = 0.5 * (end - eta)
            assert (oracle(w + (eta + h) * d)[0] - risk) / h == pytest.approx(slope_right, rel=1e-7, abs=1e-9)
            if eta > 0:
                h = 0.5 * (eta - start)
                assert (risk - oracle(w + (eta - h) * d)[0]) / h == pytest.approx(slope_left, rel=1e-7, abs=1e-9)
        else:
            h = 1e-6
            central = (oracle(w + (eta + h) * d)[0] - oracle(w + (eta - h) * d)[0]) / (2 * h)
            assert slope_left == slope_right == pytest.approx(central, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("loss_name", ["hinge", "zero_hinge", "epsilon_insensitive"])
def test_grouped_argsup_equals_the_per_block_one(small_groups, loss_name):
    """subLBFGS's argsup per group of blocks: the per-block steepest_gradient's sums, rows on kinks included."""
    from prbmrm.solvers.sublbfgs import ArgsupRanks

    X, y = a9a_rows()
    if loss_name == "epsilon_insensitive":
        y = np.random.default_rng(6).normal(size=len(y))
    bounds = blocks_of(X.shape[0])
    oracle = DistributedRisk(get_loss(loss_name), X, y, len(y), SerialComm(), bounds)
    grouped, per_block = ArgsupRanks(oracle), ArgsupRanks(oracle)
    assert grouped._grouped
    per_block._grouped = False
    rng = np.random.default_rng(7)
    w, p = 0.05 * rng.normal(size=X.shape[1]), rng.normal(size=X.shape[1])
    if loss_name == "zero_hinge":
        w[:] = 0.0  # every row on the kink: the piece ahead along p is taken
    for service in (grouped, per_block):
        service.buffer[:] = np.concatenate([w, p])
    value, plane, gradient = grouped.handle(0)
    expected = per_block.handle(0)
    assert value == pytest.approx(expected[0], rel=1e-12) and plane == pytest.approx(expected[1], rel=1e-12)
    np.testing.assert_allclose(gradient, expected[2], rtol=1e-12, atol=1e-15)


def test_row_views_give_scipy_results_without_stale_entries():
    # scipy builds the result of multiply and + in arrays sized for the most nonzeros and
    # prunes them; a view that skipped the trim kept uninitialized values that sum(axis=1)
    # read (Pragam's ||x_i||^2 came out inf/NaN on some runs).
    X = sp.random(400, 60, density=0.1, format="csr", random_state=3)
    view = prbmrm.kernels.blocks.row_block(X, 100, 350)
    dense = X.toarray()[100:350]
    for result, expected in [(view.multiply(view), dense * dense), (view + view, 2 * dense),
                             (view.T.multiply(view.T), (dense * dense).T)]:
        assert len(result.data) == len(result.indices) == result.nnz
        np.testing.assert_allclose(np.asarray(result.sum(axis=1)).ravel(), expected.sum(axis=1), rtol=1e-14)
        np.testing.assert_array_equal(result.toarray(), expected)
    assert np.shares_memory(view.data, X.data) and np.shares_memory(view.T.data, X.data)


def test_gradients_into_out_are_the_new_arrays_bits_and_never_alias_one():
    # out= reuses one array; without it every call hands over a new one. On one rank the pass reads w
    # itself (no copy into the message): any w, contiguous or not, gives the bits of a copy of it.
    X, y = a9a_rows(1200)
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm(), blocks=[0, 500, 1200])
    rng = np.random.default_rng(5)
    w1, w2 = rng.normal(size=X.shape[1]) * 0.1, rng.normal(size=X.shape[1]) * 0.1
    r1, a1 = oracle(w1)
    r2, a2 = oracle(w2)
    assert a1 is not a2 and not np.shares_memory(a1, a2)
    assert r1 != r2 and not np.array_equal(a1, a2)
    out = np.full(X.shape[1], np.nan)
    s1, b1 = oracle(w1, out=out)
    assert b1 is out and s1 == r1
    np.testing.assert_array_equal(out, a1)
    kept = out.copy()
    s2, b2 = oracle(w2, out=out)
    assert b2 is out and s2 == r2
    np.testing.assert_array_equal(out, a2)
    assert not np.array_equal(kept, out)  # the first gradient, kept by copying, is not the second
    strided = np.repeat(w1, 2)[::2]
    assert not strided.flags.c_contiguous
    r3, a3 = oracle(strided)
    assert r3 == r1
    np.testing.assert_array_equal(a3, a1)
    np.testing.assert_array_equal(a1, per_block_reference(get_loss("hinge"), X, y, [0, 1200], w1)[0, :-1] / len(y))
