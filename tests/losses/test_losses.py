"""Loss machinery: sparse and dense agree, stability, label and parameter checks, measures.

Each loss family has its own module (test_scalar_losses.py, ...) with the subgradient
inequality, finite differences and independent formulas.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from helpers import OBJECTIVES
from prbmrm.losses import get_loss
from prbmrm.errors import UsageError


def labels_for(loss, rng, m):
    if loss.task == "classification":
        return rng.choice([-1.0, 1.0], size=m)
    return rng.normal(size=m)


def risk(loss, w, X, y):
    total, grad = loss.loss_gradient(w, X, y)
    return total / len(y), grad / len(y)


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
