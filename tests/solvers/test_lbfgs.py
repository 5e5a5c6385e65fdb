"""The certified bound of any solver (CuttingPlaneBound) and the L-BFGS solver, against cvxpy and BMRM."""

import cvxpy as cp
import numpy as np
import pytest

from helpers import OBJECTIVES, check_run_against_serial, load_svmlight
from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import UsageError
from prbmrm.losses import get_loss
from prbmrm.regularizers import get_regularizer
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import CuttingPlaneBound, minimize, solver_options
from prbmrm.solvers.lbfgs import minimize_lbfgs


def a9a(m):
    X, y = load_svmlight("a9a.xz")
    return X[:m], y[:m]


def oracle_of(loss, X, y):
    loss = get_loss(loss)
    loss.prepare(np.unique(y), "binary" if set(np.unique(y)) <= {-1.0, 1.0} else "integer")
    return DistributedRisk(loss, X, y, len(y), SerialComm())


def cvxpy_optimum(X, y, loss, lam):
    w = cp.Variable(X.shape[1])
    margin = cp.multiply(y, X @ w)
    risk = {"hinge": cp.sum(cp.pos(1 - margin)), "logistic": cp.sum(cp.logistic(-margin))}[loss]
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + risk / len(y)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


class Recording:
    """A risk oracle that keeps every (w, R, a) it returns."""

    def __init__(self, risk):
        self.risk = risk
        self.calls = []

    def __call__(self, w):
        r, a = self.risk(w)
        self.calls.append((np.array(w), r, a))
        return r, a


# --------------------------------------------------------------------------
# CuttingPlaneBound
# --------------------------------------------------------------------------

def test_bound_fed_bmrm_iterates_equals_bmrm_bound():
    X, y = a9a(2000)
    lam = 1e-3
    # BMRM's exact subproblems: its lower bound is then the bound of its planes, as the fed one is.
    risk = Recording(oracle_of("hinge", X, y))
    result = minimize(risk, np.zeros(X.shape[1]), lam, rel_epsilon=1e-4, inexact=0)
    bound = CuttingPlaneBound(X.shape[1], get_regularizer("l2"), lam)
    bounds = []
    for w, r, a in risk.calls:
        bound.add(w, r, a)
        bounds.append(bound.lower_bound())
    np.testing.assert_allclose(bounds, np.maximum.accumulate(result.history["lower_bound"]), rtol=1e-10)
    np.testing.assert_allclose(bounds, result.history["lower_bound"], rtol=1e-6)
    # Its default loose subproblems report the dual value of feasible multipliers: never above
    # the exact bound of the same planes.
    risk = Recording(oracle_of("hinge", X, y))
    result = minimize(risk, np.zeros(X.shape[1]), lam, rel_epsilon=1e-4)
    bound = CuttingPlaneBound(X.shape[1], get_regularizer("l2"), lam)
    for (w, r, a), reported in zip(risk.calls, result.history["lower_bound"]):
        bound.add(w, r, a)
        exact = bound.lower_bound()
        assert reported <= exact + 1e-12 * abs(exact) + 1e-15


@pytest.mark.parametrize("max_planes", [0, 2, 5])
@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_bound_never_exceeds_the_cvxpy_optimum(loss, max_planes):
    X, y = a9a(1000)
    lam = 1e-3
    optimum = cvxpy_optimum(X, y, loss, lam)
    # The points of another solver: every evaluation of an L-BFGS run, line searches included.
    risk = Recording(oracle_of(loss, X, y))
    minimize(risk, np.zeros(X.shape[1]), lam, method="lbfgs", rel_epsilon=0, max_iter=40)
    bound = CuttingPlaneBound(X.shape[1], get_regularizer("l2"), lam, max_planes=max_planes, idle_age=3)
    values = []
    for w, r, a in risk.calls:
        bound.add(w, r, a)
        values.append(bound.lower_bound())
        assert max_planes == 0 or bound.bundle.size <= max_planes
    assert np.all(np.diff(values) >= 0)
    assert values[-1] <= optimum + 1e-8 * abs(optimum)
    assert values[-1] > optimum - 0.05 * optimum  # and it says something


