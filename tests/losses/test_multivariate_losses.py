"""Every multivariate loss of the catalogue (prbmrm.losses.multivariate.MULTIVARIATE_LOSSES).

The definitions checked here, written out from the papers (f = X w, m examples):

- roc_area (paper 000, eq. 27): R = 1/(m+ m-) sum_{y_i = -1, y_j = +1} max(0, 1 + f_i - f_j).
- ordinal (paper 000, A.3.2): R = 1/M sum_{y_i < y_j} C(y_i, y_j) max(0, 1 + f_i - f_j),
  M = (m^2 - sum_k m_k^2)/2, C = 1 or y_j - y_i.
- preference (paper 000, A.3.3): R = 1/|P| sum_{(i, j) in P} C_ij max(0, 1 + f_i - f_j).
- fbeta: R = max over all 2^m labelings y' of [Delta(y', y) + (1/m) sum_i (y'_i - y_i) f_i],
  Delta = 1 - F_beta(y', y) -- paper 000's Alg. 11 loss with the score term divided by m,
  the normalization of paper 004, eq. (2).
- prbep (paper 004, eq. 2): the same maximum with Delta = b/m+ if b = c and -inf otherwise
  (b false negatives, c false positives).
- ndcg (paper 000, eq. 28 with Le and Smola's NDCG@k loss): per query,
  l = max over all rankings pi of [1 - NDCG@k(pi) + sum_p c_p f_pi(p)] - c_bar . f with
  c_p = max(k + 1 - p, 0) and c_bar the mean of sum_p c_p f_pi(p) over the rankings sorted
  by relevance; R = (1/m) sum_queries l.

(a) risk and subgradient against those definitions by brute force (all pairs, all 2^m
labelings, all n! rankings), (b) the subgradient inequality (hypothesis) through the real
oracle, (c) 1, 2 and 3 ranks give the serial risk and subgradient (marker ``distributed``),
(d) BMRM reaches the optimum of an independent convex program solved by cvxpy (Clarabel) for
every loss: pairs for roc_area / ordinal / preference, sum_largest epigraphs for the
contingency tables of fbeta / prbep, and the LP dual of the assignment polytope (exact:
Birkhoff) for ndcg, (e) the command line end to end.
"""

import functools
import itertools
import math
import re

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st
from scipy.stats import kendalltau
from sklearn.metrics import average_precision_score, fbeta_score, roc_auc_score

from helpers import data_path, load_svmlight, run_ranks
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local, read_input, write_shards
from prbmrm.errors import InputError, UsageError
from prbmrm.losses import LOSSES, get_loss
from prbmrm.losses.multivariate import MULTIVARIATE_LOSSES
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.solvers import minimize

NAMES = [cls.name for cls in MULTIVARIATE_LOSSES]


def oracle(loss, X, y, qid=None):
    """The distributed risk oracle on one process."""
    return DistributedRisk(loss, X, y, len(y), SerialComm(), qid=qid)


def write_pairs(path, pairs, costs=None):
    with open(path, "w") as stream:
        stream.write("# i j cost: j should rank above i\n")
        for t, (i, j) in enumerate(pairs):
            stream.write(f"{i} {j}" + ("" if costs is None else f" {float(costs[t])!r}") + "\n")
    return str(path)


def test_registry():
    assert NAMES == ["roc_area", "ordinal", "preference", "fbeta", "prbep", "ndcg"]
    for cls in MULTIVARIATE_LOSSES:
        assert LOSSES[cls.name] is cls
        assert cls.decomposable == (cls.name == "ndcg")
    assert {n: dict(LOSSES[n].params) for n in NAMES if LOSSES[n].params} == {
        "ordinal": {"cost": "constant"}, "preference": {"pairs": ""}, "fbeta": {"beta": 1.0},
        "ndcg": {"k": 10}}


# --------------------------------------------------------------------------
# (a) brute force on tiny data
# --------------------------------------------------------------------------

def pair_risk(X, w, pairs, costs, normalizer):
    """R and its subgradient from the pair sum, pair by pair."""
    f = X @ w
    risk, grad = 0.0, np.zeros(X.shape[1])
    for (i, j), cost in zip(pairs, costs):
        if 1 + f[i] - f[j] > 0:
            risk += cost * (1 + f[i] - f[j])
            grad += cost * (X[i] - X[j])
    return risk / normalizer, grad / normalizer


