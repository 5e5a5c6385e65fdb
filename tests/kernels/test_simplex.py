"""The compiled projected-gradient steps (prbmrm.kernels.simplex.pg_steps).

References: the simplex's definition and the KKT conditions of
``min 0.5 x^T Q x - b^T x`` over it (checked here with numpy from the
returned point), and cvxpy's optimum of the same QP.
"""

import cvxpy as cp
import numpy as np
import pytest

from prbmrm.kernels.simplex import pg_steps


def problems(count, seed):
    """Simplex QPs as BMRM hands them over: (Gram buffer larger than t x t, b, x0, tol, below, scale)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        t, d = int(rng.integers(1, 60)), int(rng.integers(1, 30))
        G = rng.normal(size=(t, d)) * 10.0 ** rng.uniform(-2, 2)
        pad = int(rng.integers(0, 4))
        buffer = np.full((t + pad, t + pad), np.nan)  # only the leading t x t block may be read
        buffer[:t, :t] = G @ G.T
        x0 = np.zeros(t)
        k = max(1, t // int(rng.integers(1, 5)))
        x0[:k] = rng.uniform(size=k)
        x0 /= x0.sum() * rng.choice([1.0, 2.0])
        b, scale = rng.normal(size=t) * 10.0 ** rng.uniform(-2, 1), float(10.0 ** rng.uniform(-2, 2))
        # BMRM's tolerances are relative to the QP's size: an absolute one far below its rounding is unreachable.
        tol = float(10.0 ** rng.uniform(-9, -4)) * (scale * np.abs(buffer[:t, :t]).max() + np.abs(b).max())
        yield buffer, b, x0, tol, bool(rng.integers(0, 2)), scale


@pytest.mark.parametrize("seed", range(4))
def test_steps_end_on_the_simplex_at_a_kkt_point(seed):
    done = 0
    for buffer, b, x0, tol, below, scale in problems(25, seed):
        t = b.size
        x = np.empty(t)
        steps, converged = pg_steps(buffer, scale, b, x0, x, tol, below, 20000)
        assert 0 <= steps <= 20000
        # A point of the simplex (below: of {x >= 0, sum(x) <= 1}) up to rounding.
        assert x.min() >= 0.0 and (x.sum() <= 1.0 + 1e-12 if below else abs(x.sum() - 1.0) <= 1e-12)
        # KKT (BMRM 2.1's test, from the gradient computed here): g = Qx - b within tol of its mean on the
        # support of x, and no smaller than that mean minus tol elsewhere (rounding allowed for).
        g = scale * buffer[:t, :t] @ x - b
        support = x > 1e-15
        noise = 1e-12 * (scale * np.abs(buffer[:t, :t]).max() + np.abs(b).max())
        if converged and support.any():  # an ill-conditioned QP at a tight tolerance may run out of steps
            done += 1
            level = g[support].mean()
            assert np.all(np.abs(g[support] - level) <= tol + noise)
            assert np.all(g[~support] >= level - tol - noise)
    assert done >= 20


@pytest.mark.parametrize("seed", range(3))
def test_steps_reach_cvxpys_optimum(seed):
    for buffer, b, x0, _, below, scale in problems(6, 100 + seed):
        t = b.size
        Q = scale * buffer[:t, :t]
        x = np.empty(t)
        _, converged = pg_steps(buffer, scale, b, x0, x, 1e-12 * (np.abs(Q).max() + np.abs(b).max()), below,
                                1000000)
        assert converged
        z = cp.Variable(t)
        L = np.linalg.cholesky(Q + 1e-12 * np.trace(Q) / t * np.eye(t))
        constraints = [z >= 0, cp.sum(z) <= 1 if below else cp.sum(z) == 1]
        problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(L.T @ z) - b @ z), constraints)
        problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        ours = 0.5 * x @ Q @ x - b @ x
        scale_of = 1.0 + abs(problem.value) + np.abs(b).sum()
        assert ours <= problem.value + 1e-7 * scale_of


def test_steps_are_deterministic_and_read_only_the_leading_block():
    buffer, b, x0, tol, below, scale = next(problems(1, 7))
    t = b.size
    tight = np.ascontiguousarray(buffer[:t, :t])
    first, second = np.empty(t), np.empty(t)
    assert pg_steps(buffer, scale, b, x0, first, tol, below, 1000) == pg_steps(tight, scale, b, x0, second, tol,
                                                                               below, 1000)
    assert first.tobytes() == second.tobytes()


def test_a_step_limit_stops_without_convergence_on_a_feasible_point():
    buffer, b, x0, _, below, scale = next(problems(1, 11))
    x = np.empty(b.size)
    steps, converged = pg_steps(buffer, scale, b, x0, x, 1e-14, below, 1)
    assert steps <= 1 and x.min() >= 0.0


def test_arrays_of_the_wrong_shapes_are_refused():
    with pytest.raises(ValueError):
        pg_steps(np.eye(2), 1.0, np.ones(3), np.ones(3), np.empty(3), 1e-6, False, 10)
    with pytest.raises(ValueError):
        pg_steps(np.eye(3), 1.0, np.ones(3), np.ones(2), np.empty(3), 1e-6, False, 10)
    with pytest.raises(ValueError):
        pg_steps(np.eye(0), 1.0, np.ones(0), np.ones(0), np.empty(0), 1e-6, False, 10)
