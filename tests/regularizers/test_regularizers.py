"""Regularizers against independent references: cvxpy on the subproblem and on the full primal,
the Fenchel-Young equality and finite differences, and the command line's checks of --reg-param."""

import json
import warnings

import cvxpy as cp
import numpy as np
import pytest

from helpers import load_svmlight, run_ranks
from prbmrm.cli import train as prbmrm_train
from prbmrm import training
from prbmrm.cli.common import run
from prbmrm.errors import PrbmrmError
from prbmrm.model import load_model
from prbmrm.regularizers import REGULARIZERS, SmoothDual, get_regularizer
from prbmrm.solvers import Bundle


def spd(d, seed=0):
    """A well-conditioned random symmetric positive definite d x d matrix."""
    M = np.random.default_rng(seed).normal(size=(d, d)) / np.sqrt(d)
    return np.eye(d) + M @ M.T


# (name, parameters as a function of the dimension): every regularizer, and
# the quadratic form with each kind of B.
CASES = {
    "l2": ("l2", lambda d: {}),
    "l1": ("l1", lambda d: {}),
    "lp": ("lp", lambda d: {}),
    "lp-1.2": ("lp", lambda d: {"p": 1.2}),
    "quadratic-scalar": ("quadratic", lambda d: {"B": 2.5}),
    "quadratic-diagonal": ("quadratic", lambda d: {"B": 0.5 + np.arange(d) / d}),
    "quadratic-matrix": ("quadratic", lambda d: {"B": spd(d)}),
    "entropy": ("entropy", lambda d: {}),
    "normalized_entropy": ("normalized_entropy", lambda d: {}),
    "elastic_net": ("elastic_net", lambda d: {}),
    "elastic_net-0.8": ("elastic_net", lambda d: {"l1_ratio": 0.8}),
}
assert {name for name, _ in CASES.values()} == set(REGULARIZERS)


def make(case, d):
    name, params = CASES[case]
    params = params(d)
    reg = get_regularizer(name, **params)
    reg.prepare(d)
    return reg, name, params


def cvx_omega(name, params, w):
    """Omega as a cvxpy expression, and the constraints of its domain."""
    if name == "l2":
        return 0.5 * cp.sum_squares(w), []
    if name == "l1":
        return cp.norm1(w), []
    if name == "lp":
        return 0.5 * cp.square(cp.pnorm(w, params.get("p", 1.5))), []
    if name == "quadratic":
        B = np.asarray(params["B"])
        if B.ndim == 2:
            return 0.5 * cp.quad_form(w, B, assume_PSD=True), []
        return 0.5 * cp.sum(cp.multiply(B, cp.square(w))), []
    if name in ("entropy", "normalized_entropy"):
        return -cp.sum(cp.entr(w)), [cp.sum(w) == 1] if name == "normalized_entropy" else []
    r = params.get("l1_ratio", 0.5)
    return r * cp.norm1(w) + 0.5 * (1 - r) * cp.sum_squares(w), []


def solve_tightly(problem):
    """Solve with Clarabel to 1e-12: its exp and power cones are only good to about 1e-6 in w at the
    default 1e-8. At this tolerance it may call a power-cone solution "inaccurate" although it is
    good to 1e-8; the checks against it stay strict either way."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Solution may be inaccurate")
        problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12,
                      max_iter=500)
    assert problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)
    return problem.value


def domain_point(name, d, rng):
    """A random point of Omega's domain, in its interior where that matters."""
    if name == "entropy":
        return rng.exponential(size=d)
    if name == "normalized_entropy":
        return rng.dirichlet(np.ones(d))
    return rng.normal(size=d)


# ---- the subproblem (7) against cvxpy ----

