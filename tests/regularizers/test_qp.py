"""Tests of prbmrm.regularizers.qp: the BMRM dual QP over the simplex, checked against cvxpy."""

import lzma
import warnings
from pathlib import Path

import cvxpy as cp
import numpy as np
import pytest

from helpers import data_path, printed_by_fresh_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from prbmrm.regularizers.qp import SimplexQPResult, solve_simplex_qp

A9A = Path(data_path("a9a.xz"))


def reference_value(G, b):
    """Dual value max b^T x - 0.5 |G^T x|^2 over the simplex, by cvxpy.

    Evaluated at cvxpy's x clipped onto the simplex: a feasible point, so
    never above the optimum even when the interior-point solution is a hair
    infeasible.
    """
    x = cp.Variable(b.size)
    problem = cp.Problem(cp.Maximize(b @ x - 0.5 * cp.sum_squares(G.T @ x)),
                         [x >= 0, cp.sum(x) == 1])
    with warnings.catch_warnings():
        # Clarabel may flag the tightened tolerances as "inaccurate"; the
        # point is still far more accurate than the 1e-8 the tests ask for.
        warnings.simplefilter("ignore")
        problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    xv = np.maximum(x.value, 0.0)
    xv /= xv.sum()
    return b @ xv - 0.5 * np.sum((G.T @ xv) ** 2)


def assert_kkt(res, Q, b):
    """x on the simplex, value consistent with x, and the KKT conditions."""
    x = res.x
    assert x.min() >= 0.0
    assert abs(x.sum() - 1.0) <= 1e-12
    assert res.value == pytest.approx(b @ x - 0.5 * x @ Q @ x, rel=1e-12, abs=1e-12)
    # KKT: g = Qx - b equals its x-weighted mean mu on the support and is
    # >= mu everywhere; mu - min(g) bounds the suboptimality from above.
    g = Q @ x - b
    mu = x @ g
    scale = 1.0 + abs(res.value) + 1e-13 * (np.abs(Q).max() + np.abs(b).max())
    assert mu - g.min() <= 1e-9 * scale
    assert np.all(np.abs(g[x > 0] - mu) <= 1e-9 * scale)


def assert_solution(res, Q, b, G=None, rtol=1e-8):
    """Converged, feasible, KKT, and (given Q = G G^T) cvxpy's optimum."""
    assert isinstance(res, SimplexQPResult)
    assert res.converged
    assert res.x.shape == b.shape
    assert_kkt(res, Q, b)
    if G is not None:
        ref = reference_value(G, b)
        assert res.value == pytest.approx(ref, rel=rtol, abs=rtol)


def test_random_full_rank():
    rng = np.random.default_rng(0)
    for t in (5, 30, 80):
        G = rng.standard_normal((t, t + 10))
        b = rng.standard_normal(t)
        assert_solution(solve_simplex_qp(G @ G.T, b), G @ G.T, b, G)


def test_rank_deficient():
    rng = np.random.default_rng(1)
    for t, d in ((40, 3), (100, 10), (60, 1)):
        G = rng.standard_normal((t, d))
        b = rng.standard_normal(t)
        Q = G @ G.T
        assert np.linalg.matrix_rank(Q) == d
        assert_solution(solve_simplex_qp(Q, b), Q, b, G)


@pytest.mark.parametrize("noise", [0.0, 1e-12, 1e-9, 1e-6])
def test_duplicated_and_near_duplicated_rows(noise):
    rng = np.random.default_rng(2)
    base = rng.standard_normal((8, 5))
    G = base[rng.integers(0, 8, size=50)]
    G = G + noise * rng.standard_normal(G.shape)
    for b in (rng.standard_normal(50), np.zeros(50), 0.1 * np.round(5 * rng.standard_normal(50))):
        Q = G @ G.T
        assert_solution(solve_simplex_qp(Q, b), Q, b, G)


def test_ties_in_b():
    rng = np.random.default_rng(3)
    G = rng.standard_normal((30, 4))
    for b in (np.ones(30), np.round(rng.standard_normal(30))):
        Q = G @ G.T
        assert_solution(solve_simplex_qp(Q, b), Q, b, G)


def test_zero_hessian_is_an_lp():
    b = np.array([0.3, -1.0, 2.5, 2.5, 0.0])
    res = solve_simplex_qp(np.zeros((5, 5)), b)
    assert res.value == 2.5
    assert res.x[2] + res.x[3] == 1.0


def test_t_equals_one():
    res = solve_simplex_qp(np.array([[4.0]]), np.array([1.5]))
    assert res.x.tolist() == [1.0]
    assert res.value == 1.5 - 2.0
    assert res.converged


