"""The scikit-learn estimators: scikit-learn's own checks, model selection, and agreement with prbmrm.training.fit."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MultiLabelBinarizer, StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from helpers import data_path, hinge_objective, load_svmlight
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import read_input
from prbmrm.estimators import (BMRMClassifier, BMRMMultilabelClassifier, BMRMRanker, BMRMRegressor,
                               expected_failed_checks, query_pairs)
from prbmrm.training import run

pytestmark = pytest.mark.slow  # scikit-learn's estimator checks, about 50 s each for some estimators

# lam = 1e-2: the checks' data are tiny and unscaled (targets up to ~500), and BMRM needs of
# the order of 1 / (lam * gap) iterations; at the default 1e-4 every check passes too, but the
# regressor's and the softmax classifier's checks take about 50 s each (the multi-target
# regression check alone 10,000 iterations).
CHECKED = [BMRMClassifier(lam=1e-2), BMRMClassifier(lam=1e-2, loss="logistic"),
           BMRMClassifier(lam=1e-2, loss="softmax"), BMRMRegressor(lam=1e-2),
           BMRMRanker(lam=1e-2), BMRMRanker(lam=1e-2, loss="preference"),
           BMRMMultilabelClassifier(lam=1e-2)]


@parametrize_with_checks(CHECKED, expected_failed_checks=expected_failed_checks, xfail_strict=True)
def test_scikit_learn_checks(estimator, check):
    check(estimator)


def a9a(n=3000):
    X, y = load_svmlight("a9a.xz")
    return X[:n], y[:n]


def with_bias(X):
    return sp.hstack([X, np.ones((X.shape[0], 1))]).tocsr() if sp.issparse(X) else np.c_[X, np.ones(len(X))]


def test_hinge_classifier_is_train_fit_with_any_labels():
    X, y = a9a(2000)
    names = np.where(y > 0, "rich", "poor")  # sorted: "poor" is -1, "rich" +1
    model = BMRMClassifier(loss="hinge", lam=1e-2).fit(X, names)
    result, _, _ = run((X, y), loss="hinge", lam=1e-2, bias=True, comm=SerialComm())
    np.testing.assert_array_equal(model.classes_, ["poor", "rich"])
    np.testing.assert_array_equal(model.coef_, result.w[None, :-1])
    np.testing.assert_array_equal(model.intercept_, result.w[-1:])
    assert model.n_iter_ == result.nit and model.history_["gap"][-1] == pytest.approx(result.gap)
    assert model.objective_ == pytest.approx(hinge_objective(with_bias(X), y, result.w, 1e-2), rel=1e-12)
    np.testing.assert_array_equal(model.predict(X), np.where(X @ result.w[:-1] + result.w[-1] > 0,
                                                             "rich", "poor"))


def test_multiclass_losses_see_class_values_and_two_classes_reduce_to_one_score():
    X, y = load_svmlight("dna.scale.xz")  # classes 1, 2, 3
    X, y = X[:200], y[:200]
    model = BMRMClassifier(lam=1e-1).fit(X, y)
    assert model.loss_ == "multiclass_hinge" and model.coef_.shape == (3, X.shape[1])
    result, _, _ = run((X, y), loss="multiclass_hinge", lam=1e-1, bias=True, comm=SerialComm())
    np.testing.assert_array_equal(model.coef_, result.w.reshape(-1, 3)[:-1].T)
    letters = np.array(["a", "b", "c"])[y.astype(int) - 1]
    np.testing.assert_array_equal(BMRMClassifier(lam=1e-1).fit(X, letters).coef_, model.coef_)
    binary = y[y < 3], X[y < 3]
    two = BMRMClassifier(lam=1e-2, loss="softmax").fit(binary[1], binary[0])
    result, _, _ = run((binary[1], binary[0]), loss="softmax", lam=1e-2, bias=True, comm=SerialComm())
    W = result.w.reshape(-1, 2)
    np.testing.assert_allclose(two.coef_, (W[:-1, 1] - W[:-1, 0])[None], rtol=1e-12, atol=1e-15)
    F = binary[1] @ W[:-1] + W[-1]
    softmax = np.exp(F - F.max(axis=1, keepdims=True))
    np.testing.assert_allclose(two.predict_proba(binary[1]), softmax / softmax.sum(axis=1, keepdims=True),
                               rtol=1e-12)


def test_softmax_probabilities_are_the_softmax_of_the_scores():
    X, y = load_svmlight("dna.scale.xz")
    model = BMRMClassifier(lam=1e-2, loss="softmax").fit(X[:300], y[:300])
    F = model.decision_function(X[300:400])
    P = np.exp(F) / np.exp(F).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(model.predict_proba(X[300:400]), P, rtol=1e-12)
    np.testing.assert_array_equal(model.predict(X[300:400]), model.classes_[np.argmax(P, axis=1)])
    assert not hasattr(BMRMClassifier(), "predict_proba")


def test_run_summary_and_convergence_warning():
    X, y = a9a(500)
    with pytest.warns(ConvergenceWarning, match="maximum number of iterations"):
        model = BMRMClassifier(max_iter=3).fit(X, y)
    assert model.n_iter_ == 3 and len(model.history_["gap"]) == 3
    assert model.gap_ == model.history_["gap"][-1] > 0 and model.objective_ == model.history_["best_objective"][-1]
    plain = BMRMClassifier(bias=False, lam=1e-1).fit(X, y)
    np.testing.assert_array_equal(plain.intercept_, [0.0])


def test_grid_search_over_lam_on_a9a():
    X, y = a9a()
    search = GridSearchCV(BMRMClassifier(), {"lam": [1e-3, 1e-2, 1e-1]}, cv=3).fit(X, y)
    assert search.best_score_ > 0.82  # a linear SVM's accuracy on Adult is about 0.85
    scores = search.cv_results_["mean_test_score"]
    assert search.best_score_ == scores.max()
    assert search.best_estimator_.lam == search.best_params_["lam"]
    X_test, y_test = load_svmlight("a9a.t.xz", n_features=X.shape[1])
    assert search.score(X_test[:2000], y_test[:2000]) > 0.82


def test_pipeline_with_standard_scaler():
    X, y = a9a(2000)
    pipeline = make_pipeline(StandardScaler(with_mean=False), BMRMClassifier(lam=1e-2)).fit(X, y)
    scaled = StandardScaler(with_mean=False).fit_transform(X)
    direct = BMRMClassifier(lam=1e-2).fit(scaled, y)
    np.testing.assert_array_equal(pipeline[-1].coef_, direct.coef_)
    assert pipeline.score(X, y) == direct.score(scaled, y) > 0.8


def ridge(X, Y, lam):
    """Minimizer of lam/2 |W|^2 + 1/(2m) |[X 1] W - Y|^2 (the bias regularized), by the normal equations."""
    A = with_bias(np.asarray(X))
    return np.linalg.solve(A.T @ A / len(A) + lam * np.eye(A.shape[1]), A.T @ Y / len(A))


def test_regressor_least_squares_is_ridge_with_a_regularized_intercept():
    X, y = load_svmlight("housing.xz")
    X = StandardScaler().fit_transform(X.toarray())
    model = BMRMRegressor(lam=1e-2, rel_epsilon=1e-7).fit(X, y)
    expected = ridge(X, y, 1e-2)
    np.testing.assert_allclose(model.coef_, expected[:-1], rtol=1e-3, atol=1e-3 * np.abs(expected).max())
    assert model.intercept_ == pytest.approx(expected[-1], rel=1e-3)
    # Two 0/1 targets: multivariate regression, not a multilabel indicator.
    Y = np.column_stack([y > 20, y > 30]).astype(float)
    two = BMRMRegressor(lam=1e-2, rel_epsilon=1e-7).fit(X, Y)
    assert two.loss_ == "multivariate_regression" and two.predict(X).shape == Y.shape
    expected = ridge(X, Y, 1e-2)
    np.testing.assert_allclose(two.coef_, expected[:-1].T, atol=1e-3 * np.abs(expected).max())
    with pytest.raises(ValueError, match="y should be a 1d array"):
        BMRMRegressor(loss="huber").fit(X, Y)


def test_poisson_regressor_predicts_the_mean():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = rng.poisson(np.exp(0.3 * X[:, 0] + 0.5))
    model = BMRMRegressor(loss="poisson", lam=1e-1).fit(X, y)
    np.testing.assert_allclose(model.predict(X), np.exp(X @ model.coef_ + model.intercept_), rtol=1e-12)
    assert model.coef_[0] > 0.2 and np.all(np.abs(model.coef_[1:]) < 0.1)


def mq2008(queries=20):
    X, y, qid = read_input(data_path("mq2008_subset_vali.txt.xz"))
    rows = qid <= np.unique(qid)[queries - 1]
    return X[rows], y[rows], qid[rows]


def test_ranker_ndcg_is_train_fit_and_scores_ndcg():
    from sklearn.metrics import ndcg_score

    X, y, qid = mq2008()
    model = BMRMRanker(lam=1e-1, loss_params={"k": 5}).fit(X, y, qid=qid)
    result, _, _ = run((X, y, {"qid": qid}), loss="ndcg", loss_params={"k": 5}, lam=1e-1, bias=True,
                       comm=SerialComm())
    np.testing.assert_array_equal(model.coef_, result.w[:-1])
    f = model.predict(X)
    per_query = [ndcg_score([2.0 ** y[qid == q] - 1], [f[qid == q]], k=5) for q in np.unique(qid)
                 if np.any(y[qid == q] > 0)]
    assert model.score(X, y, qid=qid) == pytest.approx(np.mean(per_query), rel=1e-12)
    shuffled = np.random.default_rng(0).permutation(len(y))
    with pytest.raises(ValueError, match="the rows of a query must be contiguous"):
        model.fit(X[shuffled], y[shuffled], qid=qid[shuffled])


def test_preference_pairs_and_ranker():
    y = np.array([0.0, 2, 1, 0, 1, 1])
    qid = np.array([7, 7, 7, 3, 3, 3])
    lower, upper = query_pairs(y, qid)
    brute = {(i, j) for i, j in itertools.permutations(range(6), 2) if qid[i] == qid[j] and y[i] < y[j]}
    assert set(zip(lower.tolist(), upper.tolist())) == brute and len(lower) == len(brute)
    # Over one query the preference risk is the ordinal risk (constant cost): same objective.
    X, y, _ = mq2008(8)
    preference = BMRMRanker(loss="preference", lam=1e-2, rel_epsilon=1e-6).fit(X, y)
    ordinal = BMRMRanker(loss="ordinal", lam=1e-2, rel_epsilon=1e-6).fit(X, y)
    assert preference.objective_ == pytest.approx(ordinal.objective_, rel=1e-5)
    with pytest.raises(ValueError, match="takes no qid"):
        BMRMRanker(loss="ordinal").fit(X, y, qid=np.zeros(len(y)))


def yeast(n=300):
    X, sets, _ = read_input(data_path("yeast_train.xz"), multilabel=True)
    return X[:n], MultiLabelBinarizer().fit_transform(sets[:n])


def test_multilabel_classifier_is_train_fit_and_scores_label_ranking():
    X, Y = yeast()
    model = BMRMMultilabelClassifier(lam=1e-1).fit(X, Y)
    k = Y.shape[1]
    result, _, _ = run((X, Y), loss="multilabel_hinge", lam=1e-1, bias=True, comm=SerialComm())
    np.testing.assert_array_equal(model.coef_, result.w.reshape(-1, k)[:-1].T)
    F = model.decision_function(X)
    np.testing.assert_array_equal(model.predict(X), F > 0)
    wrong = []
    for f, z in zip(F, Y.astype(bool)):
        pairs = [(r, s) for r in np.flatnonzero(z) for s in np.flatnonzero(~z)]
        if pairs:
            wrong.append(np.mean([(f[s] > f[r]) + 0.5 * (f[s] == f[r]) for r, s in pairs]))
    assert model.score(X, Y) == pytest.approx(1 - np.mean(wrong), rel=1e-12)
    with pytest.raises(ValueError, match="0/1 label indicator"):
        model.fit(X, Y[:, 0])


@pytest.mark.parametrize("estimator, message", [
    (BMRMClassifier(loss="hinge"), "Only binary classification"),
    (BMRMClassifier(loss="least_squares"), "unsuitable loss 'least_squares'"),
    (BMRMClassifier(lam=-1.0), "^lam must be a positive number"),  # the keyword, not the flag
    (BMRMClassifier(loss="softmax", loss_params={"nope": 1}), "has no parameter 'nope'"),
])
def test_errors_are_value_errors(estimator, message):
    X, y = load_svmlight("dna.scale.xz")
    with pytest.raises(ValueError, match=message):
        estimator.fit(X[:100], y[:100])


@pytest.mark.distributed
def test_every_rank_gets_the_coefficients_of_a_serial_run(comm):
    X, y = a9a(2000)
    model = BMRMClassifier(lam=1e-2).fit(X, y)
    serial, _, _ = run((X, y), loss="hinge", lam=1e-2, bias=True, comm=SerialComm())
    np.testing.assert_array_equal(model.coef_, serial.w[None, :-1])
    np.testing.assert_array_equal(model.intercept_, serial.w[-1:])
    assert model.n_iter_ == serial.nit
    np.testing.assert_array_equal(model.predict(X), np.where(X @ serial.w[:-1] + serial.w[-1] > 0, 1.0, -1.0))
    X, y, qid = mq2008(12)
    ranker = BMRMRanker(lam=1e-1).fit(X, y, qid=qid)
    serial, _, _ = run((X, y, {"qid": qid}), loss="ndcg", lam=1e-1, bias=True, comm=SerialComm())
    np.testing.assert_array_equal(ranker.coef_, serial.w[:-1])


def test_warm_start_reuses_the_planes_of_the_same_training_data_only():
    # warm_start=True starts from the last fit on the same data and settings, whatever its lam
    # and estimator object; its optimum agrees with a cold fit and with LIBLINEAR's, at
    # C = 1 / (lam m) (both regularize the intercept: bias=True, intercept_scaling=1).
    from sklearn.svm import LinearSVC

    X, y = a9a(2000)
    lam, m = 1e-3, X.shape[0]
    BMRMClassifier(lam=1e-2, solver="bmrm", warm_start=True, rel_epsilon=0, epsilon=1e-6).fit(X, y)
    warm = BMRMClassifier(lam=lam, solver="bmrm", warm_start=True, rel_epsilon=0, epsilon=1e-6).fit(X, y)
    cold = BMRMClassifier(lam=lam, solver="bmrm", rel_epsilon=0, epsilon=1e-6).fit(X, y)
    assert warm.n_iter_ < cold.n_iter_
    assert abs(warm.objective_ - cold.objective_) <= 1e-6
    svc = LinearSVC(loss="hinge", C=1.0 / (lam * m), tol=1e-8, max_iter=200000).fit(X, y)
    Xb, yb = with_bias(X), np.where(y > 0, 1.0, -1.0)
    liblinear = hinge_objective(Xb, yb, np.r_[svc.coef_.ravel(), svc.intercept_], lam)
    assert hinge_objective(Xb, yb, np.r_[warm.coef_.ravel(), warm.intercept_], lam) == pytest.approx(
        warm.objective_, rel=1e-12)
    assert warm.objective_ - warm.gap_ <= liblinear + 1e-9 and warm.objective_ <= liblinear + 1e-6
    # Other data: nothing to reuse, the fit is the cold one.
    half = BMRMClassifier(lam=lam, solver="bmrm", warm_start=True).fit(X[:1000], y[:1000])
    np.testing.assert_array_equal(half.coef_, BMRMClassifier(lam=lam, solver="bmrm").fit(X[:1000], y[:1000]).coef_)


def test_warm_start_of_the_hinge_loss_carries_the_dual_point():
    # For the hinge loss with l2, warm_start runs auto, whose pick on hashed-text-like data is dual coordinate
    # descent: a fit after another lam's on the same data starts from that fit's dual point (its first
    # certificate's bound beyond a cold start's) and certifies the optimum of a cold fit and LIBLINEAR's; on
    # other data it is the cold fit, bitwise.
    from sklearn.svm import LinearSVC

    rng = np.random.default_rng(5)
    X = sp.random(900, 2**16, density=1e-3, format="csr", random_state=rng, data_rvs=rng.random)
    y = np.where(X @ rng.standard_normal(2**16) + 0.05 * rng.standard_normal(900) > 0, 1, 0)
    lam, m = 1e-3, X.shape[0]
    first = BMRMClassifier(lam=1e-2, warm_start=True, rel_epsilon=1e-5).fit(X, y)
    assert " passes (dcd: " in first.message_  # dcd alone: no hand-over to BMRM, whose result keeps no dual point
    warm = BMRMClassifier(lam=lam, warm_start=True, rel_epsilon=1e-5).fit(X, y)
    cold = BMRMClassifier(lam=lam, rel_epsilon=1e-5).fit(X, y)
    assert "(dcd: " in warm.message_ and "(dcd: " in cold.message_
    assert warm.history_["lower_bound"][0] > cold.history_["lower_bound"][0]
    assert warm.objective_ - warm.gap_ <= cold.objective_ and cold.objective_ - cold.gap_ <= warm.objective_
    svc = LinearSVC(loss="hinge", C=1.0 / (lam * m), tol=1e-8, max_iter=200000).fit(X, y)
    Xb, yb = with_bias(X), np.where(y > 0, 1.0, -1.0)
    liblinear = hinge_objective(Xb, yb, np.r_[svc.coef_.ravel(), svc.intercept_], lam)
    assert hinge_objective(Xb, yb, np.r_[warm.coef_.ravel(), warm.intercept_], lam) == pytest.approx(
        warm.objective_, rel=1e-12)
    assert warm.objective_ - warm.gap_ <= liblinear + 1e-9 and liblinear <= warm.objective_ + 1e-9
    half = BMRMClassifier(lam=lam, warm_start=True).fit(X[:450], y[:450])
    np.testing.assert_array_equal(half.coef_, BMRMClassifier(lam=lam).fit(X[:450], y[:450]).coef_)


def test_warm_starts_carry_across_a_grid_of_lambdas_in_grid_search():
    # GridSearchCV clones the estimator for every (lam, fold): with warm_start each clone starts from the
    # planes of the last fit on its fold, whatever its lam. Scored by iterations (a count, not a time).
    X, y = a9a(3000)
    lams = [1e-2, 1e-3, 1e-4]

    def iterations(estimator, X, y):
        return estimator.n_iter_

    totals, best = {}, {}
    for warm_start in (False, True):
        search = GridSearchCV(BMRMClassifier(solver="bmrm", warm_start=warm_start, rel_epsilon=1e-4),
                              {"lam": lams}, cv=3, scoring={"iterations": iterations, "accuracy": "accuracy"},
                              refit="accuracy").fit(X, y)
        totals[warm_start] = search.cv_results_["mean_test_iterations"]
        best[warm_start] = search.best_params_["lam"]
    assert totals[True][0] == totals[False][0]  # the first lam starts cold either way
    assert np.all(totals[True][1:] < totals[False][1:])
    assert best[True] == best[False]


def test_the_warm_start_key_is_the_same_for_the_same_data_and_differs_between_folds():
    from prbmrm.estimators import _fit_key

    X, y = a9a(3000)
    key = _fit_key(X, y, {}, ("hinge",))
    assert _fit_key(X.copy(), y.copy(), {}, ("hinge",)) == key  # the clones of one fold
    assert _fit_key(X.toarray(), y, {}, ("hinge",)) != key  # another layout
    folds = [_fit_key(X[rows], y[rows], {}, ("hinge",)) for rows in (np.arange(2000), np.arange(1000, 3000))]
    assert len({key, *folds}) == 3
    assert _fit_key(X, y, {}, ("logistic",)) != key


def test_verbose_prints_the_run_and_its_progress(capsys):
    X, y = a9a(500)
    BMRMClassifier(lam=1e-2, verbose=True).fit(X, np.where(y > 0, "spam", "ham"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("training on 500 examples x 123 features + bias, 1 rank(s): loss hinge")
    assert lines[1].split()[:2] == ["iter", "objective"]
    BMRMClassifier(lam=1e-2).fit(X, y)
    assert capsys.readouterr().out == ""


def test_features_no_example_has_get_weight_zero_and_the_run_the_same_optimum():
    # Hashed text leaves most columns empty: the estimator trains on the others (exact for a separable
    # regularizer), against the run on every column.
    X, y = a9a(2000)
    wide = sp.csr_matrix((X.data, X.indices * 10 + 3, X.indptr), shape=(X.shape[0], 10 * X.shape[1]))
    options = dict(lam=1e-3, solver="bmrm", rel_epsilon=0, epsilon=1e-8)
    model = BMRMClassifier(**options).fit(wide, y)
    result, _, _ = run((wide, y), loss="hinge", bias=True, comm=SerialComm(), **options)
    empty = np.ones(wide.shape[1], dtype=bool)
    empty[wide.indices] = False
    assert model.coef_.shape == (1, wide.shape[1]) and not model.coef_[0, empty].any()
    w = np.r_[model.coef_.ravel(), model.intercept_]
    assert hinge_objective(with_bias(wide), y, w, 1e-3) == pytest.approx(model.objective_, rel=1e-12)
    assert abs(model.objective_ - result.fun) <= 1e-8
    assert model.objective_ - model.gap_ <= result.fun and result.lower_bound <= model.objective_


def test_the_default_solver_is_picked_on_the_columns_trained_on():
    # Hashed-text-like data (a few percent of 2^18 columns used, few nonzeros per used column): the
    # estimator trains on the used columns with the default solver, auto, whose pick measures them,
    # bitwise as fit does on the same compacted data (dual coordinate descent for the hinge loss on these
    # few nonzeros; BMRM where they are more than auto.DCD_NONZEROS).
    from prbmrm.estimators import _used_columns

    rng = np.random.default_rng(3)
    X = sp.random(600, 2**18, density=2e-4, format="csr", random_state=rng, data_rvs=rng.random)
    y = np.where(X @ rng.standard_normal(2**18) > 0, 1.0, -1.0)
    model = BMRMClassifier(lam=1e-3).fit(X, y)
    compact, used = _used_columns(X, "l2")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # as the estimators run
        result, _, _ = run((compact, y), loss="hinge", lam=1e-3, bias=True, comm=SerialComm())
    assert "(dcd: " in result.message
    np.testing.assert_array_equal(model.coef_[0, used], result.w[:-1])
    assert model.n_iter_ == result.nit


def test_a_warm_start_of_other_data_under_the_same_key_is_not_used(monkeypatch):
    # The key is cheap and may collide: planes of other data are no lower bounds of this data's risk, so an
    # entry is used only for data equal to the copy kept with it. Every key the same here, as a collision.
    from prbmrm import estimators

    monkeypatch.setattr(estimators, "_fit_key", lambda *args: "collision")
    monkeypatch.setattr(estimators, "_WARM_STARTS", type(estimators._WARM_STARTS)())
    X, y = a9a(1500)
    options = dict(lam=1e-3, solver="bmrm", warm_start=True, rel_epsilon=0, epsilon=1e-6)
    other = X.copy()
    other.data = other.data * 3.0  # the same shapes and nonzeros, another risk
    BMRMClassifier(**options).fit(other, y)
    model = BMRMClassifier(**options).fit(X, y)
    cold = BMRMClassifier(lam=1e-3, solver="bmrm", rel_epsilon=0, epsilon=1e-6).fit(X, y)
    np.testing.assert_array_equal(model.coef_, cold.coef_)
    assert model.n_iter_ == cold.n_iter_
    # The caller's arrays changed in place after a fit: the kept copy tells, the fit starts cold.
    X.data[7] = 2.0
    cold = BMRMClassifier(lam=1e-3, solver="bmrm", rel_epsilon=0, epsilon=1e-6).fit(X, y)
    np.testing.assert_array_equal(BMRMClassifier(**options).fit(X, y).coef_, cold.coef_)
    # The same data again (a clone of the fold): the entry is used, fewer iterations, the same optimum.
    again = BMRMClassifier(**dict(options, lam=3e-3)).fit(X.copy(), y.copy())
    cold = BMRMClassifier(lam=3e-3, solver="bmrm", rel_epsilon=0, epsilon=1e-6).fit(X, y)
    assert again.n_iter_ < cold.n_iter_
    assert hinge_objective(with_bias(X), y, np.r_[again.coef_.ravel(), again.intercept_], 3e-3) == pytest.approx(
        again.objective_, rel=1e-12)
    assert again.objective_ - again.gap_ <= cold.objective_ and cold.objective_ - cold.gap_ <= again.objective_
