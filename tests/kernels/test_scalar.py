"""The built-in scalar losses, written once in prbmrm.kernels.scalar, and the compiled risk passes.

References: each loss's formula written out again here in plain numpy
(``np.where``, an independent transcription of paper 000's Table 5 and the
classes' docstrings), central finite differences for the derivatives, and
``X.T @ l'(X w)`` with numpy/scipy products for the passes. The
``distributed`` test runs again under mpiexec -n 2 and -n 3
(tests/distributed/test_mpiexec.py): ranks must agree with one rank bitwise.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import prbmrm.kernels.blocks
from prbmrm.kernels import scalar as kernels
from helpers import shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.io import load_local
from prbmrm.losses import LOSSES, BinaryLoss, register_loss
from prbmrm.losses.base import ScalarLoss
from prbmrm.losses.scalar import SCALAR_LOSSES

# Parameters away from the defaults, so that a parameter the compiled code ignored would show.
PARAMS = {"huber_hinge": {"delta": 0.3}, "novelty": {"rho": 0.7}, "quantile": {"tau": 0.8},
          "epsilon_insensitive": {"epsilon": 0.25}, "huber": {"delta": 0.4}}


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# name: (l(f, y, p), l'(f, y, p)); p the loss's parameter where it has one.
REFERENCE = {
    "hinge": (lambda f, y, p: np.where(y * f < 1, 1 - y * f, 0.0), lambda f, y, p: np.where(y * f < 1, -y, 0.0)),
    "squared_hinge": (lambda f, y, p: np.where(y * f < 1, (1 - y * f) ** 2 / 2, 0.0),
                      lambda f, y, p: np.where(y * f < 1, f - y, 0.0)),
    "zero_hinge": (lambda f, y, p: np.where(y * f < 0, -y * f, 0.0), lambda f, y, p: np.where(y * f < 0, -y, 0.0)),
    "squared_zero_hinge": (lambda f, y, p: np.where(y * f < 0, (y * f) ** 2 / 2, 0.0),
                           lambda f, y, p: np.where(y * f < 0, f, 0.0)),
    "exponential": (lambda f, y, p: np.exp(-y * f), lambda f, y, p: -y * np.exp(-y * f)),
    "logistic": (lambda f, y, p: np.log1p(np.exp(-y * f)), lambda f, y, p: -y * _sigmoid(-y * f)),
    "huber_hinge": (lambda f, y, p: np.where(y * f > 1 + p, 0.0, np.where(y * f < 1 - p, 1 - y * f,
                                                                            (1 + p - y * f) ** 2 / (4 * p))),
                    lambda f, y, p: np.where(y * f > 1 + p, 0.0, np.where(y * f < 1 - p, -y,
                                                                            -y * (1 + p - y * f) / (2 * p)))),
    "novelty": (lambda f, y, p: np.where(f < p, p - f, 0.0), lambda f, y, p: np.where(f < p, -1.0, 0.0)),
    "least_squares": (lambda f, y, p: (f - y) ** 2 / 2, lambda f, y, p: f - y),
    "least_absolute_deviation": (lambda f, y, p: np.abs(f - y), lambda f, y, p: np.sign(f - y)),
    "quantile": (lambda f, y, p: np.where(f > y, (1 - p) * (f - y), p * (y - f)),
                 lambda f, y, p: np.where(f > y, 1 - p, -p)),
    "epsilon_insensitive": (lambda f, y, p: np.where(np.abs(f - y) > p, np.abs(f - y) - p, 0.0),
                            lambda f, y, p: np.where(f - y > p, 1.0, np.where(f - y < -p, -1.0, 0.0))),
    "huber": (lambda f, y, p: np.where(np.abs(f - y) <= p, (f - y) ** 2 / 2, p * (np.abs(f - y) - p / 2)),
              lambda f, y, p: np.clip(f - y, -p, p)),
    "poisson": (lambda f, y, p: np.exp(f) - y * f, lambda f, y, p: np.exp(f) - y),
}

LOSS_IDS = dict(ids=lambda cls: cls.name)


def make(cls):
    return cls(**PARAMS.get(cls.name, {}))


def parameter(loss):
    return next(iter(PARAMS.get(loss.name, {"": 0.0}).values()))


def scores_and_labels(loss, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    f = rng.normal(0.0, 2.0, n)
    if loss.task == "regression":
        y = rng.poisson(2.0, n).astype(np.float64)
    else:
        y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    return f, y


def off_kinks(loss, f, y, margin):
    """Where f is farther than `margin` from every point where l or l' has a kink."""
    kinks = loss.kinks(y)
    keep = np.all(np.abs(f[:, None] - kinks) > margin, axis=1)
    if loss.name == "huber_hinge":  # l' has kinks at y f = 1 +- delta
        keep &= np.abs(np.abs(y * f - 1) - PARAMS["huber_hinge"]["delta"]) > margin
    if loss.name == "huber":  # and at |f - y| = delta
        keep &= np.abs(np.abs(f - y) - PARAMS["huber"]["delta"]) > margin
    return keep