def test_t_equals_two():
    # Interior optimum: x = (0.75, 0.25) for Q = diag(1, 3), b = 0.
    res = solve_simplex_qp(np.diag([1.0, 3.0]), np.zeros(2))
    np.testing.assert_allclose(res.x, [0.75, 0.25], atol=1e-14)
    # Identical planes: any split is optimal, the value is what counts.
    G = np.array([[1.0, 2.0], [1.0, 2.0]])
    res = solve_simplex_qp(G @ G.T, np.array([0.5, 0.5]))
    assert res.value == pytest.approx(0.5 - 2.5, abs=1e-14)
    # A dominated plane: same gradient, lower offset.
    res = solve_simplex_qp(G @ G.T, np.array([0.5, 0.4]))
    assert res.x.tolist() == [1.0, 0.0]
    rng = np.random.default_rng(4)
    for _ in range(20):
        G = rng.standard_normal((2, 3))
        b = rng.standard_normal(2)
        assert_solution(solve_simplex_qp(G @ G.T, b), G @ G.T, b, G)


def test_starting_points():
    rng = np.random.default_rng(5)
    G = rng.standard_normal((60, 6))
    b = rng.standard_normal(60)
    Q = G @ G.T
    best = solve_simplex_qp(Q, b).value
    starts = [
        np.full(60, 1 / 60),  # a singular support: 60 planes in 6 dimensions
        np.eye(60)[7],
        rng.random(60),  # not on the simplex: projected
        rng.standard_normal(60),
        solve_simplex_qp(Q, b).x,
    ]
    for x0 in starts:
        res = solve_simplex_qp(Q, b, x0)
        assert_solution(res, Q, b)
        assert res.value == pytest.approx(best, rel=1e-10)
    # Started at its own solution, the solver only has to confirm it.
    assert res.iterations == 0


def test_iteration_limit_keeps_x_feasible():
    rng = np.random.default_rng(6)
    G = rng.standard_normal((80, 40))
    b = rng.standard_normal(80)
    res = solve_simplex_qp(G @ G.T, b, max_iter=2)
    assert not res.converged
    assert res.iterations == 2
    assert res.x.min() >= 0.0
    assert abs(res.x.sum() - 1.0) <= 1e-12


def test_bad_shapes():
    with pytest.raises(ValueError):
        solve_simplex_qp(np.eye(3), np.ones(2))
    with pytest.raises(ValueError):
        solve_simplex_qp(np.eye(3), np.ones(3), x0=np.ones(2))
    with pytest.raises(ValueError):
        solve_simplex_qp(np.zeros((0, 0)), np.zeros(0))


def test_bmrm_sequence_on_a9a():
    """Emulate BMRM (hinge loss, lam = 1e-4) on 3000 rows of a9a, warm-started."""
    from sklearn.datasets import load_svmlight_file

    with lzma.open(A9A) as f:
        X, y = load_svmlight_file(f, n_features=123)
    X, y = X[:3000].tocsr(), y[:3000]
    m, d = X.shape
    lam, n_iter = 1e-4, 80
    A = np.empty((n_iter, d))
    b = np.empty(n_iter)
    w = np.zeros(d)
    alpha = np.zeros(0)
    gaps = []
    for t in range(1, n_iter + 1):
        margin = y * (X @ w)
        risk = np.maximum(0.0, 1.0 - margin).mean()
        a = -(X.T @ (y * (margin < 1.0))) / m
        A[t - 1], b[t - 1] = a, risk - a @ w
        Q = A[:t] @ A[:t].T / lam
        res = solve_simplex_qp(Q, b[:t], np.append(alpha, 0.0))
        assert res.converged
        assert res.x.min() >= 0.0 and abs(res.x.sum() - 1.0) <= 1e-12
        if t % 10 == 0 or t <= 3:
            assert_solution(res, Q, b[:t], A[:t] / np.sqrt(lam))
            assert solve_simplex_qp(Q, b[:t]).value == pytest.approx(res.value, rel=1e-10)
        alpha = res.x
        w = -(A[:t].T @ alpha) / lam
        # J(w) - J_t(w): the BMRM gap shrinks towards zero.
        gaps.append(lam / 2 * w @ w + np.maximum(0.0, 1.0 - y * (X @ w)).mean() - res.value)
    assert min(gaps) < 1e-2 * gaps[0]


finite = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 25).flatmap(lambda t: st.tuples(
    arrays(np.float64, (t, 4), elements=finite),
    arrays(np.float64, t, elements=finite),
    st.booleans(),
    st.none() | arrays(np.float64, t, elements=st.floats(0.0, 1.0)),
)))
def test_property_matches_cvxpy(case):
    G, b, duplicate, x0 = case
    if duplicate and b.size > 1:
        G[-1] = G[0]
    Q = G @ G.T
    res = solve_simplex_qp(Q, b, x0)
    assert res.converged
    assert_kkt(res, Q, b)
    ref = reference_value(G, b)
    assert res.value >= ref - 1e-8 * (1.0 + abs(res.value))