@pytest.mark.parametrize("case", CASES)
def test_subproblem_matches_cvxpy(case):
    rng = np.random.default_rng(list(CASES).index(case))
    for _ in range(3):
        t, d = rng.integers(5, 21), rng.integers(10, 31)
        lam = 10 ** rng.uniform(-1, 1)
        reg, name, params = make(case, d)
        floor = rng.choice([0.0, -3.0]) if name == "l1" else -np.inf
        if name == "l1":
            reg.prepare(d, floor)
        bundle = Bundle(d, reg.metric)
        alpha = np.zeros(0)
        for _ in range(t):
            # As BMRM does: warm starts, and planes idle for 2 solves dropped
            # (the L1 model must follow the removals).
            bundle.add(rng.normal(size=d), rng.normal())
            w, lower_bound, alpha = reg.solve_subproblem(bundle, lam, np.append(alpha, 0.0))
            bundle.update_idle(alpha)
            alpha = bundle.prune(2, alpha)
        bundle.add(rng.normal(size=d), rng.normal())
        w, lower_bound, alpha = reg.solve_subproblem(bundle, lam, np.append(alpha, 0.0))
        A, b = bundle.A, bundle.b

        x = cp.Variable(d)
        omega, constraints = cvx_omega(name, params, x)
        model = cp.maximum(cp.max(A @ x + b), floor) if name == "l1" else cp.max(A @ x + b)
        optimum = solve_tightly(cp.Problem(cp.Minimize(lam * omega + model), constraints))

        J_t = lam * reg.value(w) + max((A @ w + b).max(), floor)
        scale = max(1.0, abs(optimum))
        assert J_t == pytest.approx(optimum, rel=1e-6, abs=1e-6)
        assert lower_bound <= optimum + 1e-9 * scale
        assert lower_bound == pytest.approx(optimum, rel=1e-6, abs=1e-6)
        assert np.linalg.norm(w - x.value) <= 1e-6 * max(1.0, np.linalg.norm(x.value))
        assert alpha.min() >= 0 and alpha.sum() <= 1 + 1e-12
        if name != "l1":
            assert alpha.sum() == pytest.approx(1.0, abs=1e-12)


# ---- Omega, Omega^* and their derivatives against each other ----

@pytest.mark.parametrize("case", CASES)
def test_fenchel_young_and_finite_differences(case):
    rng = np.random.default_rng(1)
    d = 12
    reg, name, _ = make(case, d)
    if name == "l1":
        mu = rng.uniform(-0.9, 0.9, size=d)  # Omega^* is finite inside the box only
    else:
        mu = 2.0 * rng.normal(size=d)
        if name == "elastic_net":  # keep clear of the soft threshold's kinks
            r = reg.l1_ratio
            mu[np.abs(np.abs(mu) - r) < 1e-2] += 0.1
    grad = reg.conjugate_gradient(mu)
    # Fenchel-Young: Omega^*(mu) = <mu, w> - Omega(w) at w = grad Omega^*(mu).
    assert np.isfinite(reg.value(grad))
    assert reg.conjugate(mu) == pytest.approx(mu @ grad - reg.value(grad), rel=1e-10, abs=1e-12)
    h = 1e-6
    steps = np.eye(d) * h
    numeric = np.array([(reg.conjugate(mu + e) - reg.conjugate(mu - e)) / (2 * h) for e in steps])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)
    if isinstance(reg, SmoothDual):
        diag, c, u = reg.conjugate_hessian(mu)
        hessian = np.diag(diag) + (0.0 if u is None else c * np.outer(u, u))
        numeric = np.array([(reg.conjugate_gradient(mu + e) - reg.conjugate_gradient(mu - e)) / (2 * h)
                            for e in steps])
        np.testing.assert_allclose(hessian, numeric, rtol=1e-5, atol=1e-6)
    # The other way: s in dOmega(w) gives Omega^*(s) = <s, w> - Omega(w), and
    # the subgradient inequality holds at other points of the domain.
    w = domain_point(name, d, rng)
    s = reg.subgradient(w)
    assert reg.conjugate(s) == pytest.approx(s @ w - reg.value(w), rel=1e-10, abs=1e-12)
    for _ in range(5):
        v = domain_point(name, d, rng)
        assert reg.value(v) >= reg.value(w) + s @ (v - w) - 1e-12
    # The start is argmin Omega, in the domain.
    start = reg.initial_point(d)
    assert np.isfinite(reg.value(start))
    assert all(reg.value(start) <= reg.value(domain_point(name, d, rng)) for _ in range(5))


def test_domains():
    assert get_regularizer("entropy").value(np.array([0.5, -1e-9])) == np.inf
    assert get_regularizer("entropy").value(np.array([0.0, 1.0])) == 0.0  # 0 log 0 = 0
    assert get_regularizer("normalized_entropy").value(np.array([0.5, 0.6])) == np.inf
    assert get_regularizer("l1").conjugate(np.array([0.5, -1.5])) == np.inf


# ---- BMRM with each regularizer against cvxpy on the full primal ----

