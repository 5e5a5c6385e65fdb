"""LS-BMRM (paper 000, Alg. 3): losses along a line, the exact distributed line search, the solver.

References: finite differences of the losses, a dense grid plus a bounded
Brent refinement of phi written out independently, cvxpy/Clarabel on the full
primal, and the serial run for 2 and 3 ranks.
"""

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from helpers import OBJECTIVES, load_svmlight, run_ranks, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local
from prbmrm.errors import CollectiveError, UsageError
from prbmrm.losses import get_loss
from prbmrm.losses.scalar import SCALAR_LOSSES, Hinge
from prbmrm.regularizers import L2
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.solvers import minimize
from prbmrm.solvers.linesearch import open_line, search_line
from prbmrm.solvers.lsbmrm import minimize_lsbmrm
from prbmrm.training import check_options


def multiclass_loss(y, name="multiclass_hinge"):
    loss = get_loss(name)
    loss.prepare(np.unique(y), "integer")
    return loss


def dna_binary():
    X, y = load_svmlight("dna.scale.xz")
    return X, np.where(y == 3, 1.0, -1.0)


# --------------------------------------------------------------------------
# Losses along a line: values and one-sided slopes
# --------------------------------------------------------------------------

def one_sided(total, eta, h=1e-7):
    """Backward and forward differences of `total` at eta."""
    return (total(eta) - total(eta - h)) / h, (total(eta + h) - total(eta)) / h