def test_every_built_in_scalar_loss_is_defined_once_in_the_compiled_module():
    assert set(REFERENCE) == {cls.name for cls in SCALAR_LOSSES}
    for cls in SCALAR_LOSSES:
        assert cls.compiled is not None and cls.compiled.__module__ == "prbmrm.kernels.scalar"
        assert "value" not in vars(cls) and "derivative" not in vars(cls)  # inherited: the compiled formulas
        assert make(cls).compiled_pass() is not None


@pytest.mark.parametrize("cls", SCALAR_LOSSES, **LOSS_IDS)
def test_compiled_value_and_derivative_are_the_formula(cls):
    loss = make(cls)
    f, y = scores_and_labels(loss)
    value, derivative = REFERENCE[loss.name]
    p = parameter(loss)
    np.testing.assert_allclose(loss.value(f, y), value(f, y, p), rtol=1e-13, atol=1e-13)
    keep = off_kinks(loss, f, y, 1e-9)
    np.testing.assert_allclose(loss.derivative(f, y)[keep], derivative(f, y, p)[keep], rtol=1e-13, atol=1e-13)
    # The kernel object of the class gives the same numbers as the class.
    assert loss.kernel().value(f, y).tobytes() == loss.value(f, y).tobytes()


@pytest.mark.parametrize("cls", SCALAR_LOSSES, **LOSS_IDS)
def test_derivative_matches_finite_differences_away_from_kinks(cls):
    loss = make(cls)
    f, y = scores_and_labels(loss, n=2000, seed=1)
    keep = off_kinks(loss, f, y, 1e-3)
    f, y, h = f[keep], y[keep], 1e-6
    numeric = (loss.value(f + h, y) - loss.value(f - h, y)) / (2 * h)
    np.testing.assert_allclose(loss.derivative(f, y), numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", SCALAR_LOSSES, **LOSS_IDS)
def test_values_follow_numpys_rules_for_non_finite_scores_and_shapes(cls):
    loss = make(cls)
    y = np.array([1.0, -1.0]) if loss.task != "regression" else np.array([1.0, 2.0])
    assert np.isnan(loss.value(np.array([np.nan, np.nan]), y)).all()  # a NaN score makes the risk NaN
    f2 = np.arange(6.0).reshape(3, 2) - 2.0
    assert loss.value(f2, y).shape == (3, 2)  # broadcast as numpy's expressions did
    np.testing.assert_array_equal(loss.derivative(f2, y)[1], loss.derivative(f2[1], y))


def data_for(loss, rows=700, features=41, seed=0):
    """Dense rows of density 1/2 and labels the loss accepts (signs, or counts for every regression loss)."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((rows, features)) < 0.5, rng.standard_normal((rows, features)), 0.0)
    if loss.task == "regression":
        y = rng.poisson(2.0, rows).astype(np.float64)
    else:
        y = np.where(rng.random(rows) < 0.5, 1.0, -1.0)
    return X, y, rng.standard_normal(features) * 0.4


def sparse_data_for(loss, rows=700, features=41, seed=0):
    X, y, w = data_for(loss, rows, features, seed)
    return sp.csr_matrix(np.where(np.random.default_rng(seed + 1).random(X.shape) < 0.3, X, 0.0)), y, w


def partials_at(oracle, w):
    """The oracle's per-block partial sums at w, as its observer sees them (before they are added)."""
    seen = []
    oracle.observer = lambda _, partials: seen.append(partials.copy())
    oracle(w)
    return seen[0]


def reference_sums(loss, X, y, w, a, b):
    """Risk and gradient sums of rows a:b by the numpy formulas and plain products."""
    value, derivative = REFERENCE[loss.name]
    f = X[a:b] @ w
    return value(f, y[a:b], parameter(loss)).sum(), X[a:b].T @ derivative(f, y[a:b], parameter(loss))


def check_sums(loss, X, y, w, partials, bounds):
    for partial, a, b in zip(partials, bounds[:-1], bounds[1:]):
        risk, gradient = reference_sums(loss, X, y, w, a, b)
        assert partial[-1] == pytest.approx(risk, rel=1e-12, abs=1e-13)
        np.testing.assert_allclose(partial[:-1], gradient, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(gradient).max()))


