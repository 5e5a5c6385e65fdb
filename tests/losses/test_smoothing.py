"""Smoothed ROC-area and PRBEP risks (paper 004) and the smooth_lbfgs solver.

References: the per-pair Huber formula summed over all pairs (ROC area), the
smoothing QP over the balanced flips solved by cvxpy (PRBEP), central
finite differences, the nonsmooth losses, and BMRM's certified optimum.
"""

import cvxpy as cp
import numpy as np
import pytest

from helpers import check_against_serial, check_run_against_serial, load_svmlight, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local
from prbmrm.errors import UsageError
from prbmrm.losses import get_loss
from prbmrm.losses.smoothing import SMOOTHED_LOSSES, SmoothedPrbep, SmoothedRocArea
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import minimize

NAMES = sorted(SMOOTHED_LOSSES)


def tiny(seed, m=11, ties=False):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(m) < 0.4, 1.0, -1.0)
    y[:2] = [1.0, -1.0]
    f = rng.normal(size=m)
    if ties:
        f = np.round(f * 2) / 2   # many equal scores, and t_ij = 1 + f_j - f_i exactly 0 for some pairs
    return f, y


def roc_reference(f, y, mu):
    """(1/m') sum over (i positive, j negative) of huber_kappa(1 + f_j - f_i), kappa = mu m'."""
    pos, neg = f[y > 0], f[y < 0]
    pairs = pos.size * neg.size
    kappa = mu * pairs
    t = 1.0 + neg[None, :] - pos[:, None]
    huber = np.where(t <= 0, 0.0, np.where(t <= kappa, t * t / (2 * kappa), t - kappa / 2))
    return huber.sum() / pairs


def prbep_reference(f, y, mu):
    """max over beta in [0,1]^m, sum_P beta = sum_N beta, of the smoothed PRBEP objective (cvxpy)."""
    m, positive = y.size, y > 0
    beta = cp.Variable(m)
    objective = (cp.sum(cp.multiply(-2.0 * y * f / m, beta)) + cp.sum(beta[positive]) / positive.sum()
                 - mu / 2 * cp.sum_squares(beta))
    problem = cp.Problem(cp.Maximize(objective), [beta >= 0, beta <= 1,
                                                  cp.sum(beta[positive]) == cp.sum(beta[~positive])])
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return problem.value


def smoothed_risk(name, f, y, mu):
    risk_sum, c = SMOOTHED_LOSSES[name](mu=mu).coefficients(f, y)
    return risk_sum / y.size, c / y.size


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_smoothed_roc_area_equals_the_pairwise_huber_sum(seed, ties):
    f, y = tiny(seed, m=13, ties=ties)
    for mu in (1e-4, 1e-2, 0.3, 5.0):
        assert smoothed_risk("roc_area", f, y, mu)[0] == pytest.approx(roc_reference(f, y, mu), rel=1e-12)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_smoothed_prbep_equals_the_smoothing_qp(seed, ties):
    f, y = tiny(seed, ties=ties)
    for mu in (1e-3, 0.05, 1.0):
        assert smoothed_risk("prbep", f, y, mu)[0] == pytest.approx(prbep_reference(f, y, mu), abs=1e-8)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(3))
def test_gradient_equals_central_differences(name, seed):
    rng = np.random.default_rng(seed)
    X, y = rng.normal(size=(40, 5)), np.where(rng.random(40) < 0.3, 1.0, -1.0)
    oracle = DistributedRisk(SMOOTHED_LOSSES[name](mu=0.05), X, y, len(y), SerialComm())
    w = rng.normal(size=5)
    _, a = oracle(w)
    h = 1e-6
    numeric = [(oracle(w + h * e)[0] - oracle(w - h * e)[0]) / (2 * h) for e in np.eye(5)]
    np.testing.assert_allclose(a, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_smoothing_is_within_mu_d_and_converges_as_mu_vanishes(name):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:2000], y[:2000]
    rng = np.random.default_rng(3)
    exact = get_loss(name)
    for w in rng.normal(size=(3, X.shape[1])) * 0.3:
        f = X @ w
        r = exact.coefficients(f, y)[0] / y.size
        previous = -np.inf
        for deviation in np.geomspace(1.0, 1e-12, 13):   # mu = deviation / D
            loss = SMOOTHED_LOSSES[name](max_deviation=deviation)
            r_mu = loss.coefficients(f, y)[0] / y.size
            assert loss.last_mu * loss.diameter(y) == pytest.approx(deviation)
            assert r - deviation - 1e-12 <= r_mu <= r + 1e-12   # eq. 6 / eq. 16 of App. A
            assert r_mu >= previous - 1e-12                      # nonincreasing in mu
            previous = r_mu
            assert loss.exact_risk == pytest.approx(r, rel=1e-12)
        assert r_mu == pytest.approx(r, rel=1e-9, abs=1e-12)