def test_full_bundle_of_active_planes_is_aggregated_without_losing_the_bound():
    # R(w) = |w_1| + w_2 / 10: the planes (+-1, 0.1) are both active at the optimum w = (0, -0.1/lam).
    lam = 1.0
    bound = CuttingPlaneBound(2, get_regularizer("l2"), lam, max_planes=2)
    for a in ([1.0, 0.1], [-1.0, 0.1]):
        bound.add(np.zeros(2), 0.0, np.array(a))
    value = bound.lower_bound()
    assert value == pytest.approx(-0.1 ** 2 / (2 * lam))   # min_w 0.1 w_2 + w_2^2 / 2 over w_1 = 0
    bound.add(np.zeros(2), 0.0, np.array([0.0, 0.1]))       # full: the two active planes are aggregated
    assert bound.bundle.size == 2
    np.testing.assert_allclose(bound.bundle.A[0], [0.0, 0.1], atol=1e-12)
    assert bound.lower_bound() == pytest.approx(value)


@pytest.mark.parametrize("loss", ["logistic", "hinge"])
def test_eq15_bound_of_one_plane(loss):
    # J_-(w) = J(w) - ||grad J(w)||^2 / (2 lam) (paper 002, eq. 15) is below the optimum for
    # any subgradient (Lemma 5's proof uses only the subgradient inequality) and is the bound
    # of a single plane; it is tight near the optimum of a smooth J.
    X, y = a9a(1000)
    lam = 1e-3
    optimum = cvxpy_optimum(X, y, loss, lam)
    risk = oracle_of(loss, X, y)
    rng = np.random.default_rng(1)
    for w in [np.zeros(X.shape[1]), *(rng.normal(size=(3, X.shape[1])) * 0.3)]:
        r, a = risk(w)
        objective = OBJECTIVES[loss](X, y, w, lam)
        eq15 = objective - np.sum((a + lam * w) ** 2) / (2 * lam)
        bound = CuttingPlaneBound(X.shape[1], get_regularizer("l2"), lam)
        bound.add(w, r, a)
        assert bound.value == pytest.approx(eq15, rel=1e-10, abs=1e-12)
        assert eq15 <= optimum
    if loss == "logistic":
        w_star = minimize(risk, np.zeros(X.shape[1]), lam, method="lbfgs", epsilon=1e-9,
                          rel_epsilon=0).w
        r, a = risk(w_star)
        eq15 = OBJECTIVES[loss](X, y, w_star, lam) - np.sum((a + lam * w_star) ** 2) / (2 * lam)
        assert optimum - 1e-7 <= eq15 + 1e-7 and eq15 <= optimum + 1e-8


# --------------------------------------------------------------------------
# L-BFGS
# --------------------------------------------------------------------------

def test_lbfgs_reaches_the_logistic_optimum():
    X, y = a9a(2000)
    lam = 1e-4
    optimum = cvxpy_optimum(X, y, "logistic", lam)
    result = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), lam, method="lbfgs",
                      rel_epsilon=1e-3)
    assert result.success and result.gap <= 1e-3 * result.fun
    assert result.fun == pytest.approx(OBJECTIVES["logistic"](X, y, result.w, lam), rel=1e-12)
    assert abs(result.fun - optimum) <= 1e-3 * optimum
    assert np.all(result.history["lower_bound"] <= optimum + 1e-8)
    assert np.all(result.history["gap"] == result.history["best_objective"] - result.history["lower_bound"])


def test_lbfgs_reaches_bmrms_softmax_optimum():
    X, y = load_svmlight("dna.scale.xz")
    X, y = X[:600], y[:600]
    lam = 1e-3
    reference = minimize(oracle_of("softmax", X, y), np.zeros(X.shape[1] * 3), lam, epsilon=1e-8,
                         rel_epsilon=0)
    assert reference.success
    result = minimize(oracle_of("softmax", X, y), np.zeros(X.shape[1] * 3), lam, method="lbfgs",
                      rel_epsilon=1e-4)
    assert result.success
    assert abs(result.fun - reference.fun) <= 1e-3 * reference.fun
    # min J <= reference.fun: no certified bound may exceed it.
    assert np.all(result.history["lower_bound"] <= reference.fun)
    assert result.nit < reference.nit


def test_lbfgs_on_a_nonsmooth_loss_stays_honest():
    X, y = a9a(1000)
    lam = 1e-3
    optimum = cvxpy_optimum(X, y, "hinge", lam)
    result = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="lbfgs",
                      rel_epsilon=1e-3, max_iter=300)
    assert result.fun >= optimum - 1e-8
    assert np.all(result.history["lower_bound"] <= optimum + 1e-8)
    assert result.gap == pytest.approx(result.fun - result.lower_bound)


