"""The compiled active-set method (prbmrm.kernels.activeset.active_set).

References: cvxpy's optimum of ``min 0.5 x^T Q x - b^T x`` over the simplex, the KKT conditions checked with
numpy from the returned point, and the definitions of the statuses (a singular start, an indefinite Q).
"""

import cvxpy as cp
import numpy as np
import pytest

from prbmrm.kernels.activeset import NOT_PSD, SINGULAR_START, SOLVED, active_set, reduced_hessian

EPS = np.finfo(np.float64).eps


def floors(Q, b):
    """The pivot floor and the gradient's rounding level, as solve_simplex_qp sets them."""
    scale = float(Q.diagonal().max())
    return 1e-12 * scale, 64 * EPS * (scale + float(np.abs(b).max()))


def cvxpy_value(Q, b, G):
    x = cp.Variable(b.size)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(G.T @ x) - b @ x), [x >= 0, cp.sum(x) == 1])
    problem.solve(solver=cp.CLARABEL)
    return problem.value


@pytest.mark.parametrize("seed", range(3))
def test_solves_from_a_vertex_and_from_a_warm_start_to_cvxpys_optimum(seed):
    rng = np.random.default_rng(seed)
    for _ in range(15):
        t, d = int(rng.integers(2, 40)), int(rng.integers(1, 25))
        G = rng.normal(size=(t, d))
        Q, b = G @ G.T, rng.normal(size=t)
        pd_floor, noise = floors(Q, b)
        reference = cvxpy_value(Q, b, G)
        starts = [np.eye(t)[int(np.argmax(b - 0.5 * Q.diagonal()))]]
        warm = np.zeros(t)
        warm[: t - 1] = rng.dirichlet(np.ones(t - 1))  # a previous solution padded with 0: affinely free here
        starts.append(warm if d >= t - 1 else starts[0].copy())
        for x in starts:
            status, iterations, converged = active_set(Q, b, x, 1e-12, 10 * t + 100, pd_floor, noise)
            assert status == SOLVED and converged and iterations <= 10 * t + 100
            assert x.min() >= 0.0 and abs(x.sum() - 1.0) <= 1e-12
            g = Q @ x - b
            assert x @ g - g.min() <= 1e-9 * (1 + abs(x @ g))  # the duality gap: KKT
            assert 0.5 * x @ Q @ x - b @ x == pytest.approx(reference, rel=1e-6, abs=1e-8)


def test_a_start_on_dependent_planes_is_handed_back_then_solved_when_not_first():
    rng = np.random.default_rng(7)
    G = rng.normal(size=(6, 3))
    G[3] = G[0]  # the same plane twice: a reduced Hessian singular to rounding on a support holding both
    Q, b = G @ G.T, rng.normal(size=6)
    pd_floor, noise = floors(Q, b)
    x = np.full(6, 1 / 6)
    status, iterations, _ = active_set(Q, b, x.copy(), 1e-12, 200, pd_floor, noise)
    assert (status, iterations) == (SINGULAR_START, 0)
    status, _, converged = active_set(Q, b, x, 1e-12, 200, pd_floor, noise, first=False)
    assert status == SOLVED and converged
    assert 0.5 * x @ Q @ x - b @ x == pytest.approx(cvxpy_value(Q, b, G), rel=1e-6, abs=1e-8)


def test_a_reduced_hessian_no_shift_makes_positive_definite_is_reported():
    # An indefinite Q is shifted into a factorable one (up to 10^28 times the floor); a NaN never is.
    Q, b = np.eye(3), np.zeros(3)
    Q[0, 1] = Q[1, 0] = np.nan
    status, _, converged = active_set(Q, b, np.full(3, 1 / 3), 1e-12, 100, 1e-12, 64 * EPS)
    assert status == NOT_PSD and not converged
    status, _, _ = active_set(-np.eye(3), b, np.full(3, 1 / 3), 1e-12, 100, 1e-12, 64 * EPS)
    assert status == SINGULAR_START


def test_inputs_it_cannot_use_are_refused():
    Q, b = np.eye(3), np.zeros(3)
    with pytest.raises(ValueError, match="no positive entry"):
        active_set(Q, b, np.zeros(3), 1e-12, 100, 1e-12, 64 * EPS)
    with pytest.raises(ValueError, match="at least 3 x 3"):
        active_set(Q[:2, :2], b, np.full(3, 1 / 3), 1e-12, 100, 1e-12, 64 * EPS)


def test_an_overflowed_candidate_is_not_taken_for_convergence():
    # Scores that overflow to NaN (inf / inf) are taken as numpy's argmax takes them, not passed over: the
    # point e_0 is not optimal (f(e_0) = 7.2e307 > f(e_1) = 0 with b = 0), so no convergence may be reported.
    G = np.array([[1.2e154], [-1.2e154]])
    x = np.array([1.0, 0.0])
    status, _, converged = active_set(G @ G.T, np.zeros(2), x, 1e-10, 120, 1e-12 * 1.44e308, 0.0)
    assert not (status == SOLVED and converged and x[0] == 1.0)


def test_reads_the_leading_block_of_a_larger_buffer():
    # BMRM hands over a view into its Gram buffer: rows longer than t, and nothing beyond the block may be read.
    rng = np.random.default_rng(3)
    G = rng.normal(size=(9, 4))
    Q, b = G @ G.T, rng.normal(size=9)
    buffer = np.full((13, 13), np.nan)
    buffer[:9, :9] = Q
    pd_floor, noise = floors(Q, b)
    x, y = np.eye(9)[0], np.eye(9)[0]
    assert active_set(buffer[:9, :9], b, x, 1e-12, 200, pd_floor, noise)[0] == SOLVED
    active_set(Q, b, y, 1e-12, 200, pd_floor, noise)
    assert np.array_equal(x, y)


def test_the_reduced_hessian_is_the_gram_matrix_of_the_planes_less_the_reference():
    # With Q = G G^T, H is the Gram matrix of the rows G_i - G_r over the support (r its largest entry).
    rng = np.random.default_rng(11)
    G = rng.normal(size=(8, 5))
    x = np.array([0.1, 0.0, 0.3, 0.3, 0.0, 0.2, 0.1, 0.0])
    S, H = reduced_hessian(G @ G.T, x)
    assert S[0] == 2 and sorted(S) == [0, 2, 3, 5, 6]  # the first of the two largest entries is the reference
    D = G[S[1:]] - G[S[0]]
    np.testing.assert_allclose(H, D @ D.T, rtol=1e-12, atol=1e-12)
