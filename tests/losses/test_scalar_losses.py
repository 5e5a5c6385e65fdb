"""Every scalar loss of the catalogue (prbmrm.losses.scalar.SCALAR_LOSSES).

Each test iterates over SCALAR_LOSSES, so a new scalar loss is covered at once;
the tables below (independent formulas, cvxpy expressions, training cases,
parameter ranges) must then get an entry, and the tests say so if one is missing:

(a) the subgradient inequality of the empirical risk, (b) central finite
differences away from the kinks, (c) the risk against a formula written out
here, (d) BMRM against cvxpy (Clarabel) on the full primal of real data,
(e) 1, 2 and 3 ranks give the serial risk and subgradient (marker
``distributed``), and the command line end to end.

Data of the training cases (d), all from ../shared/data:

- a9a: the first 2000 rows, labels +-1 (binary losses).
- a9a, rows scaled to unit norm (exponential): plain BMRM takes the first
  step w_1 = -a_0 / lam, and exp(-y f) of that step overflows (or its planes
  differ by 1e30 and the dual loses the small ones) unless lam / max||x||^2
  is about 1e-2 or more; hence lam in {1e-1, 1e-2}.
- a9a's first 2000 positive rows (novelty detection).
- abalone (4177 rows), cadata (2000 random rows), housing (506 rows):
  features standardized (zero mean, unit variance) plus a constant column,
  targets standardized (zero mean, unit variance), so that lam in
  {1e-2, 1e-4} is sensible and the Huber/epsilon/quantile parameters are
  in units of the targets' standard deviation.
- abalone for Poisson: rings as counts, the standardized features plus the
  constant column scaled to unit row norm, lam in {1, 0.3}. From w = 0 the
  first gradient is about (1 - mean rings) = -9 on the constant feature;
  for smaller lam BMRM's first step overflows exp(f) (see
  test_overflow_is_reported_by_the_solver).
"""

import functools
import math

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from helpers import check_against_serial, load_svmlight, run_ranks, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local, write_shards
from prbmrm.errors import InputError, UsageError
from prbmrm.losses import LOSSES, get_loss
from prbmrm.losses.scalar import SCALAR_LOSSES
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import minimize

NAMES = [cls.name for cls in SCALAR_LOSSES]

# Valid non-default values to draw for each parameter name; out-of-range values to reject.
PARAM_VALUES = {"tau": st.floats(0.02, 0.98), "epsilon": st.floats(0.0, 1.5),
                "delta": st.floats(0.05, 3.0), "rho": st.floats(-2.0, 2.0)}
BAD_PARAM_VALUES = {"tau": ["0", "1", "2", "-0.5", "nan"], "epsilon": ["-0.1", "inf", "nan"],
                    "delta": ["0", "-1", "inf", "nan"], "rho": ["inf", "nan"]}


# --------------------------------------------------------------------------
# Independent formulas: l(f, y) written out piecewise, and cvxpy's version
# --------------------------------------------------------------------------

def _huber_hinge(f, y, delta):
    z = y * f
    return np.select([z > 1 + delta, z >= 1 - delta],
                     [0.0, (1 + delta - z) ** 2 / (4 * delta)], 1 - z)


FORMULAS = {
    "hinge": lambda f, y, p: np.where(y * f < 1, 1 - y * f, 0.0),
    "squared_hinge": lambda f, y, p: np.where(y * f < 1, 0.5 * (1 - y * f) ** 2, 0.0),
    "zero_hinge": lambda f, y, p: np.where(y * f < 0, -y * f, 0.0),
    "squared_zero_hinge": lambda f, y, p: np.where(y * f < 0, 0.5 * f ** 2, 0.0),
    "exponential": lambda f, y, p: np.exp(-y * f),
    "logistic": lambda f, y, p: np.log1p(np.exp(-y * f)),
    "huber_hinge": lambda f, y, p: _huber_hinge(f, y, p["delta"]),
    "novelty": lambda f, y, p: np.where(f < p["rho"], p["rho"] - f, 0.0),
    "least_squares": lambda f, y, p: 0.5 * (f - y) ** 2,
    "least_absolute_deviation": lambda f, y, p: np.abs(y - f),
    "quantile": lambda f, y, p: np.where(y >= f, p["tau"] * (y - f), (1 - p["tau"]) * (f - y)),
    "epsilon_insensitive": lambda f, y, p: np.where(np.abs(f - y) > p["epsilon"],
                                                    np.abs(f - y) - p["epsilon"], 0.0),
    "huber": lambda f, y, p: np.where(np.abs(f - y) <= p["delta"], 0.5 * (f - y) ** 2,
                                      p["delta"] * (np.abs(f - y) - p["delta"] / 2)),
    "poisson": lambda f, y, p: np.exp(f) - y * f,
}

