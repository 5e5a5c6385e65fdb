"""subLBFGS, OWL-QN and OWL-QN* (paper 003): the argsup oracle, the optimum against cvxpy / BMRM, the certified bound."""

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

from helpers import check_run_against_serial, load_svmlight, run_ranks
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import write_shards
from prbmrm.errors import UsageError
from prbmrm.losses import get_loss
from prbmrm.model import load_model
from prbmrm.regularizers import get_regularizer
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import minimize
from prbmrm.solvers.sublbfgs import LbfgsMatrix, descent_direction, risk_argsup


def oracle_of(loss, X, y, label_kind="binary"):
    loss = get_loss(loss)
    loss.prepare(np.unique(y) if label_kind != "multilabel" else np.arange(y.shape[1]), label_kind)
    return DistributedRisk(loss, X, y, len(y), SerialComm())


def a9a(m):
    X, y = load_svmlight("a9a.xz")
    return X[:m], y[:m]


# --------------------------------------------------------------------------
# The argsup oracle: <a, p> is the directional derivative (finite differences)
# --------------------------------------------------------------------------

def kink_problems():
    """Integer data and points where many examples sit exactly on a kink (exact in floating point)."""
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(rng.integers(0, 2, size=(60, 5)).astype(np.float64))
    yield "hinge", X, rng.choice([-1.0, 1.0], 60), "binary", np.eye(5)[0]
    yield "multiclass_hinge", X, rng.integers(0, 3, 60).astype(np.float64), "integer", np.zeros(15)
    yield "multilabel_hinge", X, rng.integers(0, 2, size=(60, 3)).astype(np.float64), "multilabel", np.zeros(15)


@pytest.mark.parametrize("offset", [0.0, 1e-11], ids=["on", "near"])
@pytest.mark.parametrize("problem", list(kink_problems()), ids=lambda p: p[0])
def test_argsup_is_the_directional_derivative_and_its_plane_stays_below(problem, offset):
    # offset 1e-11: the examples sit within rounding of a kink, on either side, as an exact line
    # search leaves them; the oracle counts them as on it and returns a plane value b <= R.
    name, X, y, kind, w_kink = problem
    oracle = oracle_of(name, X, y, kind)
    argsup = risk_argsup(oracle)
    rng = np.random.default_rng(1)
    w = w_kink + offset * rng.standard_normal(len(w_kink))
    r0, a0 = oracle(w)
    on_kink = 0
    for _ in range(20):
        p = rng.standard_normal(len(w))
        r, b, a = argsup(w, p)
        assert r == pytest.approx(r0, rel=1e-12)
        assert b <= r and (offset or b == pytest.approx(r0, rel=1e-12, abs=1e-14))
        t = 1e-5  # far beyond the offsets, below every other breakpoint: R is linear on [w, w + t p]
        slack = 1e-9 + 10 * offset / t  # the difference quotient's error from the offsets
        derivative = (oracle(w + t * p)[0] - r0) / t
        assert float(a @ p) == pytest.approx(derivative, rel=1e-5, abs=slack)
        # a is a subgradient: <a, p'> <= R'(w; p') in every direction p' (one up to the offsets)
        for q in rng.standard_normal((5, len(w))):
            assert float(a @ q) <= (oracle(w + t * q)[0] - r0) / t + 1e-6 + slack
        on_kink += abs(float(a0 @ p) - derivative) > 1e-6
        # b + <a, v - w> is a plane below R_emp, near w and far from it
        for scale in (1e-12, 1e-7, 1e-2, 1.0, 10.0):
            for v in w + scale * rng.standard_normal((5, len(w))):
                assert b + float(a @ (v - w)) <= oracle(v)[0] + 1e-14
    assert on_kink > 0  # the plain subgradient would not do


