"""Vector losses (W is d x k): subgradients, independent formulas, cvxpy optima, ranks, CLI.

Every loss of :data:`prbmrm.losses.vector.VECTOR_LOSSES` appears in CASES, some
with their parameter files. The references below are written out per example,
independently of prbmrm's vectorised code.
"""

import itertools
import lzma
import math
import os

import cvxpy as cp
import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from helpers import data_path, load_multilabel, load_svmlight, run_ranks
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local, write_shards
from prbmrm.errors import UsageError
from prbmrm.losses import LOSSES, get_loss
from prbmrm.losses.vector import VECTOR_LOSSES
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.solvers import minimize

# --------------------------------------------------------------------------
# Parameter files and the small label sets of the unit tests
# --------------------------------------------------------------------------

CLASSES = np.array([1.0, 2.0, 5.0, 7.0])
# A DAG over CLASSES with inner nodes; class 5 has two parents (b and the class 2).
DAG_EDGES = [("root", "a"), ("root", "b"), ("a", "1"), ("a", "2"), ("b", "5"), ("b", "7"),
             ("2", "5")]
# The documented output order: the classes, then the other nodes by first appearance.
DAG_NODES = ["1", "2", "5", "7", "root", "a", "b"]


def write_matrix(path, M):
    np.savetxt(path, M)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Parameter files shared by the unit tests: cost, gamma, M and the DAG."""
    directory = tmp_path_factory.mktemp("vector_params")
    rng = np.random.default_rng(7)
    cost = rng.uniform(0.5, 2.0, size=(4, 4))
    np.fill_diagonal(cost, 0.0)
    gamma = rng.uniform(0.2, 1.5, size=(4, 4))
    L = rng.normal(size=(3, 3))
    dag = directory / "dag.txt"
    dag.write_text("# parent child\n" + "".join(f"{p} {c}\n" for p, c in DAG_EDGES))
    return {"cost": write_matrix(directory / "cost.txt", cost),
            "gamma": write_matrix(directory / "gamma.txt", gamma),
            "M": write_matrix(directory / "M.txt", L @ L.T),
            "dag": str(dag), "dir": directory}


# case id -> (loss name, parameter names taken from `files`, classes or outputs)
CASES = {
    "multiclass_hinge": ("multiclass_hinge", (), CLASSES),
    "multiclass_hinge-cost": ("multiclass_hinge", ("cost",), CLASSES),
    "multiclass_hinge-40classes": ("multiclass_hinge", (), np.arange(40.0)),  # sparse G path
    "scaled_multiclass_hinge": ("scaled_multiclass_hinge", ("cost",), CLASSES),
    "scaled_multiclass_hinge-gamma": ("scaled_multiclass_hinge", ("cost", "gamma"), CLASSES),
    "scaled_multiclass_hinge-40classes": ("scaled_multiclass_hinge", (), np.arange(40.0)),
    "softmax": ("softmax", (), CLASSES),
    "multivariate_regression": ("multivariate_regression", (), 3),
    "multivariate_regression-M": ("multivariate_regression", ("M",), 3),
    "multilabel_hinge": ("multilabel_hinge", (), 5),
    "multilabel_hinge-40labels": ("multilabel_hinge", (), 40),
    "ontology": ("ontology", ("dag",), CLASSES),
}
DIFFERENTIABLE = {"softmax", "multivariate_regression"}


def test_cases_cover_every_vector_loss():
    names = {cls.name for cls in VECTOR_LOSSES}
    assert names == {name for name, _, _ in CASES.values()}
    assert names <= set(LOSSES)


def make_case(case, files, rng, n):
    """Return (prepared loss, labels y, reference) for `n` random examples."""
    name, keys, labels = CASES[case]
    loss = get_loss(name, **{key: files[key] for key in keys})
    if name == "multivariate_regression":
        loss.prepare(np.arange(float(labels)), "multioutput")
        y = rng.normal(size=(n, labels))
    elif name == "multilabel_hinge":
        loss.prepare(np.arange(float(labels)), "multilabel")
        y = (rng.random((n, labels)) < 0.35).astype(np.int8)
        y[0] = 0  # no relevant label: loss 0
        y[1] = 1  # every label relevant: loss 0
    else:
        loss.prepare(labels, "integer")
        y = rng.choice(labels, size=n)
    assert loss.n_outputs == (len(DAG_NODES) if name == "ontology" else
                              labels if np.ndim(labels) == 0 else len(labels))
    return loss, y, Reference(case, files)


class Reference:
    """The loss of one example and its gradient in f, by brute force over the candidates."""

    def __init__(self, case, files):
        self.name, keys, self.labels = CASES[case]
        k = None if np.ndim(self.labels) == 0 else len(self.labels)
        self.delta = np.loadtxt(files["cost"]) if "cost" in keys else 1.0 - np.eye(k or 1)
        self.gamma = np.loadtxt(files["gamma"]) if "gamma" in keys else self.delta
        self.M = np.loadtxt(files["M"]) if "M" in keys else None
        if self.name == "ontology":
            self.phi, self.onto_delta = ontology_features(DAG_EDGES, DAG_NODES, ["1", "2", "5", "7"])

    def candidates(self, f, y):
        """(values, gradients in f) of every term of the max, or None for smooth losses."""
        k = len(f)
        if self.name in ("multiclass_hinge", "scaled_multiclass_hinge"):
            c = list(self.labels).index(y)
            scale = 1.0 if self.name == "multiclass_hinge" else None
            values, grads = [], []
            for j in range(k):
                g = self.gamma[c, j] if scale is None else scale
                values.append(g * (f[j] - f[c]) + self.delta[c, j])
                grads.append(g * (np.eye(k)[j] - np.eye(k)[c]))
            return values, grads
        if self.name == "multilabel_hinge":
            values, grads = [0.0], [np.zeros(k)]
            for r, s in itertools.product(range(k), range(k)):
                if y[r] == 1 and y[s] == 0:
                    values.append(1.0 - f[r] + f[s])
                    grads.append(np.eye(k)[s] - np.eye(k)[r])
            return values, grads
        if self.name == "ontology":
            c = list(self.labels).index(y)
            values = [self.phi[j] @ f - self.phi[c] @ f + self.onto_delta[c, j]
                      for j in range(len(self.labels))]
            return values, [self.phi[j] - self.phi[c] for j in range(len(self.labels))]
        return None

    def __call__(self, f, y):
        terms = self.candidates(f, y)
        if terms is not None:
            best = int(np.argmax(terms[0]))
            return terms[0][best], terms[1][best]
        if self.name == "softmax":
            c = list(self.labels).index(y)
            p = np.exp(f) / np.sum(np.exp(f))
            return math.log(sum(math.exp(v) for v in f)) - f[c], p - np.eye(len(f))[c]
        if self.name == "multivariate_regression":
            M = np.eye(len(f)) if self.M is None else self.M
            return 0.5 * (f - y) @ M @ (f - y), M @ (f - y)
        raise AssertionError(self.name)

    def tie_gap(self, f, y):
        """Gap between the largest and the second largest term (inf for smooth losses)."""
        terms = self.candidates(f, y)
        if terms is None or len(terms[0]) < 2:
            return np.inf
        top = np.sort(terms[0])[::-1]
        return top[0] - top[1]


def ontology_features(edges, nodes, classes):
    """phi (classes x nodes, ancestors-and-self indicators) and Delta (symmetric differences)."""
    parents = {}
    for p, c in edges:
        parents.setdefault(c, set()).add(p)

    def ancestors(node):
        found = {node}
        for p in parents.get(node, ()):
            found |= ancestors(p)
        return found

    sets = [ancestors(c) for c in classes]
    phi = np.array([[1.0 if node in s else 0.0 for node in nodes] for s in sets])
    delta = np.array([[len(a ^ b) for b in sets] for a in sets], dtype=float)
    return phi, delta


def risk(loss, w, X, y):
    total, grad = loss.loss_gradient(w, X, y)
    return total / len(y), grad / len(y)


# --------------------------------------------------------------------------
# (a) subgradient inequality, (b) finite differences, (c) independent formula
# --------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(0.01, 10.0), sparse=st.booleans())
def test_subgradient_inequality(files, case, seed, scale, sparse):
    rng = np.random.default_rng(seed)
    loss, y, _ = make_case(case, files, rng, 30)
    X = sp.random(30, 5, density=0.5, random_state=rng, format="csr")
    X = X if sparse else X.toarray()
    w, v = scale * rng.normal(size=(2, 5 * loss.n_outputs))
    r_w, a = risk(loss, w, X, y)
    r_v, _ = risk(loss, v, X, y)
    assert r_v >= r_w + a @ (v - w) - 1e-9 * (1 + abs(r_v))


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_matches_central_differences(files, case):
    rng = np.random.default_rng(3)
    loss, y, reference = make_case(case, files, rng, 20)
    d = 3
    X = rng.normal(size=(20, d))
    w = 2.0 * rng.normal(size=d * loss.n_outputs)
    F = X @ w.reshape(d, -1)
    if CASES[case][0] not in DIFFERENTIABLE:
        # Differentiable only where the maximizing term is unique.
        assert min(reference.tie_gap(F[i], y[i]) for i in range(20)) > 1e-4
    _, a = risk(loss, w, X, y)
    h = 1e-6
    numeric = np.array([(risk(loss, w + h * e, X, y)[0] - risk(loss, w - h * e, X, y)[0]) / (2 * h)
                        for e in np.eye(len(w))])
    np.testing.assert_allclose(a, numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_risk_and_gradient_match_independent_formula(files, case, sparse):
    rng = np.random.default_rng(4)
    n, d = 50, 4
    loss, y, reference = make_case(case, files, rng, n)
    X = sp.random(n, d, density=0.6, random_state=rng, format="csr")
    W = rng.normal(size=(d, loss.n_outputs))
    total, grad = loss.loss_gradient(W.ravel(), X if sparse else X.toarray(), y)
    dense = X.toarray()
    expected_total, expected_grad = 0.0, np.zeros_like(W)
    for i in range(n):
        value, g = reference(dense[i] @ W, y[i])
        expected_total += value
        expected_grad += np.outer(dense[i], g)
    assert total == pytest.approx(expected_total, rel=1e-12, abs=1e-12)
    # The gradient is the flat d x k matrix G^T X, in the layout of w = W.ravel().
    np.testing.assert_allclose(grad, expected_grad.ravel(), rtol=1e-12, atol=1e-12)


def test_softmax_is_stable_for_large_scores():
    loss = get_loss("softmax")
    loss.prepare(np.array([0.0, 1.0, 2.0]), "integer")
    X = np.array([[1.0], [-1.0]])
    w = np.array([1000.0, -1000.0, 0.0])
    total, grad = loss.loss_gradient(w, X, np.array([1.0, 1.0]))
    assert np.isfinite(grad).all()
    assert total == pytest.approx(2000.0)  # 1000 - (-1000) for the first row, 0 for the second


def test_empty_block():
    for case in ("multiclass_hinge", "softmax", "multilabel_hinge"):
        name, _, labels = CASES[case]
        loss = get_loss(name)
        loss.prepare(np.arange(4.0), "multilabel" if name == "multilabel_hinge" else "integer")
        y = np.zeros((0, 4), np.int8) if name == "multilabel_hinge" else np.zeros(0)
        total, grad = loss.loss_gradient(np.ones(12), sp.csr_matrix((0, 3)), y)
        assert total == 0.0 and grad.shape == (12,) and not grad.any()


# --------------------------------------------------------------------------
# Labels, predictions, measures, parameter files
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["multiclass_hinge", "scaled_multiclass_hinge", "softmax", "ontology"])
def test_multiclass_losses_check_labels(files, name):
    loss = get_loss(name, **({"dag": files["dag"]} if name == "ontology" else {}))
    assert loss.check_labels(CLASSES, "integer") is None
    assert loss.check_labels(np.array([-1.0, 1.0]), "binary") is None
    assert "real-valued" in loss.check_labels(None, "real")
    assert "multilabel" in loss.check_labels(np.arange(3.0), "multilabel")
    assert "at least 2 classes" in loss.check_labels(np.array([4.0]), "integer")


def test_multilabel_and_multivariate_check_labels():
    loss = get_loss("multilabel_hinge")
    assert loss.check_labels(np.arange(6.0), "multilabel") is None
    assert "needs multilabel data" in loss.check_labels(CLASSES, "integer")
    regression = get_loss("multivariate_regression")
    assert regression.check_labels(np.arange(3.0), "multioutput") is None
    assert regression.check_labels(None, "real") is None
    assert "real-valued" in regression.check_labels(np.arange(3.0), "multilabel")


def test_predictions_and_measures(files):
    F = np.array([[0.1, 0.9, -1.0, 0.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    for name in ("multiclass_hinge", "scaled_multiclass_hinge", "softmax"):
        loss = get_loss(name)
        loss.prepare(CLASSES, "integer")
        assert loss.predicts_labels
        np.testing.assert_array_equal(loss.predict_labels(F), [2.0, 1.0, 7.0])
        measures = loss.metrics(F, np.array([2.0, 5.0, 7.0]))
        assert measures == pytest.approx({"accuracy": 2 / 3, "error_rate": 1 / 3})
    ontology = get_loss("ontology", dag=files["dag"])
    ontology.prepare(CLASSES, "integer")
    # Node scores: class 5's path (5, b, root, 2, a) collects the most.
    node_scores = np.array([[0.0, 0.5, 1.0, 0.0, 0.0, 0.2, 0.3]])
    np.testing.assert_array_equal(ontology.predict_labels(node_scores), [5.0])
    multilabel = get_loss("multilabel_hinge")
    multilabel.prepare(np.arange(4.0), "multilabel")
    assert multilabel.predicts_labels
    Y = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.int8)
    np.testing.assert_array_equal(multilabel.predict_labels(F), (F > 0).astype(np.int8))
    measures = multilabel.metrics(F, Y)
    assert measures["hamming_loss"] == pytest.approx(1 / 12)  # only (0, 0) is wrong
    assert measures["subset_accuracy"] == pytest.approx(2 / 3)
    regression = get_loss("multivariate_regression")
    regression.prepare(np.arange(4.0), "multioutput")
    assert not regression.predicts_labels
    assert regression.metrics(F, F + 0.5)["rmse"] == pytest.approx(0.5)


def test_ontology_nodes_and_costs(files):
    loss = get_loss("ontology", dag=files["dag"])
    loss.prepare(CLASSES, "integer")
    assert [n if isinstance(n, str) else f"{n:g}" for n in loss.nodes] == DAG_NODES
    phi, delta = ontology_features(DAG_EDGES, DAG_NODES, ["1", "2", "5", "7"])
    np.testing.assert_array_equal(loss.phi, phi)
    np.testing.assert_array_equal(loss.delta, delta)
    assert delta[2, 3] == 4  # anc(5) = {5, b, root, 2, a}, anc(7) = {7, b, root}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name, param, text, message", [
    ("multiclass_hinge", "cost", "0 1\n1 0\n2 2\n", "expected a square matrix, got 3 x 2"),
    ("multiclass_hinge", "cost", "0 1 1\n1 0 1\n1 1 0\n", "expected a 4 x 4 matrix"),
    ("multiclass_hinge", "cost", "1 1 1 1\n1 0 1 1\n1 1 0 1\n1 1 1 0\n", "diagonal must be 0"),
    ("multiclass_hinge", "cost", "0 1 1 1\n1 0 -1 1\n1 1 0 1\n1 1 1 0\n", "row 2, column 3 is -1"),
    ("multiclass_hinge", "cost", "0 a\n1 0\n", "not a matrix of numbers"),
    ("multiclass_hinge", "cost", "0 nan\n1 0\n", "non-finite"),
    ("scaled_multiclass_hinge", "gamma", "0 1 1 1\n1 0 1 1\n1 1 0 -2\n1 1 1 0\n", "must be >= 0"),
    ("multivariate_regression", "M", "1 2\n0 1\n", "not symmetric"),
    ("multivariate_regression", "M", "1 2\n2 1\n", "not positive semidefinite"),
    ("multivariate_regression", "M", "1 0\n0 1\n", "is 2 x 2, the data has 3 target(s)"),
    ("ontology", "dag", "a b c\n", "line 1: expected 'parent child'"),
    ("ontology", "dag", "1 2\n2 5\n5 1\n7 1\n", "has a cycle"),
    ("ontology", "dag", "root 1\nroot 2\nroot 5\n", "class 7 is not a node of the DAG"),
    ("ontology", "dag", "# nothing\n", "no edges"),
])
def test_bad_parameter_files_are_named(tmp_path, name, param, text, message):
    path = write(tmp_path, "param.txt", text)

    def use():
        loss = get_loss(name, **{param: path})
        if name == "multivariate_regression":
            problem = loss.check_labels(np.arange(3.0), "multioutput")
            if problem:
                raise UsageError(problem)
        loss.prepare(CLASSES, "integer")

    with pytest.raises(UsageError) as raised:
        use()
    assert message in str(raised.value)
    assert f"{param}={path}" in str(raised.value)


def test_missing_parameter_files(tmp_path):
    missing = str(tmp_path / "nowhere.txt")
    with pytest.raises(UsageError, match=f"cost={missing}: cannot read"):
        get_loss("multiclass_hinge", cost=missing)
    with pytest.raises(UsageError, match=f"dag={missing}: cannot read"):
        get_loss("ontology", dag=missing)
    assert "dag=FILE" in get_loss("ontology").check_labels(CLASSES, "integer")
    with pytest.raises(UsageError, match="margin must be a positive number"):
        get_loss("multilabel_hinge", margin="-1")


def test_multilabel_ranking_measures_by_brute_force():
    rng = np.random.default_rng(3)
    F = rng.integers(-2, 3, size=(50, 5)).astype(float)  # small integers: many ties
    Y = (rng.random((50, 5)) < 0.4).astype(np.int8)
    loss = get_loss("multilabel_hinge")
    loss.prepare(np.arange(5.0), "multilabel")
    fractions = []
    for f, z in zip(F, Y):
        pairs = [(r, s) for r in range(5) for s in range(5) if z[r] and not z[s]]
        if pairs:
            fractions.append(sum(1.0 if f[s] > f[r] else 0.5 if f[s] == f[r] else 0.0
                                 for r, s in pairs) / len(pairs))
    measures = loss.metrics(F, Y)
    assert measures["ranking_loss"] == pytest.approx(np.mean(fractions))
    assert measures["one_error"] == pytest.approx(np.mean([not z[np.argmax(f)] for f, z in zip(F, Y)]))


# --------------------------------------------------------------------------
# (d) BMRM reaches cvxpy's optimum of the full primal on real data
# --------------------------------------------------------------------------

def cvxpy_optimum(name, X, y, classes, lam, delta=None, gamma=None, phi=None, M=None):
    """min lam/2 |W|^2 + 1/n sum_i l(W^T x_i, y_i), the loss written out for cvxpy."""
    n, d = X.shape
    k = phi.shape[1] if phi is not None else y.shape[1] if y.ndim == 2 else len(classes)
    W = cp.Variable((d, k))
    F = X @ W
    if name == "multilabel_hinge":
        rows = np.flatnonzero(y.any(axis=1) & ~y.all(axis=1))  # the others have loss 0
        upper, lower = cp.Variable(len(rows)), cp.Variable(len(rows))
        Fr, Yr = F[rows], y[rows].astype(float)
        constraints = [cp.multiply(1 - Yr, Fr - cp.reshape(upper, (len(rows), 1), order="C") @ np.ones((1, k))) <= 0,
                       cp.multiply(Yr, cp.reshape(lower, (len(rows), 1), order="C") @ np.ones((1, k)) - Fr) <= 0]
        risk = cp.sum(cp.pos(1 + upper - lower))
    elif name == "multivariate_regression":
        L = np.linalg.cholesky(M)
        risk, constraints = 0.5 * cp.sum_squares((F - y) @ L), []
    else:
        index = np.searchsorted(classes, y)
        onehot = np.eye(len(classes))[index]
        constraints = []
        if name == "ontology":
            S = F @ phi.T
            s_y = cp.sum(cp.multiply(S, onehot), axis=1)
            risk = cp.sum(cp.max(S - cp.reshape(s_y, (n, 1), order="C") @ np.ones((1, len(classes)))
                                 + delta[index], axis=1))
        else:
            f_y = cp.sum(cp.multiply(F, onehot), axis=1)
            if name == "softmax":
                risk = cp.sum(cp.log_sum_exp(F, axis=1) - f_y)
            else:
                scale = np.ones((n, k)) if gamma is None else gamma[index]
                risk = cp.sum(cp.max(cp.multiply(scale, F - cp.reshape(f_y, (n, 1), order="C") @ np.ones((1, k)))
                                     + delta[index], axis=1))
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(W) + risk / n), constraints)
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == cp.OPTIMAL
    return problem.value


DNA_DAG = "root 1\nroot inner\ninner 2\ninner 3\n"  # classes 2 and 3 share a parent
SCALED_COST = [[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]


@pytest.mark.parametrize("case", ["multiclass_hinge-dna", "scaled_multiclass_hinge-dna", "softmax-dna",
                                  "ontology-dna", "multiclass_hinge-letter", "multilabel_hinge-scene",
                                  "multivariate_regression-scene"])
def test_reaches_cvxpy_optimum(tmp_path, case):
    name, data = case.split("-")
    lam = 1e-2
    params, extra = {}, {}
    if data == "dna":
        X, y = load_svmlight("dna.scale.xz")
        X, y = X[:600], y[:600]
    elif data == "letter":
        X, y = load_svmlight("letter.scale.xz")
        X, y = X[:260], y[:260]
    else:
        X, y, classes = load_multilabel("scene_train.xz")
        X, y = X[::6], y[::6]  # sorted by label: every sixth row has them all; cvxpy is slow on more
    if name == "multilabel_hinge":
        label_kind = "multilabel"
    elif name == "multivariate_regression":
        # The scene label indicator as k real targets; a non-diagonal metric M.
        y = y.astype(float)
        classes, label_kind = np.arange(float(y.shape[1])), "multioutput"
        A = np.random.default_rng(0).normal(size=(6, 6))
        extra["M"] = A @ A.T / 6 + np.eye(6)
        params["M"] = write_matrix(tmp_path / "M.txt", extra["M"])
    else:
        classes, label_kind = np.unique(y), "integer"
        extra["delta"] = 1.0 - np.eye(len(classes))
    if name == "scaled_multiclass_hinge":
        params["cost"] = write_matrix(tmp_path / "cost.txt", SCALED_COST)
        extra["delta"] = extra["gamma"] = np.array(SCALED_COST)  # Gamma = Delta by default
    if name == "ontology":
        params["dag"] = write(tmp_path, "dag.txt", DNA_DAG)
        extra["phi"], extra["delta"] = ontology_features(
            [line.split() for line in DNA_DAG.splitlines()], ["1", "2", "3", "root", "inner"], ["1", "2", "3"])
    reference = cvxpy_optimum(name, X, y, classes, lam, **extra)

    loss = get_loss(name, **params)
    assert loss.check_labels(classes, label_kind) is None
    loss.prepare(classes, label_kind)
    eps = 1e-3 * reference
    result = minimize(DistributedRisk(loss, X, y, len(y), SerialComm()), np.zeros(X.shape[1] * loss.n_outputs),
                      lam, epsilon=eps, rel_epsilon=0, max_iter=3000)
    assert result.success and result.gap <= eps
    assert abs(result.fun - reference) <= eps
    # Every lower bound along the way is below the optimum.
    assert np.all(result.history["lower_bound"] <= reference + 1e-7 * abs(reference))


# --------------------------------------------------------------------------
# (e) risk and subgradient on P ranks equal the serial ones
# --------------------------------------------------------------------------

def multiclass_dna():
    X, y = load_svmlight("dna.scale.xz")
    return X[:300], y[:300]


def multilabel_scene():
    X, Y, classes = load_multilabel("scene_train.xz")
    X, Y = X[::6], Y[::6]  # sorted by label: every sixth row has them all
    label_sets = [tuple(classes[row.astype(bool)]) for row in Y]
    return X, Y, label_sets


@pytest.mark.distributed
def test_risk_and_subgradient_equal_serial(comm, mpi_tmp_path):
    single = str(mpi_tmp_path / "single")
    multi = str(mpi_tmp_path / "multi")
    dag = str(mpi_tmp_path / "dag.txt")
    X1, y1 = multiclass_dna()
    X2, Y2, label_sets = multilabel_scene()
    if comm.is_root:
        write_shards(X1, y1, single, comm.size + 2)
        write_shards(X2, label_sets, multi, comm.size + 1, multilabel=True)
        with open(dag, "w") as f:
            f.write(DNA_DAG)
    comm.barrier()
    rng = np.random.default_rng(0)
    checked = set()
    for name in ("multiclass_hinge", "scaled_multiclass_hinge", "softmax", "ontology", "multilabel_hinge"):
        local = load_local(multi if name == "multilabel_hinge" else single, comm)
        loss = get_loss(name, **({"dag": dag} if name == "ontology" else {}))
        loss.prepare(local.classes, local.label_kind)
        X, y = (X2, Y2) if name == "multilabel_hinge" else (X1, y1)
        points = rng.normal(size=(3, X.shape[1] * loss.n_outputs))
        compare(comm, loss, local.X, local.y, local.blocks, X, y, points)
        checked.add(name)
    # No 2-D real targets in the data layer yet: give each rank its own canonical blocks by hand.
    regression = get_loss("multivariate_regression")
    regression.prepare(np.arange(6.0), "multioutput")
    targets = Y2 + 0.1 * np.random.default_rng(1).normal(size=Y2.shape)
    bounds = np.linspace(0, len(targets), 6).astype(int)
    mine = np.array_split(np.arange(5), comm.size)[comm.rank]
    start, stop = bounds[mine[0]], bounds[mine[-1] + 1]
    points = rng.normal(size=(3, X2.shape[1] * 6))
    compare(comm, regression, X2[start:stop], targets[start:stop], bounds[mine[0]:mine[-1] + 2] - start,
            X2, targets, points)
    checked.add("multivariate_regression")
    assert checked == {cls.name for cls in VECTOR_LOSSES}


def compare(comm, loss, X_local, y_local, blocks, X, y, points):
    oracle = DistributedRisk(loss, X_local, y_local, len(y), comm, blocks)
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points])
    if comm.is_root:
        serial = DistributedRisk(loss, X, y, len(y), SerialComm())
        for w, (r, a) in zip(points, values):
            r_serial, a_serial = serial(w)
            assert r == pytest.approx(r_serial, rel=1e-12), loss.name
            np.testing.assert_allclose(a, a_serial, rtol=1e-12, atol=1e-15, err_msg=loss.name)


# --------------------------------------------------------------------------
# (f) train and predict through the command line on two ranks
# --------------------------------------------------------------------------

def test_cli_trains_and_predicts_multiclass(tmp_path):
    X, y = load_svmlight("dna.scale.xz")
    shards, model, labels = str(tmp_path / "dna"), str(tmp_path / "model.h5"), str(tmp_path / "labels.txt")
    write_shards(X, y, shards, 3)
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", shards, "--loss", "multiclass_hinge",
                                 "--bias", "--lam", "1e-2", "--out", model, "--quiet"])
    assert completed.returncode == 0, completed.stderr
    with h5py.File(model) as f:
        assert f["w"].shape == (180, 3)
        np.testing.assert_array_equal(f.attrs["classes"], [1.0, 2.0, 3.0])
        assert f.attrs["bias"].shape == (3,)
    test_file = data_path("dna.scale.t.xz")
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.predict", "--model", model, "--data", test_file,
                                 "--labels", labels])
    assert completed.returncode == 0, completed.stderr
    predicted = np.loadtxt(labels)
    _, y_test = load_svmlight("dna.scale.t.xz", n_features=180)
    assert set(np.unique(predicted)) <= {1.0, 2.0, 3.0} and len(predicted) == len(y_test)
    accuracy = float(np.mean(predicted == y_test))
    assert 0.93 <= accuracy <= 0.97
    assert f"accuracy {accuracy:.6g}" in completed.stdout
    assert os.path.exists(labels)


def test_predict_finds_a_relative_parameter_file_from_another_directory(tmp_path):
    X, y = multiclass_dna()
    write_shards(X, y, tmp_path / "dna", 1)
    (tmp_path / "train").mkdir()
    write_matrix(tmp_path / "train" / "cost.txt", SCALED_COST)
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "dna"), "--loss",
                                 "multiclass_hinge", "--loss-param", "cost=cost.txt", "--lam", "1e-2",
                                 "--out", str(tmp_path / "model.h5"), "--quiet"], cwd=tmp_path / "train")
    assert completed.returncode == 0, completed.stderr
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.predict", "--model", str(tmp_path / "model.h5"),
                                 "--data", str(tmp_path / "dna")], cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "accuracy" in completed.stdout


def test_cli_multilabel_predicts_label_sets_from_a_text_file(tmp_path):
    from sklearn.datasets import load_svmlight_file

    with lzma.open(data_path("scene_train.xz")) as f:
        X, label_sets = load_svmlight_file(f, multilabel=True)
    shards, model, labels = str(tmp_path / "scene"), str(tmp_path / "model.h5"), str(tmp_path / "labels.txt")
    write_shards(X, label_sets, shards, 2, multilabel=True)
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--data", shards, "--loss", "multilabel_hinge",
                                 "--lam", "1e-2", "--out", model, "--quiet"])
    assert completed.returncode == 0, completed.stderr
    # The test file is SVMlight text with label sets: predict reads it as multilabel.
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.predict", "--model", model, "--data",
                                 data_path("scene_test.xz"), "--labels", labels])
    assert completed.returncode == 0, completed.stderr
    predicted = np.loadtxt(labels)
    _, Y_test, classes = load_multilabel("scene_test.xz")
    assert predicted.shape == Y_test.shape == (1196, 6) and set(np.unique(predicted)) <= {0.0, 1.0}
    hamming = float(np.mean(predicted != Y_test))
    assert f"hamming_loss {hamming:.6g}" in completed.stdout


def test_predict_aligns_multilabel_columns_to_the_model():
    from prbmrm.errors import CollectiveError
    from prbmrm.cli.predict import align_label_columns

    Y = np.array([[1, 0], [0, 1]], dtype=np.int8)
    aligned = align_label_columns(Y, [0.0, 3.0], [0.0, 1.0, 3.0], "test")
    np.testing.assert_array_equal(aligned, [[1, 0, 0], [0, 0, 1]])
    assert align_label_columns(Y, [0.0, 1.0], [0.0, 1.0], "test") is Y
    with pytest.raises(CollectiveError, match="test: label 9 is not one of the model's 2 labels"):
        align_label_columns(Y, [0.0, 9.0], [0.0, 1.0], "test")