@pytest.fixture(scope="module")
def a9a_2000():
    X, y = load_svmlight("a9a.xz")
    return X[:2000], y[:2000]


TRAINED = ["l2", "l1", "lp", "quadratic-matrix", "entropy", "normalized_entropy", "elastic_net"]


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
@pytest.mark.parametrize("case", TRAINED)
def test_training_reaches_cvxpy_optimum(a9a_2000, case, loss):
    X, y = a9a_2000
    name, params = CASES[case]
    params = params(X.shape[1])
    lam = 1e-2
    result, _, _ = training.run((X, y), loss=loss, lam=lam, reg=name, reg_params=params,
                                    rel_epsilon=1e-4)
    w = cp.Variable(X.shape[1])
    f = X @ w
    risk = (cp.sum(cp.pos(1 - cp.multiply(y, f))) if loss == "hinge"
            else cp.sum(cp.logistic(-cp.multiply(y, f)))) / len(y)
    omega, constraints = cvx_omega(name, params, w)
    objective = lam * omega + risk
    problem = cp.Problem(cp.Minimize(objective), constraints)
    problem.solve(solver=cp.CLARABEL)
    optimum = problem.value
    assert result.success
    assert result.fun == pytest.approx(optimum, rel=1e-3)
    assert np.all(result.history["lower_bound"] <= optimum + 1e-6 * abs(optimum))
    w.value = result.w  # J at BMRM's w, written out independently of prbmrm
    assert result.fun == pytest.approx(objective.value, rel=1e-9)
    if name == "l1":
        assert np.count_nonzero(result.w) <= X.shape[1] // 4  # exact zeros, from the LP's basis


def test_l1_holds_the_model_above_the_risk_floor():
    # Poisson's risk is negative on counts above e: the LP's xi >= 0 of a
    # nonnegative loss would cut off the optimum; the loss's floor does not.
    X, y = load_svmlight("abalone.xz")
    X = X.toarray()[:1000]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    y = y[:1000]
    lam = 0.1
    result, _, loss = training.run((X, y), loss="poisson", lam=lam, reg="l1", bias=True,
                                       rel_epsilon=1e-4)
    assert loss.risk_floor == min(c - c * np.log(c) for c in np.unique(y))
    Xb = np.c_[X, np.ones(len(y))]
    w = cp.Variable(Xb.shape[1])
    optimum = solve_tightly(cp.Problem(cp.Minimize(
        lam * cp.norm1(w) + cp.sum(cp.exp(Xb @ w) - cp.multiply(y, Xb @ w)) / len(y))))
    assert loss.risk_floor < optimum < 0
    assert result.fun == pytest.approx(optimum, rel=1e-3)
    assert np.all(result.history["lower_bound"] <= optimum + 1e-9 * abs(optimum))


def test_overflow_is_reported():
    # exp(-A^T alpha / lam - 1) with entries 1000 - 1: the entropy's weights overflow.
    bundle = Bundle(3)
    bundle.add(np.full(3, -1000.0), 0.0)
    with pytest.raises(PrbmrmError, match="entropy subproblem overflows"):
        get_regularizer("entropy").solve_subproblem(bundle, 1.0)
    # The L1 LP cannot take planes beyond HiGHS' largest matrix value.
    bundle.add(np.full(3, 1e16), 0.0)
    with pytest.raises(PrbmrmError, match="l1 subproblem got a cutting plane with entries beyond"):
        get_regularizer("l1").solve_subproblem(bundle, 1.0)


# ---- the command line ----

def train(tmp_path, capsys, *args):
    out = tmp_path / "m.h5"
    status = run(prbmrm_train.main, "prbmrm.cli.train", ["--lam", "1e-2", "--out", str(out), *args])
    return status, capsys.readouterr(), out