@pytest.mark.parametrize("floor", [None, 0.0, 0.3])
@pytest.mark.parametrize("tol", [1e-1, 1e-3, 1e-8])
def test_projected_gradient_is_feasible_and_below_the_optimum(floor, tol):
    # BMRM's inexact rule: however loose tol, x is feasible and its dual
    # value is at most the optimum (with a floor, the optimum with the
    # plane (0, floor) added explicitly); tighter tol, closer to it.
    from prbmrm.regularizers.qp import solve_simplex_pg

    rng = np.random.default_rng(7)
    A = rng.normal(size=(30, 12))
    b = rng.normal(size=30)
    Q = A @ A.T / 0.1
    x0 = np.zeros(30)
    x0[:5] = 0.2 if floor is None else 0.1
    qp = solve_simplex_pg(Q, b, x0, tol, floor)
    x = qp.x
    assert np.all(x >= 0) and (abs(x.sum() - 1) <= 1e-12 if floor is None else x.sum() <= 1 + 1e-12)
    value = b @ x - 0.5 * x @ Q @ x + (0.0 if floor is None else floor * (1 - x.sum()))
    assert qp.value == pytest.approx(value, rel=1e-12, abs=1e-12)
    if floor is None:
        optimum = solve_simplex_qp(Q, b).value
    else:
        Qf = np.zeros((31, 31))
        Qf[1:, 1:] = Q
        optimum = solve_simplex_qp(Qf, np.concatenate(([floor], b))).value
    assert qp.converged and qp.value <= optimum + 1e-12
    assert optimum - qp.value <= 2 * tol * 10 + 1e-9


def _pg_cases():
    """Small simplex QPs (G, b, x0, floor) of BMRM's shape: t planes of d features, t > d included."""
    rng = np.random.default_rng(11)
    cases = []
    for t, d, floor in ((1, 3, None), (2, 4, 0.0), (7, 3, None), (12, 5, 0.2), (30, 12, None), (40, 8, 0.0)):
        G = rng.normal(size=(t, d)) / np.sqrt(0.05)
        b = rng.normal(size=t)
        x0 = np.zeros(t)
        x0[: max(1, t // 3)] = 1.0 / max(1, t // 3) * (0.5 if floor is not None else 1.0)
        cases.append((G, b, x0, floor))
    return cases


@pytest.mark.parametrize("case", range(6))
def test_projected_gradient_reaches_cvxpy_optimum(case):
    # At a tight tolerance the projected gradient is an exact solver: its
    # value is cvxpy's optimum (with a floor, that of the bundle with the
    # plane (0, floor) added explicitly) to the tolerance's gap.
    from prbmrm.regularizers.qp import solve_simplex_pg

    G, b, x0, floor = _pg_cases()[case]
    qp = solve_simplex_pg(G @ G.T, b, x0, 1e-10, floor, max_iter=100000)
    assert qp.converged
    if floor is None:
        reference = reference_value(G, b)
    else:
        reference = reference_value(np.vstack([np.zeros(G.shape[1]), G]), np.concatenate(([floor], b)))
    assert abs(qp.value - reference) <= 1e-8 * (1.0 + abs(reference))


def test_projected_gradient_reads_a_scaled_gram_buffer():
    # BMRM hands the bundle's Gram storage as it is (larger than t x t, its
    # leading block the matrix) with scale = 1 / lam: the same QP as the
    # scaled copy, to rounding.
    from prbmrm.regularizers.qp import solve_simplex_pg

    G, b, x0, floor = _pg_cases()[4]
    t, lam = b.size, 0.05
    buffer = np.full((t + 9, t + 9), np.nan)
    buffer[:t, :t] = G @ G.T * lam
    plain = solve_simplex_pg(G @ G.T, b, x0, 1e-6, floor)
    scaled = solve_simplex_pg(buffer, b, x0, 1e-6, floor, scale=1.0 / lam)
    assert scaled.converged and plain.converged
    assert scaled.value == pytest.approx(plain.value, rel=1e-9)
    assert np.allclose(scaled.x, plain.x, atol=1e-6)


def test_the_compiled_active_set_and_scipys_lapack_are_imported_at_the_first_solve():
    # The active-set kernel takes dpotrf, dpotrs and dtrtrs from scipy's public Cython LAPACK, which imports
    # scipy.linalg's package (50-100 ms of start-up): only once a QP needs them.
    code = ("import sys, numpy as np, prbmrm.regularizers.qp as qp; "
            "print('scipy.linalg' in sys.modules, 'prbmrm.kernels.activeset' in sys.modules); "
            "qp.solve_simplex_qp(np.eye(3), np.arange(3.0)); "
            "print('prbmrm.kernels.activeset' in sys.modules, 'scipy.linalg.cython_lapack' in sys.modules)")
    printed, errors = printed_by_fresh_python(code)
    assert printed == ["False", "False", "True", "True"], errors