def test_descent_direction_on_a_known_nonsmooth_function():
    # J(w) = |w_1| + 0.1 w_2^2 at w = (0, 1): subdifferential {(u, 0.2): |u| <= 1}; the best
    # direction for B = I is -(0, 0.2), whatever subgradient it starts from.
    def argsup(p):
        return np.array([np.sign(p[0]) if p[0] != 0 else 1.0, 0.2])
    B = LbfgsMatrix(5)
    p, _ = descent_direction(np.array([1.0, 0.2]), argsup, B, tolerance=1e-12, k_max=50)
    np.testing.assert_allclose(p, [0.0, -0.2], atol=1e-6)
    assert descent_direction(np.array([1.0, 0.0]), lambda q: np.array([np.sign(q[0]) or 1.0, 0.0]), B,
                             1e-12, 50)[0] is None  # w is optimal: no descent direction


# --------------------------------------------------------------------------
# The optimum and the certified bound
# --------------------------------------------------------------------------

def check_run(result, optimum, rel=1e-3):
    assert result.fun <= optimum * (1 + rel)
    assert np.all(result.history["lower_bound"] <= optimum * (1 + 1e-9) + 1e-12)


def test_sublbfgs_reaches_cvxpy_optimum_hinge():
    X, y = a9a(2000)
    lam = 1e-3
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w)
                                     + cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    result = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="sublbfgs", rel_epsilon=1e-4)
    check_run(result, problem.value)
    assert result.gap <= 1e-3 * result.fun


def l1_logistic_optimum(X, y, lam):
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(lam * cp.norm1(w) + cp.sum(cp.logistic(-cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


@pytest.mark.parametrize("method", ["owlqn", "owlqn_star"])
def test_owlqn_reaches_cvxpy_l1_logistic_optimum(method):
    X, y = a9a(1000)
    lam = 1e-3
    optimum = l1_logistic_optimum(X, y, lam)
    l1 = get_regularizer("l1")
    oracle = oracle_of("logistic", X, y)
    l1.prepare(oracle.dim, oracle.loss.risk_floor)
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method=method, reg=l1, rel_epsilon=1e-4, max_iter=500)
    check_run(result, optimum)
    assert np.count_nonzero(result.w) < X.shape[1]  # L1 makes w sparse


def test_usage_errors():
    X, y = a9a(100)
    with pytest.raises(UsageError, match="needs --reg l1"):
        minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), 1e-3, method="owlqn")
    with pytest.raises(UsageError, match="differentiable regularizer"):
        minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), 1e-3, method="sublbfgs", reg="l1")
    with pytest.raises(UsageError, match="memory"):
        minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), 1e-3, method="sublbfgs", memory=0)


@pytest.mark.distributed
def test_sublbfgs_run_equals_serial_run(comm, mpi_tmp_path):
    check_run_against_serial(comm, mpi_tmp_path, "hinge", 1e-4, rows=3000, method="sublbfgs", rel_epsilon=1e-3)


@pytest.mark.parametrize("method, loss, reg", [("sublbfgs", "hinge", "l2"), ("owlqn", "logistic", "l1"),
                                               ("owlqn_star", "logistic", "l1")])
def test_command_line_trains_on_two_ranks(tmp_path, method, loss, reg):
    X, y = a9a(600)
    write_shards(X, y, tmp_path / "shards", 2)
    out = tmp_path / "model.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "shards"), "--solver", method,
                                 "--loss", loss, "--reg", reg, "--lam", "0.05", "--quiet", "--out", str(out)],
                             timeout=120)
    assert completed.returncode == 0, completed.stderr
    model = load_model(str(out))
    assert model.attrs["solver"] == method
    history = model.history
    assert len(history["iteration"]) == model.attrs["iterations"] > 1
    np.testing.assert_array_equal(history["gap"], history["best_objective"] - history["lower_bound"])
    assert np.all(history["lower_bound"] <= model.attrs["objective"])
    assert model.attrs["gap"] == history["gap"][-1] <= 1e-3 * model.attrs["objective"]