CVXPY_LOSSES = {
    "hinge": lambda f, y, p: cp.pos(1 - cp.multiply(y, f)),
    "squared_hinge": lambda f, y, p: 0.5 * cp.square(cp.pos(1 - cp.multiply(y, f))),
    "zero_hinge": lambda f, y, p: cp.pos(-cp.multiply(y, f)),
    "squared_zero_hinge": lambda f, y, p: 0.5 * cp.square(cp.pos(-cp.multiply(y, f))),
    "exponential": lambda f, y, p: cp.exp(-cp.multiply(y, f)),
    "logistic": lambda f, y, p: cp.logistic(-cp.multiply(y, f)),
    # huber(v, 2h) / (4h) is v^2 / (4h) up to v = 2h and v - h beyond: Chapelle's loss at v = pos(1 + h - y f).
    "huber_hinge": lambda f, y, p: cp.huber(cp.pos(1 + p["delta"] - cp.multiply(y, f)),
                                            2 * p["delta"]) / (4 * p["delta"]),
    "novelty": lambda f, y, p: cp.pos(p["rho"] - f),
    "least_squares": lambda f, y, p: 0.5 * cp.square(f - y),
    "least_absolute_deviation": lambda f, y, p: cp.abs(f - y),
    "quantile": lambda f, y, p: cp.maximum(p["tau"] * (y - f), (1 - p["tau"]) * (f - y)),
    "epsilon_insensitive": lambda f, y, p: cp.pos(cp.abs(f - y) - p["epsilon"]),
    # cvxpy's huber(r, M) is r^2 inside and 2M|r| - M^2 outside: twice Huber's robust loss.
    "huber": lambda f, y, p: 0.5 * cp.huber(f - y, p["delta"]),
    "poisson": lambda f, y, p: cp.exp(f) - cp.multiply(y, f),
}


def params_of(loss):
    return {name: getattr(loss, name) for name in loss.params}


def draw_params(data, cls):
    """Parameters for `cls`: each one at its default or at a drawn valid value."""
    params = {}
    for name in cls.params:
        assert name in PARAM_VALUES, f"add a range for parameter {name!r} of loss {cls.name!r}"
        if data.draw(st.booleans(), label=f"non-default {name}"):
            params[name] = data.draw(PARAM_VALUES[name], label=name)
    return params


def labels_for(loss, rng, m):
    """Labels the loss accepts: +-1 for classification, reals for regression, else counts."""
    if loss.task == "classification":
        return rng.choice([-1.0, 1.0], size=m)
    if loss.check_labels(None, "real") is None:
        return 2.0 * rng.normal(size=m)
    y = rng.poisson(3.0, size=m).astype(np.float64)
    assert loss.check_labels(np.unique(y), "integer") is None
    return y


def features(rng, m, d, sparse):
    if sparse:
        return sp.random(m, d, density=0.4, random_state=rng, format="csr",
                         data_rvs=rng.standard_normal)
    return rng.normal(size=(m, d))


def empirical_risk(loss, w, X, y):
    """(R_emp(w), a) through the distributed oracle on one process."""
    return DistributedRisk(loss, X, y, len(y), SerialComm())(w)


def test_tables_cover_every_scalar_loss():
    assert len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        assert LOSSES[name] is next(c for c in SCALAR_LOSSES if c.name == name)
        assert name in FORMULAS and name in CVXPY_LOSSES and name in TRAINING_CASES, name
        for parameter in LOSSES[name].params:
            assert parameter in PARAM_VALUES and parameter in BAD_PARAM_VALUES, (name, parameter)


# --------------------------------------------------------------------------
# (a) subgradient inequality, (b) finite differences, (c) independent formula
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), scale=st.floats(0.01, 3.0),
       sparse=st.booleans())
