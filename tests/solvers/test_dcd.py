"""Dual coordinate descent for the hinge SVM:

- the compiled pass equals a plain Python loop of the same updates, bitwise;
- it reaches cvxpy's optimum within its certified gap, every bound below that optimum, and its
  objective is J of the returned w written out;
- its bracket and BMRM's overlap on hashed-text-like data at a small lam (each optimum in the other's);
- it refuses what it cannot solve;
- 1, 2 and 3 ranks give bitwise the same run.
"""

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp

from helpers import load_svmlight, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.errors import UsageError
from prbmrm.io import load_local
from prbmrm.kernels.sparse import hinge_dual_pass
from prbmrm.losses import get_loss
from prbmrm.solvers import SOLVERS, minimize


@pytest.fixture(scope="module")
def a9a_600():
    X, y = load_svmlight("a9a.xz")
    return X[:600], y[:600]


def python_pass(X, y, diagonal, order, upper, before, alpha, w):
    """The pass of hinge_dual_pass written out (Hsieh et al. 2008, Alg. 1 with shrinking)."""
    keep, largest, smallest, estimate = [], -np.inf, np.inf, 0.0
    for i in order:
        row = X.getrow(i)
        g = y[i] * sum(v * w[j] for j, v in zip(row.indices, row.data)) - 1.0
        if (alpha[i] == 0.0 and g > before[0]) or (alpha[i] == upper and g < before[1]):
            keep.append(0)
            continue
        keep.append(1)
        projected = min(g, 0.0) if alpha[i] == 0.0 else max(g, 0.0) if alpha[i] == upper else g
        largest, smallest = max(largest, projected), min(smallest, projected)
        estimate += upper * max(-g, 0.0) + alpha[i] * g  # the row's term of the duality gap, before its update
        if projected != 0.0:
            old = alpha[i]
            alpha[i] = min(max(old - g / diagonal[i], 0.0), upper) if diagonal[i] > 0 else upper
            for j, v in zip(row.indices, row.data):
                w[j] += (alpha[i] - old) * y[i] * v
    return largest, smallest, estimate, keep


def test_the_compiled_pass_is_the_loop_written_out(a9a_600):
    X, y = a9a_600
    X = sp.vstack([X[:50], sp.csr_matrix((1, X.shape[1])), X[50:100]], format="csr")  # an empty row too
    y = np.concatenate([y[:50], [1.0], y[50:100]])
    diagonal = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    alpha, w = np.zeros(len(y)), np.zeros(X.shape[1])
    expected_alpha, expected_w = alpha.copy(), w.copy()
    rng, before = np.random.default_rng(0), (np.inf, -np.inf)
    for _ in range(6):
        order = rng.permutation(len(y))
        keep = np.empty(len(y), dtype=np.int8)
        high, low, estimate = hinge_dual_pass(X.indptr, X.indices, X.data, y, diagonal, order, 0.5, before[0],
                                              before[1], alpha, w, keep)
        expected = python_pass(X, y, diagonal, order, 0.5, before, expected_alpha, expected_w)
        assert (high, low, estimate, keep.tolist()) == expected
        np.testing.assert_array_equal(alpha, expected_alpha)
        np.testing.assert_array_equal(w, expected_w)
        before = (high if high > 0 else np.inf, low if low < 0 else -np.inf)
    assert alpha[50] == 0.5 and np.all((alpha >= 0) & (alpha <= 0.5))


@pytest.mark.parametrize("lam", [1e-2, 1e-4])
def test_dcd_reaches_the_cvxpy_optimum(a9a_600, lam):
    X, y = a9a_600
    Xb = sp.hstack([X, np.ones((len(y), 1))], format="csr")  # --bias: a regularized constant feature
    w, = cp.Variable(Xb.shape[1]),
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + cp.sum(cp.pos(1 - cp.multiply(y, Xb @ w)))
                                     / len(y)))
    problem.solve(solver=cp.CLARABEL)
    optimum = problem.value
    risk = DistributedRisk(get_loss("hinge"), Xb, y, len(y), SerialComm(), blocks=[0, 200, 450, 600])
    result = minimize(risk, np.zeros(risk.dim), lam, method="dcd", rel_epsilon=1e-4, epsilon=0)
    assert result.success and result.gap <= 1e-4 * result.fun and "passes" in result.message
    assert optimum * (1 - 1e-7) <= result.fun <= optimum * (1 + 1e-4)
    history = result.history
    assert np.all(history["lower_bound"] <= optimum * (1 + 1e-7))
    assert np.all(np.diff(history["lower_bound"]) >= 0) and np.all(np.diff(history["best_objective"]) <= 0)
    np.testing.assert_array_equal(history["iteration"], np.arange(1, result.nit + 1))
    written = 0.5 * lam * result.w @ result.w + np.mean(np.maximum(0.0, 1.0 - y * (Xb @ result.w)))
    assert result.fun == pytest.approx(written, rel=1e-12)