@pytest.mark.parametrize("cls", SCALAR_LOSSES, ids=lambda cls: cls.name)
def test_scalar_loss_along_a_line(cls):
    rng = np.random.default_rng(3)
    loss, n = cls(), 40
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0) if loss.task == "classification" else rng.normal(size=n)
    f0, df = rng.normal(size=n), rng.normal(size=n)
    df[:4] = 0.0  # scores that do not move
    kinks = loss.kinks(y)
    if kinks.shape[1]:
        f0[4:8] = kinks[4:8, 0]  # starting on a kink
    line = loss.line(f0, df, y)
    assert line.exact == loss.piecewise_linear
    # Random steps, and for piecewise-linear losses every kink met along the line.
    etas = rng.uniform(0.01, 3.0, 10)
    if kinks.shape[1]:
        with np.errstate(divide="ignore", invalid="ignore"):
            crossings = ((kinks - f0[:, None]) / df[:, None]).ravel()
        etas = np.concatenate([etas, crossings[(crossings > 0.01) & (crossings < 3.0)]])
    etas = np.sort(etas)
    values, left, right = line.evaluate(etas, 0.0, np.inf)[:3]

    def total(eta):
        return float(np.sum(loss.value(f0 + eta * df, y)))

    for eta, value, slope_left, slope_right in zip(etas, values, left, right):
        assert value == pytest.approx(total(eta), rel=1e-12, abs=1e-12)
        backward, forward = one_sided(total, eta)
        assert slope_left == pytest.approx(backward, rel=1e-5, abs=1e-5)
        assert slope_right == pytest.approx(forward, rel=1e-5, abs=1e-5)
    # At 0 the right slope is the forward difference.
    right = loss.line(f0, df, y).evaluate([0.0], 0.0, np.inf)[2, 0]
    assert right == pytest.approx(one_sided(total, 0.0)[1], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", ["multiclass_hinge", "scaled_multiclass_hinge"])
def test_multiclass_loss_along_a_line_at_every_crossing(name):
    rng = np.random.default_rng(4)
    n, k = 30, 5
    y = rng.integers(0, k, n).astype(float)
    loss = get_loss(name)
    loss.prepare(np.arange(float(k)), "integer")
    F0, dF = rng.normal(size=(n, k)), rng.normal(size=(n, k))
    line = loss.line(F0, dF, y)
    assert line.exact

    def total(eta):
        # Independently: max_j Gamma(y, j) (f_j - f_y) + Delta(y, j), Delta 0/1 and Gamma = Delta or 1.
        F = F0 + eta * dF
        f_y = F[np.arange(n), y.astype(int)][:, None]
        delta = (np.arange(k)[None] != y[:, None]).astype(float)
        scale = delta if name == "scaled_multiclass_hinge" else 1.0
        return float(np.sum(np.max(scale * (F - f_y) + delta, axis=1)))

    # Every pairwise crossing of an example's k lines in (0, 3), the envelope's breakpoints among them,
    # each written as where a line is overtaken by a steeper one (as the envelope computes it, so that
    # a breakpoint is met exactly, not one rounding off).
    index = y.astype(int)
    delta = (np.arange(k)[None] != index[:, None]).astype(float)
    scale = delta if name == "scaled_multiclass_hinge" else np.ones((n, k))
    A = scale * (F0 - F0[np.arange(n), index][:, None]) + delta
    S = scale * (dF - dF[np.arange(n), index][:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        crossings = (A[:, :, None] - A[:, None, :]) / (S[:, None, :] - S[:, :, None])
    steeper = S[:, None, :] > S[:, :, None]
    crossings = crossings[steeper & (crossings > 1e-3) & (crossings < 3.0)]
    etas = np.sort(np.unique(crossings))
    values, left, right = line.evaluate(etas, 0.0, np.inf)[:3]
    assert np.any(left < right - 1e-9)  # some crossings are breakpoints of the envelope
    for eta, value, slope_left, slope_right in zip(etas, values, left, right):
        assert value == pytest.approx(total(eta), rel=1e-12)
        backward, forward = one_sided(total, eta)
        assert slope_left == pytest.approx(backward, rel=1e-5, abs=1e-5)
        assert slope_right == pytest.approx(forward, rel=1e-5, abs=1e-5)


def test_ontology_loss_along_a_line(tmp_path):
    rng = np.random.default_rng(5)
    dag = tmp_path / "dag.txt"
    dag.write_text("root 1\nroot inner\ninner 2\ninner 3\n")
    loss = get_loss("ontology", dag=str(dag))
    loss.prepare(np.array([1.0, 2.0, 3.0]), "integer")
    n, k = 30, loss.n_outputs
    y = rng.integers(1, 4, n).astype(float)
    F0, dF = rng.normal(size=(n, k)), rng.normal(size=(n, k))
    line = loss.line(F0, dF, y)
    assert line.exact

    def total(eta):
        return float(np.sum(loss.coefficients(F0 + eta * dF, y)[0]))

    # Growing steps, a few at a time: the envelope is traced further at each call.
    etas = np.sort(rng.uniform(0.0, 4.0, 12)) ** 2
    sums = np.hstack([line.evaluate(chunk, 0.0, np.inf)[:3] for chunk in np.array_split(etas, 4)])
    for eta, value, slope_left, slope_right in zip(etas, *sums):
        assert value == pytest.approx(total(eta), rel=1e-12)
        backward, forward = one_sided(total, eta)
        assert slope_left == pytest.approx(backward, rel=1e-5, abs=1e-5)
        assert slope_right == pytest.approx(forward, rel=1e-5, abs=1e-5)


# --------------------------------------------------------------------------
# The exact step against a brute-force minimization of phi
# --------------------------------------------------------------------------

def phi_reference(loss, X, y, w, d, lam):
    """phi(eta) = J(w + eta d), written out independently of prbmrm."""
    if loss == "multiclass_hinge":
        classes = np.unique(y)
        index = np.searchsorted(classes, y)
        k = len(classes)

        def objective(v):
            F = X @ v.reshape(-1, k)
            margins = F - F[np.arange(len(y)), index][:, None] + (np.arange(k)[None] != index[:, None])
            return 0.5 * lam * v @ v + np.mean(np.max(margins, axis=1))

        return lambda eta: objective(w + eta * d)
    return lambda eta: OBJECTIVES[loss](X, y, w + eta * d, lam)


def brute_force_step(phi):
    """argmin of phi on [0, 2] by a dense linear and geometric grid, refined by bounded Brent."""
    grid = np.unique(np.concatenate([[0.0], np.geomspace(1e-9, 2.0, 3000), np.linspace(0.0, 2.0, 3001)]))
    values = np.array([phi(eta) for eta in grid])
    i = int(np.argmin(values))
    if i == 0:
        return 0.0
    refined = minimize_scalar(phi, bounds=(grid[i - 1], grid[min(i + 1, len(grid) - 1)]), method="bounded",
                              options={"xatol": 1e-15, "maxiter": 500})
    return refined.x if refined.fun <= values[i] else grid[i]


def search_case(loss_name, seed):
    """A line of LS-BMRM on small data: w_b after a few BMRM iterations, d towards the model's minimizer."""
    if loss_name == "multiclass_hinge":
        X, y = load_svmlight("dna.scale.xz")
        X, y = X[:300], y[:300]
        loss = multiclass_loss(y)
    else:
        X, y = load_svmlight("a9a.xz")
        X, y = X[:1000], y[:1000]
        loss = get_loss(loss_name)
    lam = 1e-3
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm())
    start = minimize(oracle, np.zeros(oracle.dim), lam, max_iter=seed + 2, rel_epsilon=0)
    w = start.w
    d = start.w_last - w
    if seed == 2:
        d = np.random.default_rng(seed).normal(size=oracle.dim)  # any direction
    if seed == 3:
        d = -d  # uphill: the step is 0
    return oracle, X, y, w, d, lam


@pytest.mark.parametrize("loss", ["hinge", "multiclass_hinge", "logistic"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_step_equals_brute_force_minimizer(loss, seed):
    oracle, X, y, w, d, lam = search_case(loss, seed)
    with open_line(oracle, w, d) as line:
        assert line.exact == (loss != "logistic")
        point, rounds = search_line(line, L2(), lam, w, d)
    phi = phi_reference(loss, X, y, w, d, lam)
    reference = brute_force_step(phi)
    assert point.value == pytest.approx(phi(point.eta), rel=1e-12)
    assert point.value <= phi(reference) + 1e-12 * abs(phi(reference))
    assert point.eta == pytest.approx(reference, rel=1e-6, abs=1e-12)
    if seed == 3:
        assert point.eta == 0.0 and rounds == 1
    if loss != "logistic" and point.eta > 0:
        # Exact: 0 lies between the one-sided derivatives at the step.
        assert point.left <= 0.0 <= point.right


# --------------------------------------------------------------------------
# The same step and the same LS-BMRM run on 1, 2 and 3 ranks
# --------------------------------------------------------------------------

def ranked_oracle(comm, directory, loss_name, y):
    local = load_local(directory, comm)
    loss = multiclass_loss(y) if loss_name == "multiclass_hinge" else get_loss(loss_name)
    return DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks)


@pytest.mark.distributed
@pytest.mark.parametrize("loss", ["hinge", "multiclass_hinge", "logistic"])
def test_step_and_run_are_the_same_on_any_number_of_ranks(comm, mpi_tmp_path, loss):
    X, y = load_svmlight("dna.scale.xz") if loss == "multiclass_hinge" else dna_binary()
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 2)
    oracle = ranked_oracle(comm, directory, loss, y)
    rng = np.random.default_rng(7)
    w, d = 0.05 * rng.normal(size=oracle.dim), rng.normal(size=oracle.dim)

    def solve(risk):
        with open_line(risk, w, d) as line:
            step = search_line(line, L2(), 1e-3, w, d)
        return step, minimize(risk, np.zeros(risk.dim), 1e-3, method="lsbmrm", max_iter=15)

    results = run_distributed(oracle, solve)
    if comm.is_root:
        serial = ranked_oracle(SerialComm(), directory, loss, y)
        expected = solve(serial)
        assert results[0] == expected[0]  # bitwise: the step, phi, the slopes and the rounds
        assert results[1].nit == expected[1].nit
        for column in ("objective", "best_objective", "lower_bound"):
            np.testing.assert_array_equal(results[1].history[column], expected[1].history[column])
        np.testing.assert_array_equal(results[1].w, expected[1].w)


class BrokenHinge(Hinge):
    """The hinge loss whose line set-up (or trial steps) fail on the rank that breaks it."""

    def __init__(self, where=None):
        super().__init__()
        self.where = where

    def line(self, f0, df, y):
        if self.where == "setup":
            raise ValueError("line set-up failed on the last rank")
        line = super().line(f0, df, y)
        if self.where == "trial":
            def fail(etas, lo, hi):
                raise ValueError("trial step failed on the last rank")
            line.evaluate = fail
        return line


@pytest.mark.distributed
@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["setup", "trial"])
def test_error_on_a_rank_during_the_line_search_stops_every_rank(comm, where):
    X, y = dna_binary()
    rows = np.array_split(np.arange(600), comm.size)[comm.rank]
    loss = BrokenHinge(where if comm.rank == comm.size - 1 else None)
    oracle = DistributedRisk(loss, X[rows], y[rows], 600, comm)
    with pytest.raises(CollectiveError, match=f"{'set-up' if where == 'setup' else 'trial step'} failed"):
        run_distributed(oracle, lambda risk: minimize(risk, np.zeros(risk.dim), 1e-3, method="lsbmrm"))
    # The oracle serves again afterwards.
    assert run_distributed(oracle, lambda risk: risk(np.zeros(risk.dim))[0]) in (None, 1.0)


class FailingRegularizer(L2):
    """L2 whose part of phi fails on rank 0 in the middle of the second line search."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def line(self, w, d):
        self.calls += 1
        omega = super().line(w, d)
        if self.calls < 2:
            return omega
        return lambda eta: omega(eta) if eta == 0.0 else 1 / 0


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_error_on_rank_zero_inside_a_line_search_stops_every_rank(comm):
    X, y = dna_binary()
    rows = np.array_split(np.arange(600), comm.size)[comm.rank]
    oracle = DistributedRisk(get_loss("hinge"), X[rows], y[rows], 600, comm)
    expected = ZeroDivisionError if comm.is_root else CollectiveError
    with pytest.raises(expected, match="division by zero"):
        run_distributed(oracle, lambda risk: minimize_lsbmrm(risk, np.zeros(risk.dim), 1e-3,
                                                             FailingRegularizer()))


# --------------------------------------------------------------------------
# LS-BMRM reaches the optimum
# --------------------------------------------------------------------------

def test_lsbmrm_reaches_cvxpy_optimum_hinge():
    X, y = load_svmlight("a9a.xz")
    X, y, lam = X[:2000], y[:2000], 1e-3
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w)
                                     + cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    eps = 1e-6
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method="lsbmrm", epsilon=eps, rel_epsilon=0)
    assert result.success and result.gap <= eps
    assert result.fun == pytest.approx(OBJECTIVES["hinge"](X, y, result.w, lam), rel=1e-12)
    assert abs(result.fun - problem.value) <= eps + 1e-7 * problem.value
    assert np.all(result.history["lower_bound"] <= problem.value + 1e-7 * problem.value)


def test_lsbmrm_reaches_cvxpy_optimum_multiclass():
    X, y = load_svmlight("dna.scale.xz")
    X, y, lam = X[:300], y[:300], 1e-2
    classes = np.unique(y)
    k, index = len(classes), np.searchsorted(classes, y)
    W = cp.Variable((X.shape[1], k))
    F = X @ W
    f_y = cp.sum(cp.multiply(F, np.eye(k)[index]), axis=1)
    margins = F - cp.reshape(f_y, (len(y), 1), order="C") @ np.ones((1, k)) + (1 - np.eye(k)[index])
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(W) + cp.sum(cp.max(margins, axis=1)) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    eps = 1e-3 * problem.value
    oracle = DistributedRisk(multiclass_loss(y), X, y, len(y), SerialComm())
    result = minimize(oracle, np.zeros(oracle.dim), lam, method="lsbmrm", epsilon=eps, rel_epsilon=0)
    assert result.success and result.gap <= eps
    assert abs(result.fun - problem.value) <= eps
    assert np.all(result.history["lower_bound"] <= problem.value * (1 + 1e-7))


def test_lsbmrm_searches_through_the_oracle_for_non_decomposable_losses():
    X, y = load_svmlight("a9a.xz")
    X, y, lam = X[:500], y[:500], 1e-2
    oracle = DistributedRisk(get_loss("roc_area"), X, y, len(y), SerialComm())
    w, d = np.zeros(X.shape[1]), np.random.default_rng(0).normal(size=X.shape[1])
    assert oracle.line(w, d) is None and not open_line(oracle, w, d).exact
    options = dict(epsilon=1e-5, rel_epsilon=0)
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method="lsbmrm", theta=0.5, **options)
    reference = minimize(oracle, np.zeros(X.shape[1]), lam, **options)
    assert result.success and reference.success
    assert abs(result.fun - reference.fun) <= 1e-5


def test_theta_checks_and_command_line(tmp_path):
    for theta in (0.0, 1.5, float("nan")):
        with pytest.raises(UsageError, match="--theta must be in"):
            check_options(1e-4, 0.0, 1e-3, 100, 10, solver="lsbmrm", theta=theta)
    with pytest.raises(UsageError, match="--theta is an option of --solver lsbmrm"):
        check_options(1e-4, 0.0, 1e-3, 100, 10, solver="bmrm", theta=0.5)
    out = tmp_path / "model.h5"
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--solver", "lsbmrm", "--theta", "0.5", "--quiet",
                                 "--out", str(out)])
    assert completed.returncode == 0, completed.stderr
    from prbmrm.model import load_model

    model = load_model(str(out))
    assert model.attrs["solver"] == "lsbmrm" and '"theta": 0.5' in model.attrs["options"]
    assert model.attrs["gap"] <= 1e-3 * model.attrs["objective"]