def test_subgradient_inequality(name, data, seed, scale, sparse):
    loss = get_loss(name, **draw_params(data, LOSSES[name]))
    rng = np.random.default_rng(seed)
    X = features(rng, 40, 6, sparse)
    y = labels_for(loss, rng, 40)
    w, v = scale * rng.normal(size=(2, 6))
    r_w, a = empirical_risk(loss, w, X, y)
    r_v, _ = empirical_risk(loss, v, X, y)
    assert np.isfinite(r_w) and np.isfinite(r_v)
    assert r_v >= r_w + a @ (v - w) - 1e-10 * (1 + abs(r_v) + abs(r_w))


@pytest.mark.parametrize("name", NAMES)
def test_subgradient_inequality_at_the_kinks(name):
    # Per example, at each breakpoint f = k: l(g) >= l(k) + l'(k) (g - k) for g on both sides.
    rng = np.random.default_rng(3)
    cls = LOSSES[name]
    for params in ({}, {p: 0.3 for p in cls.params}):
        loss = cls(**params)
        y = labels_for(loss, rng, 50)
        kinks = loss.kinks(y)
        assert kinks.shape[0] == len(y)
        for k in kinks.T:
            for step in (1e-6, 0.1, 2.0):
                for g in (k - step, k + step):
                    assert np.all(loss.value(g, y) >= loss.value(k, y) + loss.derivative(k, y) * (g - k)
                                  - 1e-12 * (1 + np.abs(loss.value(g, y))))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), sparse=st.booleans())
def test_gradient_matches_central_differences(name, data, seed, sparse):
    loss = get_loss(name, **draw_params(data, LOSSES[name]))
    rng = np.random.default_rng(seed)
    X = features(rng, 60, 5, sparse)
    y = labels_for(loss, rng, 60)
    w = 0.7 * rng.normal(size=5)
    h = 1e-6
    # Keep the rows whose score stays on one side of every kink when w moves by h along an axis.
    f = X @ w
    reach = 2 * h * np.abs(X).max(axis=1)
    reach = reach.toarray().ravel() if sp.issparse(reach) else np.ravel(reach)
    kinks = loss.kinks(y)
    if kinks.shape[1]:
        keep = np.all(np.abs(f[:, None] - kinks) > reach[:, None] + 1e-9, axis=1)
        X, y = X[keep], y[keep]
    r, a = empirical_risk(loss, w, X, y)
    numeric = np.array([(empirical_risk(loss, w + h * e, X, y)[0]
                         - empirical_risk(loss, w - h * e, X, y)[0]) / (2 * h) for e in np.eye(5)])
    np.testing.assert_allclose(a, numeric, rtol=1e-5, atol=1e-7 * (1 + abs(r)))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sparse", [False, True])
def test_risk_matches_independent_formula(name, sparse):
    cls = LOSSES[name]
    rng = np.random.default_rng(1)
    for params in ({}, {p: 0.37 for p in cls.params}):
        loss = cls(**params)
        X = features(rng, 80, 5, sparse)
        y = labels_for(loss, rng, 80)
        w = rng.normal(size=5)
        expected = np.mean(FORMULAS[name](np.asarray(X @ w).ravel(), y, params_of(loss)))
        assert empirical_risk(loss, w, X, y)[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_value_and_derivative_are_finite_for_large_scores(name):
    loss = get_loss(name)
    y = labels_for(loss, np.random.default_rng(4), 4)
    for f in (np.full(4, 500.0), np.full(4, -500.0), np.array([1e150, -1e150, 0.0, 1e-300])):
        if name in ("exponential", "poisson") and np.abs(f).max() > 700:
            continue  # exp overflows to inf there: see test_overflow_is_reported_by_the_solver
        with np.errstate(all="raise", under="ignore"):
            value, derivative = loss.value(f, y), loss.derivative(f, y)
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(derivative)), (f, value, derivative)
        assert np.all(value >= 0) or name == "poisson"