def test_dcd_and_bmrm_brackets_overlap_on_hashed_text():
    # Few nonzeros per weight at a small lam, as in the email grid: each certified optimum lies in the
    # other solver's bracket [lower bound, objective].
    rng = np.random.default_rng(4)
    X = sp.random(800, 20000, density=2e-3, format="csr", random_state=rng, data_rvs=rng.random)
    X = sp.hstack([X, np.ones((800, 1))], format="csr")
    y = np.where(X @ rng.standard_normal(X.shape[1]) + 0.3 * rng.standard_normal(800) > 0, 1.0, -1.0)
    lam = 1e-5
    runs = {method: minimize(DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm()), np.zeros(X.shape[1]),
                             lam, method=method, rel_epsilon=1e-3) for method in ("dcd", "bmrm")}
    for method, other in (("dcd", "bmrm"), ("bmrm", "dcd")):
        assert runs[method].success
        assert runs[other].lower_bound <= runs[method].fun and runs[method].lower_bound <= runs[other].fun


@pytest.mark.parametrize("method", ["dcd", "pragam", "pragam_b"])
def test_the_hinge_duals_refuse_what_they_cannot_solve(method):
    X = np.random.default_rng(0).normal(size=(20, 3))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    logistic = DistributedRisk(get_loss("logistic"), X, y, 20, SerialComm())
    with pytest.raises(UsageError, match="hinge"):
        minimize(logistic, np.zeros(3), 0.1, method=method)
    with pytest.raises(UsageError, match="hinge"):
        minimize(lambda w: (0.0, w), np.zeros(3), 0.1, method=method)
    hinge = DistributedRisk(get_loss("hinge"), X, y, 20, SerialComm())
    with pytest.raises(UsageError, match="l2"):
        minimize(hinge, np.zeros(3), 0.1, method=method, reg="l1")
    assert method in SOLVERS


@pytest.mark.distributed
def test_dcd_run_is_the_same_on_every_rank_count(comm, mpi_tmp_path):
    X, y = load_svmlight("a9a.xz")
    directory = shared_shards(comm, mpi_tmp_path, X[:2000], y[:2000], parts=comm.size + 2)

    def run(local, communicator):
        oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, communicator,
                                 local.blocks)
        return run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), 1e-4, method="dcd",
                                                             rel_epsilon=1e-5, max_iter=30))

    result = run(load_local(directory, comm, bias=True), comm)
    if comm.is_root:
        expected = run(load_local(directory, SerialComm(), bias=True), SerialComm())
        assert result.message == expected.message and result.nit == expected.nit
        np.testing.assert_array_equal(result.w, expected.w)
        for column in ("objective", "best_objective", "lower_bound", "gap"):
            np.testing.assert_array_equal(result.history[column], expected.history[column])


def test_a_dual_start_from_another_lam_certifies_the_same_optimum(a9a_600):
    # The dual point of a fit at one lam, clipped to another lam's box, is feasible there: a fit started
    # from it certifies the same optimum as a cold fit (cvxpy's, and inside the cold bracket).
    X, y = a9a_600
    lam = 1e-4
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + cp.sum(cp.pos(1 - cp.multiply(y, X @ w)))
                                     / len(y)))
    problem.solve(solver=cp.CLARABEL)

    def run(lam, dual=None):
        risk = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm(), blocks=[0, 300, 600])
        return minimize(risk, np.zeros(risk.dim), lam, method="dcd", rel_epsilon=1e-4, dual=dual)

    cold = run(lam)
    for other in (1e-2, 1e-6):
        start = run(other).dual
        assert np.all((start >= 0) & (start <= 1.0 / (other * len(y)))) and np.any(start > 0)
        warm = run(lam, start)
        assert warm.success and warm.gap <= 1e-4 * warm.fun
        assert problem.value * (1 - 1e-7) <= warm.fun <= problem.value * (1 + 1e-4)
        assert warm.lower_bound <= problem.value * (1 + 1e-7)
        assert cold.lower_bound <= warm.fun and warm.lower_bound <= cold.fun
    with pytest.raises(UsageError, match="dual start of 5 examples"):
        run(lam, np.zeros(5))