TWICE_DIFFERENTIABLE = {"squared_hinge", "squared_zero_hinge", "exponential", "logistic", "huber_hinge",
                        "least_squares", "huber", "poisson"}


def test_the_curvature_is_inherited_from_the_compiled_loss():
    assert {cls.name for cls in SCALAR_LOSSES if make(cls).twice_differentiable} == TWICE_DIFFERENTIABLE
    for cls in SCALAR_LOSSES:
        assert "curvature" not in vars(cls)
        if cls.name not in TWICE_DIFFERENTIABLE:
            with pytest.raises(NotImplementedError):
                make(cls).curvature(np.zeros(2), np.ones(2))
    # A loss registered from outside is twice differentiable when it defines its curvature.
    assert type("Curved", (BinaryLoss,), {"name": "curved", "curvature": lambda self, f, y: 0 * f})().twice_differentiable


@pytest.mark.parametrize("name", sorted(TWICE_DIFFERENTIABLE))
def test_newton_terms_are_value_derivative_and_curvature_bitwise(name):
    loss = make(LOSSES[name])
    f, y = scores_and_labels(loss, n=3000, seed=2)
    # the logistic's one exp for the three at its center (both zeros), far out and where exp underflows
    f[:6] = [0.0, -0.0, 40.0, -40.0, 750.0, -750.0]
    out = [np.full(f.size, np.nan) for _ in range(3)]
    loss.newton_terms(f, y, *out)
    for got, expected in zip(out, (loss.value(f, y), loss.derivative(f, y), loss.curvature(f, y))):
        assert got.tobytes() == expected.tobytes()
    with pytest.raises(ValueError):
        loss.newton_terms(f, y, out[0][:-1], out[1], out[2])


def test_newton_terms_of_a_loss_registered_from_outside_are_its_own_formulas():
    curved = type("Curved", (BinaryLoss,), {"name": "curved", "value": lambda self, f, y: (f - y) ** 2,
                                            "derivative": lambda self, f, y: 2 * (f - y),
                                            "curvature": lambda self, f, y: 2 + 0 * f})()
    f, y = np.linspace(-2.0, 2.0, 9), np.ones(9)
    out = [np.empty(9) for _ in range(3)]
    curved.newton_terms(f, y, *out)
    np.testing.assert_array_equal(np.stack(out), [(f - y) ** 2, 2 * (f - y), np.full(9, 2.0)])