@pytest.mark.parametrize("name", ["exponential", "poisson"])
def test_overflow_is_reported_by_the_solver(name):
    loss = get_loss(name)
    f = np.array([800.0, -800.0]) * (-1 if name == "exponential" else 1)
    assert np.isposinf(loss.value(f, np.array([1.0, 1.0]))[0])
    # Plain BMRM from w = 0 with a small lam: the first step's scores overflow exp.
    X, y = load_svmlight("a9a.xz")
    X, y = X[:500], y[:500]
    if name == "poisson":
        X, y = abalone_standardized()[0], abalone_counts()[1]
    with pytest.raises(InputError, match="not finite at iteration 2"):
        minimize(DistributedRisk(loss, X, y, len(y), SerialComm()), np.zeros(X.shape[1]), 1e-4,
                 epsilon=0, rel_epsilon=1e-3)


# --------------------------------------------------------------------------
# Parameters, labels, measures
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_parameters_are_range_checked(name):
    cls = LOSSES[name]
    for parameter, default in cls.params.items():
        assert getattr(cls(), parameter) == default
        for value in BAD_PARAM_VALUES[parameter]:
            with pytest.raises(UsageError, match=f"loss '{name}': parameter {parameter} must be"):
                get_loss(name, **{parameter: value})


def test_parameter_defaults():
    assert {name: dict(LOSSES[name].params) for name in NAMES if LOSSES[name].params} == {
        "novelty": {"rho": 1.0}, "quantile": {"tau": 0.5}, "epsilon_insensitive": {"epsilon": 0.1},
        "huber": {"delta": 1.0}, "huber_hinge": {"delta": 0.5}}


@pytest.mark.parametrize("name", NAMES)
def test_label_checks(name):
    loss = get_loss(name)
    plus_minus = np.array([-1.0, 1.0])
    assert loss.check_labels(np.array([0.0, 1.0]), "multilabel") is not None or name == "novelty"
    if loss.task == "classification":
        assert loss.check_labels(plus_minus, "binary") is None
        message = loss.check_labels(np.array([0.0, 1.0, 2.0]), "integer")
        assert "{-1, +1}" in message and "{0, 1, 2}" in message
        assert loss.check_labels(None, "real") is not None
    elif name == "poisson":
        assert loss.check_labels(np.array([0.0, 3.0, 7.0]), "integer") is None
        assert "negative labels: {-1, 1}" in loss.check_labels(plus_minus, "binary")
        assert "non-integer" in loss.check_labels(None, "real")
    else:
        assert loss.task in ("regression", "novelty")
        for classes, kind in ((None, "real"), (plus_minus, "binary"), (np.arange(5.0), "integer")):
            assert loss.check_labels(classes, kind) is None


def test_metrics():
    y = np.array([1.0, -1.0, 1.0, -1.0])
    f = np.array([0.5, 0.5, -0.2, -3.0])
    for name in NAMES:
        if LOSSES[name].task == "classification":
            assert get_loss(name).metrics(f, y) == {"accuracy": 0.5, "error_rate": 0.5}
    target, score = np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.05, 1.5, 2.0, 1.0])
    regression = {"rmse": math.sqrt((0.05 ** 2 + 0.25 + 4) / 4), "mae": (0.05 + 0.5 + 2) / 4}
    measures = get_loss("least_absolute_deviation").metrics(score, target)
    assert measures == pytest.approx(regression)
    measures = get_loss("quantile", tau=0.8).metrics(score, target)
    pinball = (0.2 * 0.05 + 0.2 * 0.5 + 0 + 0.8 * 2) / 4
    assert measures == pytest.approx(dict(regression, pinball=pinball, coverage=0.75))
    measures = get_loss("epsilon_insensitive", epsilon=0.1).metrics(score, target)
    assert measures == pytest.approx(dict(regression, inside_tube=0.5))
    assert get_loss("novelty", rho=0.5).metrics(f, y) == {"flagged_fraction": 0.5}


# --------------------------------------------------------------------------
# (d) BMRM reaches cvxpy's optimum of the full primal on real data
# --------------------------------------------------------------------------

def _standardize(X):
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    scale = X.std(axis=0)
    scale[scale == 0] = 1.0
    return np.hstack([(X - X.mean(axis=0)) / scale, np.ones((X.shape[0], 1))])


def _standardize_target(y):
    return (y - y.mean()) / y.std()


@functools.lru_cache(maxsize=None)
def a9a():
    X, y = load_svmlight("a9a.xz")
    return X[:2000], y[:2000]