def test_bound_solved_every_k_iterations_is_fresh_at_the_end():
    X, y = a9a(1000)
    lam = 1e-3
    risk = Recording(oracle_of("logistic", X, y))
    result = minimize(risk, np.zeros(X.shape[1]), lam, method="lbfgs", epsilon=1e-12, rel_epsilon=0,
                      max_iter=12, bound_every=5, max_planes=0, idle_age=0)
    history = result.history
    assert result.nit == 12 and result.status == 2
    # Rows 5 and 10 solved the QP; the others carry an older bound or a newer eq. 15 bound.
    replay = CuttingPlaneBound(X.shape[1], get_regularizer("l2"), lam, idle_age=0)
    for w, r, a in risk.calls:
        replay.add(w, r, a)
    assert history["lower_bound"][-1] == pytest.approx(replay.lower_bound(), rel=1e-12)
    assert np.all(np.diff(history["lower_bound"]) >= 0)


def test_lbfgs_stops_on_the_callback():
    X, y = a9a(500)

    def stop_at_three(row):
        if row.iteration == 3:
            raise StopIteration

    result = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), 1e-3, method="lbfgs",
                      rel_epsilon=0, callback=stop_at_three)
    assert result.nit == 3 and result.status == 3


@pytest.mark.parametrize("reg", [{"name": "lp", "p": 1.5}, {"name": "quadratic", "B": 2.0}])
def test_lbfgs_with_other_differentiable_regularizers_reaches_bmrms_optimum(reg):
    X, y = a9a(1000)
    lam = 1e-2
    regularizer = get_regularizer(**reg)
    regularizer.prepare(X.shape[1])
    reference = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), lam, reg=regularizer,
                         epsilon=1e-9, rel_epsilon=0)
    result = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), lam, method="lbfgs",
                      reg=regularizer, rel_epsilon=1e-4)
    assert reference.success and result.success
    assert abs(result.fun - reference.fun) <= 1e-4 * reference.fun
    assert np.all(result.history["lower_bound"] <= reference.fun)


@pytest.mark.parametrize("name", ["l1", "elastic_net", "entropy", "normalized_entropy"])
def test_lbfgs_refuses_a_nondifferentiable_regularizer(name):
    X, y = a9a(100)
    with pytest.raises(UsageError, match=f"differentiable everywhere.*'{name}'"):
        minimize_lbfgs(oracle_of("logistic", X, y), np.zeros(X.shape[1]), 1e-3, get_regularizer(name))


def test_solver_options():
    assert solver_options("lbfgs", {"memory": "6", "bound_every": "3"}) == {"memory": 6, "bound_every": 3}
    assert solver_options("smooth_lbfgs", {"mu": "1e-6"}) == {"mu": 1e-6}
    with pytest.raises(UsageError, match="solver 'bmrm' has no parameter 'memory'"):
        solver_options("bmrm", {"memory": "6"})
    with pytest.raises(UsageError, match="memory='x': expected an integer"):
        solver_options("lbfgs", {"memory": "x"})
    with pytest.raises(UsageError, match="unknown solver 'lbgfs'"):
        solver_options("lbgfs", {})
    X, y = a9a(100)
    with pytest.raises(UsageError, match="memory must be >= 1"):
        minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), 1e-3, method="lbfgs", memory=0)


def test_lbfgs_from_the_command_line(tmp_path):
    from prbmrm.model import load_model
    from prbmrm.cli.train import main

    out = str(tmp_path / "model.h5")
    assert main(["--loss", "logistic", "--solver", "lbfgs", "--solver-param", "memory=5",
                 "--rel-epsilon", "1e-4", "--quiet", "--out", out], SerialComm()) == 0
    model = load_model(out)
    assert model.attrs["solver"] == "lbfgs" and model.attrs["gap"] <= 1e-4 * model.attrs["objective"]


@pytest.mark.distributed
def test_lbfgs_run_equals_serial_run(comm, mpi_tmp_path):
    check_run_against_serial(comm, mpi_tmp_path, "logistic", 1e-4, rows=3000, method="lbfgs", rel_epsilon=1e-5,
                             bound_every=2)
