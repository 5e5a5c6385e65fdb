"""Model files and their methods: predict_proba for the log-likelihood losses, labels, a short repr."""

import numpy as np
import pytest
from scipy.special import expit, log_expit

import prbmrm
from helpers import load_svmlight
from prbmrm import training
from prbmrm.errors import UsageError


def test_predict_proba_of_a_logistic_model_read_back(tmp_path):
    X, y = training.load_demo()
    raw = np.where(y > 0, 1, 0)
    prbmrm.fit((X, raw), loss="logistic", lam=1e-3, bias=True).save(str(tmp_path / "m.h5"))
    model = prbmrm.load(str(tmp_path / "m.h5"))
    P = model.predict_proba(X)
    assert P.shape == (len(y), 2) and np.allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    assert np.array_equal(model.classes_, [0.0, 1.0])
    np.testing.assert_allclose(P[:, 1], expit(X @ model.w + model.bias), rtol=1e-12)  # sigmoid of the score
    assert np.array_equal(model.classes_[np.argmax(P, axis=1)], model.predict(X))
    F = X @ model.w + model.bias  # log P computed without rounding P first
    np.testing.assert_allclose(model.predict_log_proba(X), np.column_stack([log_expit(-F), log_expit(F)]),
                               rtol=1e-12, atol=1e-15)


def test_predict_proba_of_a_softmax_model_read_back(tmp_path):
    X, y = load_svmlight("dna.scale.xz")
    prbmrm.fit((X, y), loss="softmax", lam=1e-3).save(str(tmp_path / "m.h5"))
    model = prbmrm.load(str(tmp_path / "m.h5"))
    P = model.predict_proba(X)
    assert P.shape == (len(y), 3) and np.allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    F = np.asarray(X @ model.w) + model.bias
    expected = np.exp(F - F.max(axis=1, keepdims=True))
    np.testing.assert_allclose(P, expected / expected.sum(axis=1, keepdims=True), rtol=1e-10)
    assert np.array_equal(model.classes_, [1.0, 2.0, 3.0])
    assert np.array_equal(model.classes_[np.argmax(P, axis=1)], model.predict(X))


def test_predict_proba_is_refused_for_a_loss_without_probabilities():
    with pytest.raises(UsageError, match="loss 'hinge' gives no probabilities"):
        prbmrm.fit(None, lam=1e-2).predict_proba(training.load_demo()[0])


def test_a_short_repr():
    model = prbmrm.fit(None, lam=1e-2)
    text = repr(model)
    assert text.startswith("Model(loss='hinge', reg='l2', solver=") and "lam=0.01" in text
    assert len(text) < 300 and str(model) == text