@functools.lru_cache(maxsize=None)
def a9a_unit_rows():
    X, y = a9a()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
    return sp.diags(1.0 / norms) @ X, y


@functools.lru_cache(maxsize=None)
def a9a_positive():
    X, y = load_svmlight("a9a.xz")
    X = X[y > 0][:2000]
    return X, np.ones(X.shape[0])


@functools.lru_cache(maxsize=None)
def abalone_standardized():
    X, y = load_svmlight("abalone.xz")
    return _standardize(X), _standardize_target(y)


@functools.lru_cache(maxsize=None)
def abalone_counts():
    X, rings = load_svmlight("abalone.xz")
    X = _standardize(X)
    return X / np.linalg.norm(X, axis=1, keepdims=True), rings


@functools.lru_cache(maxsize=None)
def cadata():
    X, y = load_svmlight("cadata.xz")
    rows = np.sort(np.random.default_rng(0).choice(X.shape[0], 2000, replace=False))
    return _standardize(X[rows]), _standardize_target(y[rows])


@functools.lru_cache(maxsize=None)
def housing():
    X, y = load_svmlight("housing.xz")
    return _standardize(X), _standardize_target(y)


SMALL_LAMS = (1e-2, 1e-4)
# loss name -> [(data loader, parameters, lams)]
TRAINING_CASES = {
    "hinge": [(a9a, {}, SMALL_LAMS)],
    "squared_hinge": [(a9a, {}, SMALL_LAMS)],
    "zero_hinge": [(a9a, {}, SMALL_LAMS)],  # optimum 0 at w = 0: the loss is homogeneous
    "squared_zero_hinge": [(a9a, {}, SMALL_LAMS)],
    "exponential": [(a9a_unit_rows, {}, (1e-1, 1e-2))],
    "logistic": [(a9a, {}, SMALL_LAMS)],
    "huber_hinge": [(a9a, {}, SMALL_LAMS), (a9a, {"delta": 0.1}, (1e-3,))],
    "novelty": [(a9a_positive, {}, SMALL_LAMS), (a9a_positive, {"rho": 0.2}, (1e-3,))],
    "least_squares": [(cadata, {}, SMALL_LAMS), (housing, {}, SMALL_LAMS)],
    "least_absolute_deviation": [(abalone_standardized, {}, SMALL_LAMS), (housing, {}, (1e-3,))],
    "quantile": [(abalone_standardized, {}, SMALL_LAMS),
                 (abalone_standardized, {"tau": 0.9}, SMALL_LAMS), (cadata, {"tau": 0.2}, (1e-3,))],
    "epsilon_insensitive": [(abalone_standardized, {}, SMALL_LAMS),
                            (housing, {"epsilon": 0.5}, (1e-3,))],
    "huber": [(abalone_standardized, {}, SMALL_LAMS), (cadata, {"delta": 0.3}, SMALL_LAMS)],
    "poisson": [(abalone_counts, {}, (1.0, 0.3))],
}

TRAINING_IDS = [(name, i, lam) for name in NAMES
                for i, (_, _, lams) in enumerate(TRAINING_CASES.get(name, [(None, None, (None,))]))
                for lam in lams]


def cvxpy_optimum(loss, X, y, lam):
    """min_w lam/2 ||w||^2 + (1/m) sum_i l(<w, x_i>, y_i), solved by Clarabel to 1e-10."""
    w = cp.Variable(X.shape[1])
    risk = cp.sum(CVXPY_LOSSES[loss.name](X @ w, y, params_of(loss))) / len(y)
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + risk))
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert problem.status == cp.OPTIMAL, problem.status
    return problem.value


@pytest.mark.parametrize("name, case, lam", TRAINING_IDS,
                         ids=[f"{n}-{c}-{lam:g}" if lam else n for n, c, lam in TRAINING_IDS])
