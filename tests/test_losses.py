"""Every registered loss: subgradient inequality, finite differences, label checks."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from conftest import OBJECTIVES
from prbmrm.losses import get_loss
from prbmrm.errors import UsageError


def labels_for(loss, rng, m):
    if loss.task == "classification":
        return rng.choice([-1.0, 1.0], size=m)
    return rng.normal(size=m)


def risk(loss, w, X, y):
    total, grad = loss.loss_gradient(w, X, y)
    return total / len(y), grad / len(y)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(0.01, 10.0))
def test_subgradient_inequality(name, seed, scale):
    loss = get_loss(name)
    rng = np.random.default_rng(seed)
    X = sp.random(30, 6, density=0.5, random_state=rng, format="csr")
    y = labels_for(loss, rng, 30)
    w, v = scale * rng.normal(size=(2, 6))
    r_w, a = risk(loss, w, X, y)
    r_v, _ = risk(loss, v, X, y)
    assert r_v >= r_w + a @ (v - w) - 1e-9 * (1 + abs(r_v))


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_gradient_matches_central_differences(name):
    loss = get_loss(name)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5))
    y = labels_for(loss, rng, 40)
    w = rng.normal(size=5)
    if name == "hinge":
        # Differentiable only away from the kink y f = 1.
        assert np.min(np.abs(1 - y * (X @ w))) > 1e-3
    _, a = risk(loss, w, X, y)
    h = 1e-6
    numeric = np.array([(risk(loss, w + h * e, X, y)[0] - risk(loss, w - h * e, X, y)[0]) / (2 * h)
                        for e in np.eye(5)])
    np.testing.assert_allclose(a, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_risk_matches_independent_formula(name):
    loss = get_loss(name)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 4))
    y = labels_for(loss, rng, 50)
    w = rng.normal(size=4)
    # The independent objective with lam = 0 is the mean loss.
    assert risk(loss, w, X, y)[0] == pytest.approx(OBJECTIVES[name](X, y, w, 0.0), rel=1e-12)


def test_sparse_and_dense_agree():
    rng = np.random.default_rng(2)
    X = sp.random(100, 8, density=0.3, random_state=rng, format="csr")
    y = rng.choice([-1.0, 1.0], size=100)
    w = rng.normal(size=8)
    for name in OBJECTIVES:
        loss = get_loss(name)
        r_sparse, g_sparse = loss.loss_gradient(w, X, y)
        r_dense, g_dense = loss.loss_gradient(w, X.toarray(), y)
        assert r_sparse == pytest.approx(r_dense, rel=1e-12)
        np.testing.assert_allclose(g_sparse, g_dense, rtol=1e-12, atol=1e-14)


def test_logistic_is_stable_for_large_scores():
    loss = get_loss("logistic")
    X = np.array([[1000.0], [-1000.0]])
    y = np.array([-1.0, -1.0])
    total, grad = loss.loss_gradient(np.array([1.0]), X, y)
    assert np.isfinite(total) and np.isfinite(grad).all()
    assert total == pytest.approx(1000.0)


@pytest.mark.parametrize("name", ["hinge", "logistic"])
def test_binary_losses_reject_other_label_sets(name):
    loss = get_loss(name)
    assert loss.check_labels(np.array([-1.0, 1.0]), "binary") is None
    message = loss.check_labels(np.array([0.0, 1.0, 2.0]), "integer")
    assert "{-1, +1}" in message and "{0, 1, 2}" in message
    assert loss.check_labels(None, "real") is not None


def test_regression_loss_accepts_any_real_labels():
    loss = get_loss("least_squares")
    assert loss.check_labels(None, "real") is None
    assert loss.check_labels(np.array([1.0, 2.0, 3.0]), "integer") is None


def test_unknown_loss_names_the_known_ones():
    with pytest.raises(UsageError, match="unknown loss 'hing'.*hinge"):
        get_loss("hing")


def test_metrics():
    hinge, squares = get_loss("hinge"), get_loss("least_squares")
    measures = hinge.metrics(np.array([0.5, -2.0, 1.0, -0.1]), np.array([1.0, -1.0, -1.0, -1.0]))
    assert measures == {"accuracy": 0.75, "error_rate": 0.25}
    measures = squares.metrics(np.array([1.0, 2.0]), np.array([0.0, 2.0]))
    assert measures["rmse"] == pytest.approx(np.sqrt(0.5)) and measures["mae"] == pytest.approx(0.5)


def test_loss_parameters_are_checked():
    from prbmrm.losses import Loss

    class WithParameter(Loss):
        name = "with_parameter"
        params = {"tau": 0.5}

    assert WithParameter().tau == 0.5
    assert WithParameter(tau="0.25").tau == 0.25
    with pytest.raises(UsageError, match="no parameter 'rho'.*tau"):
        WithParameter(rho=1)
    with pytest.raises(UsageError, match="tau='abc'"):
        WithParameter(tau="abc")
    with pytest.raises(UsageError, match="no parameter 'tau'"):
        get_loss("hinge", tau=0.5)