def test_cli_reports_and_stores_nonzeros(tmp_path, capsys):
    status, output, out = train(tmp_path, capsys, "--reg", "l1")
    assert status == 0, output.err
    model = load_model(str(out))
    nonzeros = np.count_nonzero(model.w)
    assert model.attrs["nonzeros"] == nonzeros < model.w.size
    assert f"{nonzeros} of {model.w.size} weights nonzero" in output.out
    assert model.attrs["reg"] == "l1"
    # On 2 ranks (rank 0 alone holds the LP) the same iterates, hence the same model.
    out2 = tmp_path / "m2.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--reg", "l1", "--lam", "1e-2", "--quiet",
                                 "--out", str(out2)], timeout=60)
    assert completed.returncode == 0, completed.stderr
    model2 = load_model(str(out2))
    assert model2.attrs["iterations"] == model.attrs["iterations"]
    np.testing.assert_allclose(model2.w, model.w, rtol=1e-9, atol=1e-12)

    status, output, out = train(tmp_path, capsys, "--reg", "lp", "--reg-param", "p=1.2", "--quiet")
    assert status == 0, output.err
    model = load_model(str(out))
    assert json.loads(model.attrs["reg_params"]) == {"p": "1.2"}
    assert json.loads(model.attrs["options"])["reg_param"] == ["p=1.2"]


def test_cli_quadratic_from_files(tmp_path, capsys):
    # The demo has 30 features: B = c I as a number, a diagonal file and a
    # matrix file give the same model. Exact subproblems: the loose rule's
    # projected gradient stops where rounding of the three forms of B decides,
    # so its runs agree only within their certified gaps.
    np.savetxt(tmp_path / "diag.txt", np.full(30, 2.0))
    np.savetxt(tmp_path / "matrix.txt", 2.0 * np.eye(30))
    objectives = []
    for B in ("2", tmp_path / "diag.txt", tmp_path / "matrix.txt"):
        status, output, out = train(tmp_path, capsys, "--reg", "quadratic", "--reg-param", f"B={B}",
                                    "--solver", "bmrm", "--solver-param", "inexact=0")
        assert status == 0, output.err
        objectives.append(load_model(str(out)).attrs["objective"])
    assert objectives == pytest.approx([objectives[0]] * 3, rel=1e-12)


@pytest.mark.parametrize("args, B, fragment", [
    (["--reg", "l3"], None, "unknown regularizer 'l3'"),
    (["--reg", "l2", "--reg-param", "p=1.5"], None, "regularizer 'l2' has no parameter 'p'"),
    (["--reg", "lp", "--reg-param", "p"], None, "--reg-param expects NAME=VALUE"),
    (["--reg", "lp", "--reg-param", "p=1"], None, "parameter p must be in (1, 2], got 1"),
    (["--reg", "lp", "--reg-param", "p=2.5"], None, "parameter p must be in (1, 2], got 2.5"),
    (["--reg", "lp", "--reg-param", "p=abc"], None, "parameter p='abc': expected a number"),
    (["--reg", "elastic_net", "--reg-param", "l1_ratio=1"], None, "parameter l1_ratio must be in (0, 1)"),
    (["--reg", "elastic_net", "--reg-param", "l1_ratio=0"], None, "parameter l1_ratio must be in (0, 1)"),
    (["--reg", "quadratic", "--reg-param", "B=-1"], None, "the diagonal of B must be > 0"),
    (["--reg", "quadratic", "--reg-param", "B=no-such-file.txt"], None, "cannot read the file"),
    (["--reg", "quadratic"], np.ones(5), "the model has 30 weights, B has 5"),
    (["--reg", "quadratic"], np.diag(np.r_[1.0, -1.0, np.ones(28)]), "not positive definite"),
    (["--reg", "quadratic"], np.eye(30) + np.triu(np.ones((30, 30)), 1), "not symmetric"),
    (["--reg", "quadratic"], np.ones((2, 3)), "expected d numbers or a d x d matrix, got 2 x 3"),
    (["--reg", "quadratic"], np.r_[np.ones(29), 0.0], "the diagonal of B must be > 0, got 0"),
])
def test_cli_rejects_bad_reg_params(tmp_path, capsys, args, B, fragment):
    if B is not None:
        np.savetxt(tmp_path / "B.txt", B)
        args = [*args, "--reg-param", f"B={tmp_path / 'B.txt'}"]
    status, output, out = train(tmp_path, capsys, *args)
    assert status == 2
    errors = output.err.strip().splitlines()
    assert len(errors) == 1 and fragment in errors[0], output.err
    assert not out.exists()


def test_bad_b_size_stops_every_rank(tmp_path):
    np.savetxt(tmp_path / "b.txt", np.ones(5))
    out = tmp_path / "m.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--reg", "quadratic", "--reg-param",
                                 f"B={tmp_path / 'b.txt'}", "--out", str(out)], timeout=60)
    assert completed.returncode == 2
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "the model has 30 weights, B has 5" in errors[0], completed.stderr
    assert not out.exists()