def test_the_logistic_curvature_is_the_sigmoids_product():
    loss = make(LOSSES["logistic"])
    f = np.concatenate([np.linspace(-40.0, 40.0, 801), [-700.0, 700.0]])
    for y in (np.ones_like(f), -np.ones_like(f)):
        z = y * f
        np.testing.assert_allclose(loss.curvature(f, y), _sigmoid(z) * _sigmoid(-z), rtol=1e-14, atol=0)


def newton_data(layout, rows=700, features=41):
    X, y, w = (data_for if layout == "dense" else sparse_data_for)(SCALAR_LOSSES[0](), rows, features)
    rng = np.random.default_rng(3)
    slope, curvature = rng.standard_normal(rows), rng.random(rows)
    curvature[rng.random(rows) < 0.3] = 0.0  # rows without curvature (squared hinge) are skipped
    slope[curvature == 0.0] = np.where(rng.random(int(np.sum(curvature == 0.0))) < 0.5, 0.0, 1.5)
    columns = rng.standard_normal((3, rows))
    return X, slope, curvature, columns, rng.standard_normal(features)


def newton_sums(X, bounds, slope, curvature, columns, v):
    """The compiled Newton point sums and Hessian products of every block (one call each)."""
    bounds = np.asarray(bounds, dtype=np.intp)
    d = X.shape[1]
    point, product = np.empty((len(bounds) - 1, 2 * d + len(columns))), np.empty((len(bounds) - 1, d + 1))
    if sp.issparse(X):
        kernels.csr_newton_sums(X.indptr, X.indices, X.data, bounds, slope, curvature, columns, point)
        kernels.csr_hessian_sums(X.indptr, X.indices, X.data, bounds, curvature, v, product)
    else:
        kernels.dense_newton_sums(X, bounds, slope, curvature, columns, point)
        kernels.dense_hessian_sums(X, bounds, curvature, v, product)
    return point, product


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_newton_passes_equal_the_numpy_sums_per_block(layout):
    X, slope, curvature, columns, v = newton_data(layout)
    bounds = [0, 1, 1, 250, 700]
    point, product = newton_sums(X, bounds, slope, curvature, columns, v)
    A = X.toarray() if sp.issparse(X) else X
    d = A.shape[1]
    for b, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = A[start:stop]
        expected = np.concatenate([rows.T @ slope[start:stop], (rows ** 2).T @ curvature[start:stop],
                                   columns[:, start:stop].sum(axis=1)])
        np.testing.assert_allclose(point[b], expected, rtol=1e-12, atol=1e-12)
        hv = rows.T @ (curvature[start:stop] * (rows @ v))
        np.testing.assert_allclose(product[b, :d], hv, rtol=1e-12, atol=1e-12)
        assert product[b, d] == 0.0
    dense_scores = np.empty(A.shape[0])
    kernels.dense_matvec(np.ascontiguousarray(A), v, dense_scores)
    np.testing.assert_allclose(dense_scores, A @ v, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_newton_sums_of_a_block_do_not_depend_on_the_blocks_held_with_it(layout):
    X, slope, curvature, columns, v = newton_data(layout, rows=900)
    whole = newton_sums(X, [0, 300, 650, 900], slope, curvature, columns, v)
    part = slice(300, 650)
    alone = newton_sums(X[part], [0, 350], slope[part], curvature[part], np.ascontiguousarray(columns[:, part]), v)
    for together, by_itself in zip(whole, alone):
        assert together[1].tobytes() == by_itself[0].tobytes()


def test_the_newton_passes_refuse_arrays_they_cannot_read():
    X, slope, curvature, columns, v = newton_data("csr", rows=10)
    bounds = np.array([0, 10], dtype=np.intp)
    with pytest.raises(ValueError):
        kernels.csr_newton_sums(X.indptr, X.indices, X.data, bounds, slope[:9], curvature, columns,
                                np.empty((1, 2 * X.shape[1] + 3)))
    with pytest.raises(ValueError):
        kernels.csr_newton_sums(X.indptr, X.indices, X.data, bounds, slope, curvature, columns,
                                np.empty((1, 2 * X.shape[1] + 2)))
    with pytest.raises(ValueError):
        kernels.csr_hessian_sums(X.indptr[:-1], X.indices, X.data, bounds, curvature, v, np.empty((1, X.shape[1] + 1)))
    with pytest.raises(ValueError):
        kernels.dense_hessian_sums(X.toarray(), bounds, curvature, v[:-1], np.empty((1, X.shape[1] + 1)))


def gram_sums(X, bounds, curvature):
    """The compiled blocks' triangles of ``X_b^T D_b X_b`` (one call)."""
    bounds = np.asarray(bounds, dtype=np.intp)
    d = X.shape[1]
    partials = np.empty((len(bounds) - 1, d * (d + 1) // 2 + 1))
    if sp.issparse(X):
        kernels.csr_gram_sums(X.indptr, X.indices, X.data, bounds, curvature, partials)
    else:
        kernels.dense_gram_sums(X, bounds, curvature, partials)
    return partials


@pytest.mark.parametrize("layout", ["dense", "csr", "csr unsorted"])
def test_gram_sums_are_the_blocks_hessian_matrices(layout):
    """Each block's upper triangle (numpy.triu_indices order) of ``X_b^T D X_b``, a trailing 0, against numpy;
    a row's nonzeros in any order give the same matrix."""
    X, _, curvature, _, _ = newton_data(layout.split()[0])
    if layout == "csr unsorted":
        X = X.copy()
        for i in range(X.shape[0]):  # reverse each row's nonzeros
            row = slice(X.indptr[i], X.indptr[i + 1])
            X.indices[row], X.data[row] = X.indices[row][::-1].copy(), X.data[row][::-1].copy()
        assert not X.has_sorted_indices
    bounds = [0, 1, 1, 250, 700]
    partials = gram_sums(X, bounds, curvature)
    A = X.toarray() if sp.issparse(X) else X
    upper = np.triu_indices(A.shape[1])
    for b, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = A[start:stop]
        expected = rows.T @ (curvature[start:stop, None] * rows)
        np.testing.assert_allclose(partials[b, :-1], expected[upper], rtol=1e-12, atol=1e-12)
        assert partials[b, -1] == 0.0


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_gram_sums_of_a_block_do_not_depend_on_the_blocks_held_with_it(layout):
    X, _, curvature, _, _ = newton_data(layout, rows=900)
    whole = gram_sums(X, [0, 300, 650, 900], curvature)
    alone = gram_sums(X[300:650], [0, 350], curvature[300:650])
    assert whole[1].tobytes() == alone[0].tobytes()


def test_the_gram_sums_refuse_arrays_they_cannot_read():
    X, _, curvature, _, _ = newton_data("csr", rows=10)
    bounds = np.array([0, 10], dtype=np.intp)
    d = X.shape[1]
    for width in (d * (d + 1) // 2, d * (d + 1) // 2 + 2):  # not a triangle and its 0
        with pytest.raises(ValueError):
            kernels.csr_gram_sums(X.indptr, X.indices, X.data, bounds, curvature, np.empty((1, width)))
    with pytest.raises(ValueError):
        kernels.csr_gram_sums(X.indptr, X.indices, X.data, bounds, curvature[:9],
                              np.empty((1, d * (d + 1) // 2 + 1)))
    with pytest.raises(ValueError):
        kernels.dense_gram_sums(X.toarray()[:, 1:], bounds, curvature, np.empty((1, d * (d + 1) // 2 + 1)))


@pytest.fixture
def compiled(monkeypatch):
    """Take the compiled passes whatever the data's size."""
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", 0)
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", 0)


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("cls", SCALAR_LOSSES, **LOSS_IDS)
def test_compiled_passes_equal_the_numpy_sums_per_block(compiled, layout, cls):
    loss = make(cls)
    X, y, w = (data_for if layout == "dense" else sparse_data_for)(loss)
    bounds = np.array([0, 1, 1, 250, 700])
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    assert (oracle._dense if layout == "dense" else oracle._csr_compiled) is not None
    check_sums(loss, X, y, w, partials_at(oracle, w), bounds)


@pytest.mark.parametrize("cls", SCALAR_LOSSES, **LOSS_IDS)
def test_the_grouped_csr_pass_equals_the_numpy_sums(cls):
    loss = make(cls)
    X, y, w = sparse_data_for(loss)
    bounds = np.array([0, 300, 700])
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    assert oracle._csr_compiled is None and oracle._dense is None  # small data: the grouped pass
    check_sums(loss, X, y, w, partials_at(oracle, w), bounds)


def test_a_blocks_sums_do_not_depend_on_the_blocks_held_with_it(compiled):
    loss = SCALAR_LOSSES[0]()
    for data in (data_for, sparse_data_for):
        X, y, w = data(loss, rows=900)
        whole = partials_at(DistributedRisk(loss, X, y, len(y), SerialComm(), [0, 300, 650, 900]), w)
        alone = partials_at(DistributedRisk(loss, X[300:650], y[300:650], len(y), SerialComm()), w)
        np.testing.assert_array_equal(whole[1], alone[0])


def test_the_passes_are_taken_on_large_data_only(monkeypatch):
    loss = SCALAR_LOSSES[0]()
    X, y, w = data_for(loss)
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", X.size + 1)
    assert DistributedRisk(loss, X, y, len(y), SerialComm())._dense is None
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", X.size)
    assert DistributedRisk(loss, X, y, len(y), SerialComm())._dense is not None
    S, y, w = sparse_data_for(loss)
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", S.nnz + 1)
    assert DistributedRisk(loss, S, y, len(y), SerialComm())._csr_compiled is None
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", S.nnz)
    assert DistributedRisk(loss, S, y, len(y), SerialComm())._csr_compiled is not None
    # What the passes do not take keeps the numpy path: Fortran order, float32 labels, too many columns,
    # compact sums, and a subclass that redefines a formula.
    blocks = prbmrm.kernels.blocks
    assert blocks._dense_scalar(loss, np.asfortranarray(X), y, None) is None
    assert blocks._dense_scalar(loss, X, y.astype(np.float32), None) is None
    wide = S.copy()
    wide._shape = (S.shape[0], blocks.CSR_KERNEL_COLUMNS + 1)
    assert blocks._csr_compiled(loss, wide, y, None, False) is None
    assert blocks._csr_compiled(loss, S, y, None, True) is None
    changed = type("Changed", (type(loss),), {"value": lambda self, f, y: np.maximum(0.0, 2.0 - y * f)})()
    assert changed.compiled_pass() is None and blocks._csr_compiled(changed, S, y, None, False) is None
    assert blocks._dense_scalar(changed, X, y, None) is None
    assert blocks._csr_compiled(type("Same", (type(loss),), {})(), S, y, None, False) is not None


def test_non_finite_scores_make_the_risk_non_finite(compiled):
    losses = {cls.name: cls for cls in SCALAR_LOSSES}
    X, y, w = data_for(losses["exponential"]())
    assert not np.isfinite(DistributedRisk(losses["exponential"](), X, y, len(y), SerialComm())(w * 1e4)[0])
    w[0] = np.nan
    for data in (data_for, sparse_data_for):
        X, y, _ = data(losses["hinge"]())
        oracle = DistributedRisk(losses["hinge"](), X, y, len(y), SerialComm())
        assert np.isnan(partials_at(oracle, w)[0, -1])


def test_the_compiled_passes_refuse_arrays_they_cannot_read():
    kernel = SCALAR_LOSSES[0]().kernel()
    X, y, w = data_for(SCALAR_LOSSES[0](), rows=10, features=3)
    partials, bounds = np.zeros((1, 4)), np.array([0, 10], dtype=np.intp)
    with pytest.raises(ValueError):
        kernel.dense_pass(X, y, w[:2], bounds, partials)
    with pytest.raises(ValueError):
        kernel.dense_pass(X, y, w, np.array([0, 11], dtype=np.intp), partials)
    with pytest.raises(ValueError):
        kernel.dense_pass(X, y, w, np.array([5, 2], dtype=np.intp), partials)
    with pytest.raises(ValueError):
        kernel.dense_pass(np.asfortranarray(X), y, w, bounds, partials)
    S = sp.csr_matrix(X)
    with pytest.raises(ValueError):
        kernel.csr_update(S.indptr[:-1], S.indices, S.data, X @ w, y, bounds, partials)


class NumpyLogistic(BinaryLoss):
    """The logistic loss written in numpy, as a user would register it: it takes the numpy path."""

    name = "numpy_logistic_outside"

    def value(self, f, y):
        return np.logaddexp(0.0, -y * f)

    def derivative(self, f, y):
        return -y / (1.0 + np.exp(y * f))


@pytest.fixture
def numpy_logistic():
    register_loss(NumpyLogistic)
    yield NumpyLogistic.name
    del LOSSES[NumpyLogistic.name]


def test_a_loss_registered_from_outside_takes_the_numpy_path_and_trains_as_the_built_in_one(
        compiled, numpy_logistic):
    from prbmrm.training import load_demo, run

    loss = NumpyLogistic()
    assert isinstance(loss, ScalarLoss) and loss.compiled is None and loss.compiled_pass() is None
    X, y = load_demo()
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm())
    assert oracle._csr_compiled is None and oracle._dense is None  # even where the compiled passes would run
    options = dict(lam=1e-2, rel_epsilon=0.0, epsilon=1e-9, solver="bmrm")
    outside, _, trained = run(None, loss=numpy_logistic, **options)
    built_in, _, _ = run(None, loss="logistic", **options)
    assert isinstance(trained, NumpyLogistic) and outside.success and built_in.success
    # Both runs certify a gap within epsilon of the same optimum; their paths may differ in the last bits
    # (numpy's exp against libm's), so their objectives agree within epsilon, and their brackets overlap.
    assert abs(outside.fun - built_in.fun) <= options["epsilon"]
    assert outside.lower_bound <= built_in.fun + 1e-12 and built_in.lower_bound <= outside.fun + 1e-12
    np.testing.assert_allclose(outside.w, built_in.w, atol=1e-4)


@pytest.mark.distributed
@pytest.mark.parametrize("held", ["dense", "csr"])
def test_ranks_agree_with_one_rank_bitwise(compiled, held, comm, mpi_tmp_path):
    # The compiled passes on any number of ranks: hinge on dense rows, logistic (l' through exp) on CSR rows.
    dense = held == "dense"
    loss = {cls.name: cls for cls in SCALAR_LOSSES}["hinge" if dense else "logistic"]()
    X, y, _ = (data_for if dense else sparse_data_for)(loss, rows=1000)
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 2)
    local = load_local(directory, comm, dense=dense or None)
    oracle = DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks)
    points = np.random.default_rng(1).normal(size=(3, X.shape[1])) * 0.3
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points])
    if comm.is_root:
        whole = load_local(directory, SerialComm(), dense=dense or None)
        serial = DistributedRisk(loss, whole.X, whole.y, len(y), SerialComm(), whole.blocks)
        compiled_pass = (lambda risk: risk._dense) if dense else (lambda risk: risk._csr_compiled)
        assert compiled_pass(oracle) is not None and compiled_pass(serial) is not None
        for w, (risk, gradient) in zip(points, values):
            expected = serial(w)
            assert risk == expected[0]
            np.testing.assert_array_equal(gradient, expected[1])