def test_diameters_and_mu_from_the_allowed_deviation():
    y = np.array([1.0, 1.0, -1.0, -1.0, -1.0])
    assert SmoothedRocArea().diameter(y) == 3.0          # m+ m- / 2
    assert SmoothedPrbep().diameter(y) == 2.0            # min(m+, m-) (paper: m/2 = 2.5)
    assert SmoothedPrbep(max_deviation=0.1).smoothing(y) == pytest.approx(0.05)
    assert SmoothedPrbep(mu=0.3, max_deviation=0.1).smoothing(y) == 0.3
    f = np.array([0.2, -0.4, 0.1, 0.5, -1.0])
    for name in NAMES:   # mu = 0 is the nonsmooth loss itself
        risk_sum, c = SMOOTHED_LOSSES[name]().coefficients(f, y)
        exact_sum, exact_c = get_loss(name).coefficients(f, y)
        assert risk_sum == exact_sum
        np.testing.assert_array_equal(c, exact_c)
    with pytest.raises(UsageError, match="parameter mu must be a finite number >= 0"):
        SmoothedRocArea(mu=-1.0)


@pytest.mark.parametrize("name", NAMES)
def test_smooth_lbfgs_reaches_bmrms_optimum(name):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:3000], y[:3000]
    lam, eps = 1e-3, 1e-3

    def oracle():
        return DistributedRisk(get_loss(name), X, y, len(y), SerialComm())

    reference = minimize(oracle(), np.zeros(X.shape[1]), lam, epsilon=eps / 10, rel_epsilon=0)
    risk = oracle()
    result = minimize(risk, np.zeros(X.shape[1]), lam, method="smooth_lbfgs", epsilon=eps,
                      rel_epsilon=0)
    assert risk.loss.name == name   # the oracle's loss is restored
    assert result.success and result.gap <= eps
    # The objectives are the true J: the nonsmooth loss at result.w.
    exact = oracle()(result.w)[0] + 0.5 * lam * result.w @ result.w
    assert result.fun == pytest.approx(exact, rel=1e-12)
    assert result.fun <= reference.lower_bound + eps
    assert np.all(result.history["lower_bound"] <= reference.fun)
    assert result.nit < reference.nit


def test_smooth_lbfgs_lowers_mu_until_the_relative_gap_is_certified():
    # Started far from the optimum, J(w0) is ~60 times min J: mu chosen from J(w0) is too coarse
    # to certify 1e-4 relative, and is lowered to match the best J once L-BFGS has converged.
    rng = np.random.default_rng(0)
    X, w_true = rng.normal(size=(1000, 10)), rng.normal(size=10)
    y = np.where(X @ w_true + 0.5 * rng.normal(size=1000) > 0, 1.0, -1.0)
    risk = DistributedRisk(get_loss("roc_area"), X, y, len(y), SerialComm())
    deviations = []   # mu D of each row, read from the smoothed loss the oracle holds during the run
    result = minimize(risk, -10 * w_true, 1e-3, method="smooth_lbfgs", rel_epsilon=1e-4,
                      callback=lambda row: deviations.append(risk.loss.last_mu * risk.loss.diameter(y)))
    assert result.success and result.gap <= 1e-4 * result.fun
    # Row 1 is w0 unsmoothed; then mu D = half the target of J(w0), then of the best J.
    stages = list(dict.fromkeys(deviations))
    assert stages[0] == 0 and stages[1] == pytest.approx(0.5e-4 * result.history["objective"][0])
    assert len(stages) >= 3 and all(b <= a / 2 for a, b in zip(stages[1:], stages[2:]))
    assert stages[-1] == pytest.approx(0.5e-4 * result.fun, rel=1e-3)


def test_smooth_lbfgs_refuses_other_losses():
    X, y = load_svmlight("a9a.xz")
    risk = DistributedRisk(get_loss("hinge"), X[:50], y[:50], 50, SerialComm())
    with pytest.raises(UsageError, match="smooth_lbfgs.*roc_area, prbep.*'hinge'"):
        minimize(risk, np.zeros(X.shape[1]), 1e-3, method="smooth_lbfgs")
    risk = DistributedRisk(get_loss("roc_area"), X[:50], y[:50], 50, SerialComm())
    with pytest.raises(UsageError, match="chooses mu from the target accuracy"):
        minimize(risk, np.zeros(X.shape[1]), 1e-3, method="smooth_lbfgs", rel_epsilon=0)


def test_smooth_lbfgs_from_the_command_line(tmp_path):
    from prbmrm.model import load_model
    from prbmrm.cli.train import main

    out = str(tmp_path / "model.h5")
    assert main(["--loss", "roc_area", "--solver", "smooth_lbfgs", "--solver-param", "mu=1e-7",
                 "--quiet", "--out", out], SerialComm()) == 0
    assert load_model(out).attrs["solver"] == "smooth_lbfgs"


@pytest.mark.distributed
@pytest.mark.parametrize("name", NAMES)
def test_smoothed_oracle_equals_serial(comm, mpi_tmp_path, name):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:3000], y[:3000]
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 2)
    local = load_local(directory, comm)
    check_against_serial(lambda: SMOOTHED_LOSSES[name](mu=1e-6), local, comm, X, y)


@pytest.mark.distributed
@pytest.mark.parametrize("name", NAMES)
def test_smooth_lbfgs_run_equals_serial_run(comm, mpi_tmp_path, name):
    # Every rank holds the nonsmooth loss; rank 0 swaps in the smoothed one.
    check_run_against_serial(comm, mpi_tmp_path, name, 1e-4, rows=2000, method="smooth_lbfgs", rel_epsilon=3e-3)