def test_bmrm_reaches_cvxpy_optimum(name, case, lam):
    assert name in TRAINING_CASES, f"add a training case for loss {name!r}"
    load, params, _ = TRAINING_CASES[name][case]
    X, y = load()
    loss = get_loss(name, **params)
    assert loss.check_labels(*_classes_and_kind(y)) is None
    reference = cvxpy_optimum(loss, X, y, lam)
    eps = 1e-3 * abs(reference)
    tiny = 1e-9
    result = minimize(DistributedRisk(loss, X, y, len(y), SerialComm()), np.zeros(X.shape[1]), lam,
                      epsilon=eps, rel_epsilon=0, max_iter=20000)
    assert result.success, result.message
    print(f"{name} {params} lam={lam:g}: cvxpy {reference:.10g}, bmrm {result.fun:.10g} "
          f"({(result.fun - reference) / abs(reference):+.2e} relative) in {result.nit} iterations; "
          f"highest lower bound {result.history['lower_bound'].max():.10g}")
    assert reference - eps - tiny <= result.fun <= reference + eps + tiny
    assert np.all(result.history["lower_bound"] <= reference + 1e-7 * abs(reference) + tiny)
    # The reported objective is J at the returned w.
    f = np.asarray(X @ result.w).ravel()
    objective = 0.5 * lam * result.w @ result.w + np.mean(FORMULAS[name](f, y, params_of(loss)))
    assert result.fun == pytest.approx(objective, rel=1e-10, abs=1e-14)


def _classes_and_kind(y):
    from prbmrm.io import infer_label_kind

    kind, classes = infer_label_kind(y)
    return classes, kind


def test_quantile_estimates_the_tau_quantile():
    X, y = abalone_standardized()
    for tau in (0.1, 0.5, 0.9):
        loss = get_loss("quantile", tau=tau)
        result = minimize(DistributedRisk(loss, X, y, len(y), SerialComm()), np.zeros(X.shape[1]),
                          1e-4, epsilon=0, rel_epsilon=1e-4)
        coverage = loss.metrics(X @ result.w, y)["coverage"]
        assert abs(coverage - tau) < 0.02, (tau, coverage)


# --------------------------------------------------------------------------
# (e) ranks agree with the serial computation; the command line
# --------------------------------------------------------------------------

def abalone_labels(loss, rings):
    """Labels of the loss's kind from abalone's rings: +-1 (rings > 9), reals, or the counts."""
    if loss.task == "classification":
        return np.where(rings > 9, 1.0, -1.0)
    if loss.check_labels(None, "real") is None:
        return (rings - 9.5) / 3.2
    return rings


@pytest.mark.distributed
@pytest.mark.parametrize("name", NAMES)
def test_risk_and_subgradient_equal_serial(comm, mpi_tmp_path, name):
    X, rings = load_svmlight("abalone.xz")
    loss = get_loss(name)
    y = abalone_labels(loss, rings)
    directory = shared_shards(comm, mpi_tmp_path, X, y, comm.size + 2)
    local = load_local(directory, comm)
    assert loss.check_labels(local.classes, local.label_kind) is None
    check_against_serial(lambda: get_loss(name), local, comm, X, y, atol_relative=True)


@pytest.fixture(scope="module")
def abalone_shards(tmp_path_factory):
    """abalone with standardized features and targets, in 4 shards."""
    X, y = abalone_standardized()
    directory = tmp_path_factory.mktemp("abalone") / "shards"
    write_shards(X[:, :-1], y, directory, 4)
    return directory


def test_quantile_from_the_command_line(tmp_path, abalone_shards):
    from prbmrm.model import load_model

    out = tmp_path / "q.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", str(abalone_shards), "--loss",
                                 "quantile", "--loss-param", "tau=0.9", "--lam", "1e-4", "--bias",
                                 "--rel-epsilon", "1e-4", "--quiet", "--out", str(out)])
    assert completed.returncode == 0, completed.stderr
    model = load_model(str(out))
    assert model.attrs["loss"] == "quantile" and '"tau": "0.9"' in model.attrs["loss_params"]
    X, y = abalone_standardized()
    coverage = np.mean(y <= model.decision_function(X[:, :-1]).ravel())
    assert abs(coverage - 0.9) < 0.02, coverage


def test_bad_loss_parameter_fails_with_one_line(tmp_path, abalone_shards):
    out = tmp_path / "q.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", str(abalone_shards), "--loss",
                                 "quantile", "--loss-param", "tau=2", "--out", str(out)])
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "prbmrm.cli.train: error: loss 'quantile': parameter tau must be in (0, 1), got 2"]
    assert completed.stdout == "" and not out.exists()