@pytest.mark.parametrize("seed", range(30))
def test_roc_area_equals_all_pairs(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 11))
    X, w = rng.normal(size=(m, 3)), rng.normal(size=3)
    y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
    pairs = [(i, j) for i in range(m) for j in range(m) if y[i] == -1 and y[j] == 1]
    expected = pair_risk(X, w, pairs, np.ones(len(pairs)), np.sum(y > 0) * np.sum(y < 0))
    r, a = oracle(get_loss("roc_area"), X, y)(w)
    assert r == pytest.approx(expected[0], rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(a, expected[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cost", ["constant", "linear"])
@pytest.mark.parametrize("seed", range(30))
def test_ordinal_equals_all_pairs(seed, cost):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 11))
    X, w = rng.normal(size=(m, 3)), rng.normal(size=3)
    y = rng.permutation(np.r_[1.0, 7.0, rng.integers(1, 8, size=m - 2)])
    pairs = [(i, j) for i in range(m) for j in range(m) if y[i] < y[j]]
    counts = np.unique(y, return_counts=True)[1]
    assert len(pairs) == (m * m - np.sum(counts ** 2)) / 2  # the paper's M
    costs = [1.0 if cost == "constant" else y[j] - y[i] for i, j in pairs]
    expected = pair_risk(X, w, pairs, costs, len(pairs))
    r, a = oracle(get_loss("ordinal", cost=cost), X, y)(w)
    assert r == pytest.approx(expected[0], rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(a, expected[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", range(20))
def test_preference_equals_all_pairs(seed, tmp_path):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 11))
    X, w = rng.normal(size=(m, 3)), rng.normal(size=3)
    pairs = [tuple(rng.choice(m, 2, replace=False)) for _ in range(int(rng.integers(1, 15)))]
    costs = rng.uniform(0.1, 3.0, size=len(pairs)) if seed % 2 else None
    path = write_pairs(tmp_path / "pairs.txt", pairs, costs)
    expected = pair_risk(X, w, pairs, np.ones(len(pairs)) if costs is None else costs, len(pairs))
    r, a = oracle(get_loss("preference", pairs=path), X, rng.normal(size=m))(w)
    assert r == pytest.approx(expected[0], rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(a, expected[1], rtol=1e-12, atol=1e-14)


def all_labelings(m):
    return np.array(list(itertools.product([-1.0, 1.0], repeat=m)))


def table(Z, y):
    """True positives, false positives, false negatives of each labeling (row of Z)."""
    return (np.sum((Z > 0) & (y > 0), axis=-1), np.sum((Z > 0) & (y < 0), axis=-1),
            np.sum((Z < 0) & (y > 0), axis=-1))


def fbeta_delta(beta):
    def delta(Z, y):
        """1 - F_beta, F_beta = (1 + beta^2) TP / ((1 + beta^2) TP + beta^2 FN + FP), 0 if TP = 0."""
        tp, fp, fn = table(Z, y)
        return 1.0 - (1 + beta**2) * tp / ((1 + beta**2) * tp + beta**2 * fn + fp)
    return delta


def prbep_delta(Z, y):
    _, false_pos, false_neg = table(Z, y)
    return np.where(false_neg == false_pos, false_neg / np.sum(y > 0), -np.inf)


@pytest.mark.parametrize("name, params, delta", [
    ("fbeta", {}, fbeta_delta(1.0)), ("fbeta", {"beta": 0.5}, fbeta_delta(0.5)),
    ("fbeta", {"beta": 3.0}, fbeta_delta(3.0)), ("prbep", {}, prbep_delta)],
    ids=["fbeta", "fbeta-0.5", "fbeta-3", "prbep"])
@pytest.mark.parametrize("seed", range(12))
def test_contingency_losses_equal_all_labelings(name, params, delta, seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 11))
    X, w = rng.normal(size=(m, 3)), rng.normal(size=3)
    y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
    f = X @ w
    Z = all_labelings(m)
    values = delta(Z, y) + (Z - y) @ f / m
    best = values.max()
    loss = get_loss(name, **params)
    r, a = oracle(loss, X, y)(w)
    assert r == pytest.approx(best, rel=1e-12, abs=1e-14)
    # The coefficients are y' - y of a maximizing labeling y', and a = X^T (y' - y) / m.
    _, c = loss.coefficients(f, y)
    z = y + c
    assert set(z) <= {-1.0, 1.0}
    assert delta(z, y) + (z - y) @ f / m == pytest.approx(best, rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(a, X.T @ c / m, rtol=1e-12, atol=1e-15)
    if np.sum(values > best - 1e-9) == 1:
        np.testing.assert_array_equal(z, Z[np.argmax(values)])


def ndcg_of(ranking, r, k):
    """NDCG@k of the ranking (documents, best first) with gains 2^r - 1."""
    gain = 2.0 ** np.asarray(r, dtype=float) - 1
    dcg = sum(gain[d] / math.log2(p + 2) for p, d in enumerate(ranking[:k]))
    ideal = sum(g / math.log2(p + 2) for p, g in enumerate(sorted(gain, reverse=True)[:k]))
    return dcg / ideal


def brute_query(f, r, k):
    """(l, dl/df) of one query by enumerating every ranking."""
    n = len(f)
    if max(r) == 0:
        return 0.0, np.zeros(n)
    c = [max(k + 1 - p, 0) for p in range(n)]
    rankings = list(itertools.permutations(range(n)))
    ideal = [pi for pi in rankings if all(r[pi[p]] >= r[pi[p + 1]] for p in range(n - 1))]
    c_bar = np.zeros(n)
    for pi in ideal:
        for p, d in enumerate(pi):
            c_bar[d] += c[p] / len(ideal)
    values = [1 - ndcg_of(pi, r, k) + sum(c[p] * f[d] for p, d in enumerate(pi)) - c_bar @ f
              for pi in rankings]
    best = rankings[int(np.argmax(values))]
    grad = -c_bar
    for p, d in enumerate(best):
        grad[d] += c[p]
    return max(values), grad


@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("seed", range(8))
def test_ndcg_equals_all_rankings(seed, k):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, size=4)
    qid = np.repeat(np.arange(4) * 7 + 3, sizes)
    m = qid.size
    X, w = rng.normal(size=(m, 3)), rng.normal(size=3)
    y = rng.integers(0, 3, size=m).astype(float)
    y[qid == qid[-1]] = 0.0  # one query without a relevant document
    f = X @ w
    total, coefficient = 0.0, np.zeros(m)
    for q in np.unique(qid):
        rows = np.flatnonzero(qid == q)
        value, grad = brute_query(f[rows], y[rows], k)
        total += value
        coefficient[rows] = grad
    r, a = oracle(get_loss("ndcg", k=k), X, y, qid)(w)
    assert r == pytest.approx(total / m, rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(a, X.T @ coefficient / m, rtol=1e-10, atol=1e-13)


# --------------------------------------------------------------------------
# (b) subgradient inequality through the oracle
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pairs")


PARAMETERS = {"cost": st.sampled_from(["constant", "linear"]), "beta": st.floats(0.2, 5.0),
              "k": st.integers(1, 12)}


def random_problem(name, params, rng, m, pairs_dir):
    """(loss, labels, query ids) of a random problem the loss accepts."""
    qid = None
    if name in ("roc_area", "fbeta", "prbep"):
        y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
    elif name == "ordinal":
        y = rng.permutation(np.r_[0.0, 4.0, rng.integers(0, 5, size=m - 2)])
    elif name == "ndcg":
        y = rng.integers(0, 3, size=m).astype(float)
        qid = np.sort(rng.integers(0, max(1, m // 5), size=m))
    else:
        y = rng.normal(size=m)
        pairs = [tuple(rng.choice(m, 2, replace=False)) for _ in range(3 * m)]
        params["pairs"] = write_pairs(pairs_dir / f"pairs-{rng.integers(1 << 30)}.txt", pairs,
                                      rng.uniform(0.0, 2.0, size=len(pairs)))
    return get_loss(name, **params), y, qid


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), scale=st.floats(0.01, 3.0),
       sparse=st.booleans())
def test_subgradient_inequality(name, pairs_dir, data, seed, scale, sparse):
    params = {p: data.draw(PARAMETERS[p], label=p) for p in LOSSES[name].params if p in PARAMETERS}
    rng = np.random.default_rng(seed)
    m, d = 40, 6
    loss, y, qid = random_problem(name, params, rng, m, pairs_dir)
    X = (sp.random(m, d, density=0.4, random_state=rng, format="csr", data_rvs=rng.standard_normal)
         if sparse else rng.normal(size=(m, d)))
    w, v = scale * rng.normal(size=(2, d))
    risk = oracle(loss, X, y, qid)
    r_w, a = risk(w)
    r_v, _ = risk(v)
    assert np.isfinite(r_w) and np.isfinite(r_v)
    assert r_v >= r_w + a @ (v - w) - 1e-10 * (1 + abs(r_v) + abs(r_w))


# --------------------------------------------------------------------------
# Properties, parameters, labels, the pairs file, measures
# --------------------------------------------------------------------------

def test_ordinal_with_two_labels_is_the_roc_area():
    rng = np.random.default_rng(7)
    X, w = rng.normal(size=(200, 5)), rng.normal(size=5)
    y = rng.choice([-1.0, 1.0], size=200)
    for cost in ("constant", "linear"):
        r1, a1 = oracle(get_loss("roc_area"), X, y)(w)
        r2, a2 = oracle(get_loss("ordinal", cost=cost), X, y)(w)
        scale = 2.0 if cost == "linear" else 1.0  # C = y_j - y_i = 2
        assert r2 == pytest.approx(scale * r1, rel=1e-12)
        np.testing.assert_allclose(a2, scale * a1, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["roc_area", "ordinal", "prbep", "preference", "ndcg"])
def test_ranking_risks_ignore_a_constant_offset(name, tmp_path):
    rng = np.random.default_rng(8)
    loss, y, qid = random_problem(name, {}, rng, 60, tmp_path)
    X = np.hstack([rng.normal(size=(60, 4)), np.ones((60, 1))])
    w = rng.normal(size=5)
    shifted = w + np.r_[0, 0, 0, 0, 3.25]
    r1, a1 = oracle(loss, X, y, qid)(w)
    r2, a2 = oracle(loss, X, y, qid)(shifted)
    assert r2 == pytest.approx(r1, rel=1e-12)
    assert a1[-1] == pytest.approx(0.0, abs=1e-12)


def test_ndcg_does_not_depend_on_the_listing_order():
    rng = np.random.default_rng(9)
    qid = np.repeat([5, 1, 9, 4], [8, 12, 3, 20])
    m = qid.size
    X, w = rng.normal(size=(m, 4)), rng.normal(size=4)
    y = rng.integers(0, 3, size=m).astype(float)
    r1, a1 = oracle(get_loss("ndcg", k=4), X, y, qid)(w)
    shuffle = rng.permutation(m)
    r2, a2 = oracle(get_loss("ndcg", k=4), X[shuffle], y[shuffle], qid[shuffle])(w)
    assert r2 == pytest.approx(r1, rel=1e-12)
    np.testing.assert_allclose(a2, a1, rtol=1e-10, atol=1e-13)


def test_ndcg_needs_query_ids():
    with pytest.raises(InputError, match="needs query ids"):
        get_loss("ndcg").loss_gradient(np.zeros(2), np.ones((3, 2)), np.array([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("name, parameter, values", [
    ("ordinal", "cost", ["quadratic", ""]), ("fbeta", "beta", ["0", "-1", "inf", "nan"]),
    ("ndcg", "k", ["0", "-3"]), ("preference", "pairs", [""])])
def test_parameters_are_range_checked(name, parameter, values):
    for value in values:
        with pytest.raises(UsageError, match=f"loss '{name}': parameter {parameter} must be"):
            get_loss(name, **{parameter: value})
    with pytest.raises(UsageError, match="expected an integer"):
        get_loss("ndcg", k="2.5")


def test_label_checks():
    plus_minus, three = np.array([-1.0, 1.0]), np.array([0.0, 1.0, 2.0])
    for name in ("roc_area", "fbeta", "prbep"):
        loss = get_loss(name)
        assert loss.check_labels(plus_minus, "binary") is None
        assert "{-1, +1}" in loss.check_labels(three, "integer")
        assert "{-1, +1}" in loss.check_labels(np.array([1.0]), "integer")
        assert loss.check_labels(None, "real") is not None
    ordinal = get_loss("ordinal")
    assert ordinal.check_labels(three, "integer") is None
    assert ordinal.check_labels(plus_minus, "binary") is None
    assert "integer labels" in ordinal.check_labels(None, "real")
    assert "at least two" in ordinal.check_labels(np.array([3.0]), "integer")
    ndcg = get_loss("ndcg")
    assert ndcg.check_labels(three, "integer") is None
    assert ndcg.check_labels(np.array([0.0, 1.0]), "binary") is None
    assert ">= 0" in ndcg.check_labels(plus_minus, "binary")
    assert ">= 0" in ndcg.check_labels(None, "real")
    assert get_loss("preference", pairs="p.txt").check_labels(None, "real") is None


@pytest.mark.parametrize("content, message", [
    ("0 1\n2\n", "line 2: expected 'i j' or 'i j cost'"),
    ("0 1 1 1\n", "line 1: expected 'i j' or 'i j cost'"),
    ("# header\n\n0 x\n", "line 3: 'x' is not an example index"),
    ("-1 2\n", "line 1: '-1' is not an example index"),
    ("1.5 2\n", "line 1: '1.5' is not an example index"),
    ("0 1\n3 3\n", "line 2: example 3 is preferred to itself"),
    ("0 1 -2\n", "line 1: cost '-2' is not a finite number >= 0"),
    ("0 1 nan\n", "line 1: cost 'nan' is not a finite number >= 0"),
    ("# nothing\n\n", "has no pairs"),
    ("0 1\n1 2 0.5\n7 9\n", "line 3: example index 7 is out of range: the data has 5 examples"),
])
def test_pairs_file_errors_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "prefs.txt"
    path.write_text(content)
    loss = get_loss("preference", pairs=str(path))
    with pytest.raises(InputError, match=re.escape(f"{path}: ") + ".*" + re.escape(message)):
        oracle(loss, np.ones((5, 2)), np.zeros(5))(np.zeros(2))


def test_missing_pairs_file(tmp_path):
    loss = get_loss("preference", pairs=str(tmp_path / "none.txt"))
    with pytest.raises(InputError, match="none.txt: no such preference pairs file"):
        loss.coefficients(np.zeros(3), np.zeros(3))


def test_pairs_file_with_comments_costs_and_float_indices(tmp_path):
    path = tmp_path / "prefs.txt"
    path.write_text("# j above i\n0 1   # first\n\n2 1 2.5\n3.0 0 0\n")
    loss = get_loss("preference", pairs=str(path))
    lower, upper, cost = loss.pair_arrays(4)
    assert lower.tolist() == [0, 2, 3] and upper.tolist() == [1, 1, 0]
    assert cost.tolist() == [1.0, 2.5, 0.0]


def test_metrics():
    rng = np.random.default_rng(11)
    f = rng.normal(size=300)
    y = np.where(f + rng.normal(size=300) > 0.3, 1.0, -1.0)
    assert get_loss("roc_area").metrics(f, y) == {"roc_area": pytest.approx(roc_auc_score(y, f))}
    # PRBEP: precision of the m+ highest scores (no ties here).
    top = np.argsort(-f)[:int(np.sum(y > 0))]
    prbep = np.mean(y[top] > 0)
    assert get_loss("prbep").metrics(f, y) == {"prbep": pytest.approx(prbep)}
    assert get_loss("fbeta", beta=2.0).metrics(f, y) == {
        "f_beta": pytest.approx(fbeta_score(y, np.where(f >= 0, 1.0, -1.0), beta=2.0)),
        "prbep": pytest.approx(prbep)}
    assert fbeta_delta(2.0)(np.sign(f + 1e-300), y) == pytest.approx(
        1 - fbeta_score(y, np.where(f >= 0, 1.0, -1.0), beta=2.0))  # the test's own formula
    # Ties at the cut share the hits: half of the tied pair is positive.
    assert get_loss("prbep").metrics(np.array([3.0, 1.0, 1.0, 0.0]),
                                     np.array([1.0, 1.0, -1.0, -1.0])) == {"prbep": 0.75}
    levels = rng.integers(0, 4, size=300).astype(float)
    scores = np.round(levels + rng.normal(size=300), 1)  # with ties
    pairs = [(i, j) for i in range(300) for j in range(300) if levels[i] < levels[j]]
    accuracy = np.mean([1.0 if scores[i] < scores[j] else 0.5 if scores[i] == scores[j] else 0.0
                        for i, j in pairs])
    assert get_loss("ordinal").metrics(scores, levels) == {
        "kendall_tau": pytest.approx(kendalltau(levels, scores).statistic),
        "pairwise_accuracy": pytest.approx(accuracy, rel=1e-12)}


def test_preference_and_ndcg_metrics(tmp_path):
    path = write_pairs(tmp_path / "p.txt", [(0, 1), (1, 2), (2, 0), (3, 0)])
    f = np.array([0.0, 1.0, 1.0, -2.0])
    # satisfied: f1 > f0, tie f2 = f1 (1/2), not f0 > f2, f0 > f3
    assert get_loss("preference", pairs=path).metrics(f, None) == {"preferences_satisfied": 0.625}
    rng = np.random.default_rng(12)
    qid = np.repeat([1, 2, 3, 4], [6, 9, 1, 5])
    y = rng.integers(0, 3, size=qid.size).astype(float)
    y[qid == 4] = 0.0                   # no relevant document: left out
    y[qid == 3] = 2.0                   # a single relevant document: NDCG 1
    f = rng.normal(size=qid.size)
    ndcgs, precisions = [], []
    for q in (1, 2, 3):
        rows = np.flatnonzero(qid == q)
        ndcgs.append(ndcg_of(np.argsort(-f[rows]), y[rows], 3))
        precisions.append(average_precision_score(y[rows] > 0, f[rows]))
    assert get_loss("ndcg", k=3).metrics(f, y, qid) == {
        "ndcg@3": pytest.approx(np.mean(ndcgs)), "map": pytest.approx(np.mean(precisions))}
    with pytest.raises(InputError, match="no query ids"):
        get_loss("ndcg").metrics(f, y)


# --------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def a9a_head(n):
    X, y = load_svmlight("a9a.xz")
    return X[:n], y[:n]


@functools.lru_cache(maxsize=None)
def abalone_subset(n):
    """n random abalone rows (rings as integer labels), features standardized."""
    X, rings = load_svmlight("abalone.xz")
    rows = np.sort(np.random.default_rng(0).choice(len(rings), n, replace=False))
    X = X[rows].toarray()
    return (X - X.mean(axis=0)) / X.std(axis=0), rings[rows]


@functools.lru_cache(maxsize=None)
def mq2008():
    X, y, qid = read_input(data_path("mq2008_subset_vali.txt.xz"))
    return X, y, qid


def random_pairs(m, n, seed):
    rng = np.random.default_rng(seed)
    pairs = [tuple(rng.choice(m, 2, replace=False)) for _ in range(n)]
    return pairs, np.round(rng.uniform(0.5, 2.0, size=n), 3)


# --------------------------------------------------------------------------
# (c) ranks agree with the serial computation
# --------------------------------------------------------------------------

DISTRIBUTED_CASES = [("roc_area", {}), ("fbeta", {"beta": 2.0}), ("prbep", {}),
                     ("ordinal", {}), ("ordinal", {"cost": "linear"}), ("preference", {}),
                     ("ndcg", {"k": 5})]


@pytest.mark.distributed
@pytest.mark.parametrize("name, params", DISTRIBUTED_CASES,
                         ids=[f"{n}-{'-'.join(map(str, p.values()))}" if p else n
                              for n, p in DISTRIBUTED_CASES])
def test_risk_and_subgradient_equal_serial(comm, mpi_tmp_path, name, params):
    qid = None
    if name == "ordinal":
        X, y = abalone_subset(1500)
    elif name == "ndcg":
        X, y, qid = mq2008()
    else:
        X, y = a9a_head(3000)
    params = dict(params)
    if name == "preference":
        params["pairs"] = str(mpi_tmp_path / "pairs.txt")
    directory = str(mpi_tmp_path / "shards")
    if comm.is_root:
        write_shards(X, y, directory, comm.size + 2, qid=qid)
        if name == "preference":
            write_pairs(params["pairs"], *random_pairs(len(y), 5000, 1))
    comm.barrier()
    local = load_local(directory, comm)
    loss = get_loss(name, **params)
    assert loss.check_labels(local.classes, local.label_kind) is None
    risk = DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks,
                           local.qid)
    points = np.random.default_rng(0).normal(size=(3, X.shape[1])) * 0.1
    values = run_distributed(risk, lambda evaluate: [evaluate(w) for w in points])
    if comm.is_root:
        serial = DistributedRisk(get_loss(name, **params), X, y, len(y), SerialComm(), qid=qid)
        for w, (r, a) in zip(points, values):
            r_serial, a_serial = serial(w)
            assert r > 0
            assert r == pytest.approx(r_serial, rel=1e-12)
            np.testing.assert_allclose(a, a_serial, rtol=1e-12, atol=1e-15 * np.abs(a_serial).max())


# --------------------------------------------------------------------------
# (d) BMRM reaches the optimum of an independent convex program
# --------------------------------------------------------------------------

def cvxpy_minimum(objective, constraints=()):
    problem = cp.Problem(cp.Minimize(objective), list(constraints))
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert problem.status == cp.OPTIMAL, problem.status
    return problem.value


def pairs_program(X, lam, lower, upper, costs, normalizer):
    """lam/2 |w|^2 + 1/normalizer sum C max(0, 1 + <w, x_i - x_j>) over the listed pairs."""
    w = cp.Variable(X.shape[1])
    risk = cp.sum(cp.multiply(costs, cp.pos(1 + (X[lower] - X[upper]) @ w))) / normalizer
    return cvxpy_minimum(0.5 * lam * cp.sum_squares(w) + risk)


def roc_reference(X, y, lam, params):
    lower, upper = np.nonzero((y[:, None] < 0) & (y[None, :] > 0))
    return pairs_program(X, lam, lower, upper, np.ones(lower.size), lower.size)


def ordinal_reference(X, y, lam, params):
    lower, upper = np.nonzero(y[:, None] < y[None, :])
    costs = y[upper] - y[lower] if params.get("cost") == "linear" else np.ones(lower.size)
    return pairs_program(X, lam, lower, upper, costs, lower.size)


def preference_reference(X, y, lam, params):
    pairs, costs = random_pairs(len(y), 3000, 2)
    lower, upper = np.array(pairs).T
    return pairs_program(X, lam, lower, upper, costs, len(pairs))


def prbep_reference(X, y, lam, params):
    """R = max_k [k/m+ + (2/m)(sum of the k largest negative - k smallest positive scores)]."""
    m = len(y)
    w = cp.Variable(X.shape[1])
    f = X @ w
    pos, neg = f[np.flatnonzero(y > 0)], f[np.flatnonzero(y < 0)]
    terms = [cp.Constant(0.0)] + [
        k / pos.size + (2 / m) * (cp.sum_largest(neg, k) + cp.sum_largest(-pos, k))
        for k in range(1, min(pos.size, neg.size) + 1)]
    return cvxpy_minimum(0.5 * lam * cp.sum_squares(w) + cp.max(cp.hstack(terms)))


def fbeta_reference(X, y, lam, params):
    """R = max over (FN, FP) of [1 - F_beta + (2/m)(S_FN + Q_FP)], S_FN >= sum of the FN lowest
    positive scores negated, Q_FP >= sum of the FP highest negative scores (epigraphs)."""
    m, b2 = len(y), params.get("beta", 1.0) ** 2
    w, t = cp.Variable(X.shape[1]), cp.Variable()
    f = X @ w
    pos, neg = f[np.flatnonzero(y > 0)], f[np.flatnonzero(y < 0)]
    m_pos, m_neg = pos.size, neg.size
    S, Q = cp.Variable(m_pos + 1), cp.Variable(m_neg + 1)
    constraints = [S[0] >= 0, Q[0] >= 0]
    constraints += [S[k] >= cp.sum_largest(-pos, k) for k in range(1, m_pos + 1)]
    constraints += [Q[k] >= cp.sum_largest(neg, k) for k in range(1, m_neg + 1)]
    false_pos = np.arange(m_neg + 1)
    for false_neg in range(m_pos + 1):
        tp = m_pos - false_neg
        delta = 1 - (1 + b2) * tp / (tp + false_pos + b2 * m_pos)
        constraints.append(t >= delta + (2 / m) * (S[false_neg] + Q))
    return cvxpy_minimum(0.5 * lam * cp.sum_squares(w) + t, constraints)


def ndcg_reference(X, y, lam, params, qid):
    """Per query, max over rankings = max over the assignment polytope = its LP dual:
    min sum(alpha) + sum(beta), alpha_p + beta_j >= c_p f_j - a_p g_j, beta >= 0."""
    k, m = params.get("k", 10), len(y)
    w = cp.Variable(X.shape[1])
    f = X @ w
    total, constraints = 0, []
    for q in np.unique(qid):
        rows = np.flatnonzero(qid == q)
        r, n = y[rows], rows.size
        gain = 2.0 ** r - 1
        ideal = np.argsort(-r, kind="stable")
        a = np.where(np.arange(n) < k, 1 / np.log2(np.arange(n) + 2), 0.0)
        best = gain[ideal] @ a
        if best == 0 or n == 1:
            continue
        c = np.maximum(k + 1 - np.arange(n), 0.0)
        c_bar = np.empty(n)
        for value in np.unique(r):
            at = np.flatnonzero(r[ideal] == value)
            c_bar[ideal[at]] = c[at].mean()
        top = min(n, k + 1)
        alpha, beta = cp.Variable(top), cp.Variable(n, nonneg=True)
        fq = cp.reshape(f[rows], (1, n), order="C")
        profit = c[:top, None] @ fq - np.outer(a[:top], gain / best)
        constraints.append(cp.reshape(alpha, (top, 1), order="C") @ np.ones((1, n))
                           + np.ones((top, 1)) @ cp.reshape(beta, (1, n), order="C") >= profit)
        total = total + 1 - c_bar @ f[rows] + cp.sum(alpha) + cp.sum(beta)
    return cvxpy_minimum(0.5 * lam * cp.sum_squares(w) + total / m, constraints)


TRAINING_CASES = [
    ("roc_area", {}, 1e-2), ("roc_area", {}, 1e-3),
    ("ordinal", {}, 1e-3), ("ordinal", {"cost": "linear"}, 1e-2),
    ("preference", {}, 1e-3),
    ("prbep", {}, 1e-3), ("fbeta", {}, 1e-3), ("fbeta", {"beta": 2.0}, 1e-2),
    ("ndcg", {}, 1e-2),
]


@pytest.mark.parametrize("name, params, lam", TRAINING_CASES,
                         ids=[f"{n}-{'-'.join(map(str, p.values()))}-{lam:g}".replace("--", "-")
                              for n, p, lam in TRAINING_CASES])
def test_bmrm_reaches_the_convex_program_optimum(name, params, lam, tmp_path):
    qid = None
    if name == "ordinal":
        X, y = abalone_subset(200)
    elif name == "ndcg":
        X, y, qid = mq2008()
        X = X.toarray()
    else:
        X, y = a9a_head(150 if name == "fbeta" else 300)
        X = X.toarray()
    params = dict(params)
    if name == "preference":
        params["pairs"] = write_pairs(tmp_path / "pairs.txt", *random_pairs(len(y), 3000, 2))
    reference_params = {key: value for key, value in params.items() if key != "pairs"}
    references = {"roc_area": roc_reference, "ordinal": ordinal_reference,
                  "preference": preference_reference, "prbep": prbep_reference,
                  "fbeta": fbeta_reference}
    if name == "ndcg":
        reference = ndcg_reference(X, y, lam, reference_params, qid)
    else:
        reference = references[name](X, y, lam, reference_params)
    eps = 1e-3 * abs(reference)
    result = minimize(oracle(get_loss(name, **params), X, y, qid), np.zeros(X.shape[1]), lam,
                      epsilon=eps, rel_epsilon=0, max_iter=5000)
    print(f"{name} {reference_params} lam={lam:g}: cvxpy {reference:.10g}, bmrm {result.fun:.10g} "
          f"({(result.fun - reference) / reference:+.2e} relative) in {result.nit} iterations")
    assert result.success, result.message
    assert reference - 1e-9 <= result.fun <= reference + eps + 1e-9
    # Every lower bound lies below the optimum (and so below every objective value).
    assert np.all(result.history["lower_bound"] <= reference + 1e-7 * abs(reference))
    assert np.all(result.history["lower_bound"] <= result.history["objective"] + 1e-12)


# --------------------------------------------------------------------------
# (e) the command line
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def a9a_shards(tmp_path_factory):
    X, y = a9a_head(2000)
    directory = tmp_path_factory.mktemp("a9a") / "shards"
    write_shards(X, y, directory, 3)
    return str(directory)


def test_roc_area_from_the_command_line(tmp_path, a9a_shards):
    from prbmrm.model import load_model

    out = str(tmp_path / "roc.h5")
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", a9a_shards, "--loss", "roc_area",
                                 "--lam", "1e-3", "--quiet", "--out", out])
    assert completed.returncode == 0, completed.stderr
    scores = str(tmp_path / "scores.txt")
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.predict", "--model", out, "--data", a9a_shards,
                                 "--out", scores])
    assert completed.returncode == 0, completed.stderr
    printed = re.fullmatch(r"2000 examples from .*: roc_area ([0-9.]+)\ndecision values written to .*\n",
                           completed.stdout)
    assert printed, completed.stdout
    X, y = a9a_head(2000)
    expected = load_model(out).decision_function(X).ravel()
    # Each rank wrote its rows at its place in the one file.
    np.testing.assert_allclose(np.loadtxt(scores), expected, rtol=1e-12, atol=1e-12)
    auc = roc_auc_score(y, expected)
    assert float(printed.group(1)) == pytest.approx(auc, abs=1e-6)
    assert auc > 0.85


def test_ndcg_from_the_command_line(tmp_path):
    X, y, qid = mq2008()
    shards = str(tmp_path / "mq")
    write_shards(X, y, shards, 4, qid=qid)
    out = str(tmp_path / "ndcg.h5")
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", shards, "--loss", "ndcg",
                                 "--loss-param", "k=5", "--lam", "1e-2", "--quiet", "--out", out])
    assert completed.returncode == 0, completed.stderr
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.predict", "--model", out, "--data", shards])
    assert completed.returncode == 0, completed.stderr
    printed = re.fullmatch(r"1000 examples from .*: ndcg@5 ([0-9.]+), map ([0-9.]+)\n",
                           completed.stdout)
    assert printed, completed.stdout
    assert float(printed.group(1)) > 0.5 and float(printed.group(2)) > 0.4


@pytest.mark.parametrize("ranks", [1, 2])
def test_bad_pairs_file_fails_with_one_line(tmp_path, a9a_shards, ranks):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("0 1\n5 2000\n")
    out = tmp_path / "p.h5"
    completed, _ = run_ranks(ranks, ["-m", "prbmrm.cli.train", "--data", a9a_shards, "--loss", "preference",
                                 "--loss-param", f"pairs={pairs}", "--quiet", "--out", str(out)])
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        f"prbmrm.cli.train: error: {pairs}: line 2: example index 2000 is out of range: the data has "
        "2000 examples (0-based indices 0..1999)"]
    assert not out.exists()
