"""TRON: the losses' curvature and the Hessian products against finite differences, its certified gap
against cvxpy, and its run on 1, 2 and 3 ranks bitwise against one process."""

import io
import itertools
import lzma

import cvxpy as cp
import numpy as np
import pytest

from helpers import data_path, load_svmlight, printed_by_fresh_python, shared_shards
from prbmrm.solvers import minimize  # first: the base commit's prbmrm.regularizers alone imports circularly
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.errors import UsageError
from prbmrm.io import load_local
from prbmrm.losses import get_loss
from prbmrm.regularizers import get_regularizer
from prbmrm.solvers import tron
from prbmrm.solvers.tron import NewtonRanks

SMOOTH = ["logistic", "squared_hinge", "least_squares", "huber", "huber_hinge", "exponential",
          "squared_zero_hinge", "poisson"]


def planted(loss, m=300, d=12, seed=0):
    """Dense rows and labels that suit `loss` (+-1, real targets or counts)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, d)) / np.sqrt(d)
    f = X @ rng.normal(size=d)
    if loss in ("least_squares", "huber"):
        y = f + 0.3 * rng.normal(size=m)
    elif loss == "poisson":
        y = rng.poisson(np.exp(0.5 * f)).astype(np.float64)
    else:
        y = np.where(f + 0.3 * rng.normal(size=m) > 0, 1.0, -1.0)
    return X, y


def oracle_of(loss, X, y):
    loss = get_loss(loss)
    kind = "binary" if set(np.unique(y)) <= {-1.0, 1.0} else "integer" if np.all(y == np.round(y)) else "real"
    loss.prepare(np.unique(y), kind)
    return DistributedRisk(loss, X, y, len(y), SerialComm())


@pytest.mark.parametrize("name", SMOOTH)
def test_curvature_is_the_derivatives_finite_difference(name):
    loss = get_loss(name)
    rng = np.random.default_rng(1)
    f = rng.normal(size=400) * 2
    y = (rng.poisson(2.0, size=400).astype(float) if name == "poisson" else
         rng.normal(size=400) if name in ("least_squares", "huber") else rng.choice([-1.0, 1.0], size=400))
    h = 1e-6
    numeric = (loss.derivative(f + h, y) - loss.derivative(f - h, y)) / (2 * h)
    # Away from the kinks of l' (squared hinge, Huber), where the generalized l'' takes one side.
    smooth = np.ones_like(f, dtype=bool)
    for kink in {"squared_hinge": [1.0], "squared_zero_hinge": [0.0], "huber": [],
                 "huber_hinge": [0.5, 1.5]}.get(name, []):
        smooth &= np.abs(y * f - kink) > 1e-3
    if name == "huber":
        smooth &= np.abs(np.abs(f - y) - loss.delta) > 1e-3
    np.testing.assert_allclose(loss.curvature(f, y)[smooth], numeric[smooth], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["logistic", "least_squares", "exponential"])
def test_hessian_product_is_the_gradients_finite_difference(name):
    X, y = planted(name)
    oracle = oracle_of(name, X, y)
    ranks = oracle.attach(NewtonRanks)
    rng = np.random.default_rng(2)
    w, v = 0.3 * rng.normal(size=X.shape[1]), rng.normal(size=X.shape[1])

    def gradient(point):
        ranks.buffer[:] = point
        return ranks.handle(0)[1].copy()

    h = 1e-6
    numeric = (gradient(w + h * v) - gradient(w - h * v)) / (2 * h)
    ranks.buffer[:] = w
    r, a, diagonal, r_target, _ = ranks.handle(0)
    assert r == r_target
    assert r == pytest.approx(np.mean(get_loss(name).value(X @ w, y)), rel=1e-12)
    ranks.buffer[:] = v
    np.testing.assert_allclose(ranks.handle(1), numeric, rtol=1e-5, atol=1e-8)
    # The diagonal of (1/m) X^T D X, column by column.
    for j in range(X.shape[1]):
        ranks.buffer[:] = np.eye(X.shape[1])[j]
        assert diagonal[j] == pytest.approx(ranks.handle(1)[j], rel=1e-10)


def cvxpy_optimum(loss, X, y, lam, B=None):
    w = cp.Variable(X.shape[1])
    f = X @ w
    m = len(y)
    risk = {"logistic": cp.sum(cp.logistic(-cp.multiply(y, f))),
            "squared_hinge": 0.5 * cp.sum_squares(cp.pos(1 - cp.multiply(y, f))),
            "least_squares": 0.5 * cp.sum_squares(f - y),
            "huber": 0.5 * cp.sum(cp.huber(f - y, 1.0))}[loss]
    omega = 0.5 * (cp.sum_squares(w) if B is None else cp.sum(cp.multiply(B, cp.square(w))))
    problem = cp.Problem(cp.Minimize(lam * omega + risk / m))
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return problem.value


@pytest.mark.parametrize("matrix_dim", [0, tron.MATRIX_DIM])  # Hessian products; the Hessian as a matrix
@pytest.mark.parametrize("lam", [1e-1, 1e-3, 1e-5])
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "least_squares", "huber"])
def test_gap_brackets_the_cvxpy_optimum(loss, lam, matrix_dim):
    X, y = planted(loss)
    result = minimize(oracle_of(loss, X, y), np.zeros(X.shape[1]), lam, method="tron", epsilon=1e-9,
                      rel_epsilon=0, matrix_dim=matrix_dim)
    optimum = cvxpy_optimum(loss, X, y, lam)
    assert result.success and result.gap <= 1e-9
    tolerance = 1e-8 * max(1.0, abs(optimum))
    assert np.all(result.history["lower_bound"] <= optimum + tolerance)
    assert result.fun >= optimum - tolerance
    assert result.fun <= optimum + 1e-9 + tolerance


def test_gap_with_a_diagonal_quadratic_regularizer():
    X, y = planted("logistic", d=8)
    B = np.linspace(0.5, 3.0, X.shape[1])
    lam = 1e-2
    reg = get_regularizer("quadratic", B=B)
    oracle = oracle_of("logistic", X, y)
    reg.prepare(oracle.dim, 0.0)
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method="tron", reg=reg, epsilon=1e-9, rel_epsilon=0)
    optimum = cvxpy_optimum("logistic", X, y, lam, B)
    assert result.success
    assert np.all(result.history["lower_bound"] <= optimum + 1e-8)
    assert result.fun == pytest.approx(optimum, abs=2e-9)


def test_tron_agrees_with_bmrm_on_a9a():
    X, y = load_svmlight("a9a.xz")
    X, y = X[:4000], y[:4000]
    lam = 1e-4
    tron = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), lam, method="tron", epsilon=1e-7,
                    rel_epsilon=0)
    bmrm = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), lam, method="bmrm", epsilon=1e-7,
                    rel_epsilon=0)
    assert tron.success and bmrm.success
    assert tron.lower_bound <= bmrm.fun + 1e-15 and bmrm.lower_bound <= tron.fun + 1e-15
    assert tron.fun == pytest.approx(bmrm.fun, abs=2e-7)


@pytest.mark.parametrize("loss, reg", [("least_absolute_deviation", "l2"), ("logistic", "l1")])
def test_refuses_what_newton_cannot_do(loss, reg):
    X, y = planted("least_squares" if loss == "least_absolute_deviation" else "logistic")
    oracle = oracle_of(loss, X, y)
    with pytest.raises(UsageError, match="TRON needs"):
        minimize(oracle, np.zeros(X.shape[1]), 1e-3, method="tron", reg=reg)


def test_max_iter_is_reported():
    X, y = planted("logistic")
    result = minimize(oracle_of("logistic", X, y), np.zeros(X.shape[1]), 1e-6, method="tron", epsilon=1e-14,
                      rel_epsilon=0, max_iter=2)
    assert result.nit == 2 and result.status == 2 and not result.success


@pytest.mark.distributed
@pytest.mark.parametrize("loss, lam, epsilon, matrix_dim", [
    ("logistic", 1e-5, 1e-8, -1), ("logistic", 1e-5, 1e-8, tron.MATRIX_DIM), ("squared_hinge", 1e-5, 1e-8, -1),
    ("hinge", 1e-3, 1e-5, 0), ("hinge", 1e-4, 1e-5, -1)])
def test_ranks_give_bitwise_the_run_of_one_process(comm, mpi_tmp_path, loss, lam, epsilon, matrix_dim):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:3000], y[:3000]
    directory = shared_shards(comm, mpi_tmp_path / "tron", X, y, parts=comm.size + 1)

    def run(communicator):
        local = load_local(directory, communicator, bias=True)
        oracle = DistributedRisk(get_loss(loss), local.X, local.y, local.n_examples_total, communicator,
                                 local.blocks)
        return run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), lam, method="tron",
                                                             epsilon=epsilon, rel_epsilon=0, matrix_dim=matrix_dim))

    result = run(comm)
    if comm.is_root:
        expected = run(SerialComm())
        assert result.success and result.nit == expected.nit
        assert np.array_equal(result.w, expected.w)
        for column in ("objective", "lower_bound", "gap"):
            assert np.array_equal(result.history[column], expected.history[column]), column


def cvxpy_hinge_optimum(X, y, lam):
    w = cp.Variable(X.shape[1])
    risk = cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + risk))
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return problem.value


@pytest.mark.parametrize("matrix_dim", [0, -1])  # Hessian products; the default, the Hessian as a matrix
@pytest.mark.parametrize("lam", [1e-1, 1e-3, 1e-5])
def test_smoothed_hinge_certifies_the_hinge_problem(lam, matrix_dim):
    X, y = planted("logistic", m=400)
    oracle = oracle_of("hinge", X, y)
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method="tron", epsilon=1e-6, rel_epsilon=0,
                      matrix_dim=matrix_dim)
    optimum = cvxpy_hinge_optimum(X, y, lam)
    assert result.success and result.gap <= 1e-6
    # The rows report the hinge objective itself, and every bound lies below the hinge optimum.
    hinge = np.mean(np.maximum(0, 1 - y * (X @ result.w))) + 0.5 * lam * result.w @ result.w
    assert result.fun == pytest.approx(hinge, rel=1e-12)
    assert np.all(result.history["lower_bound"] <= optimum + 1e-9)
    assert optimum - 1e-9 <= result.fun <= optimum + 1e-6 + 1e-9


def test_a_rejected_steps_re_solve_replays_its_products_bitwise(monkeypatch):
    """After a rejected step the conjugate gradients start again from the same g, M and H: the products of
    the directions met before are not requested again, and the run is bitwise the one that requests them."""
    from sklearn.datasets import load_svmlight_file

    with lzma.open(data_path("kddcup99_10pct.binary.xz")) as f:  # its first rows: the trust region rejects steps
        X, y = load_svmlight_file(io.BytesIO(b"".join(itertools.islice(f, 2000))))
    X, y = X.tocsr(), np.where(y > 0, 1.0, -1.0)

    def run():
        oracle = oracle_of("logistic", X, y)
        codes, request = [], oracle.request
        oracle.request = lambda code: (codes.append(code), request(code))[1]
        result = minimize(oracle, np.zeros(X.shape[1]), 1e-5, method="tron", epsilon=1e-6, rel_epsilon=0)
        return result, sum(code in (1, 2) for code in codes)

    replayed, fewer = run()
    monkeypatch.setattr(tron._Newton, "restart", lambda self: self.__dict__.update(_path=[], _replayed=0))
    requested, products = run()
    assert replayed.success and fewer < products
    assert replayed.w.tobytes() == requested.w.tobytes()
    for column in ("objective", "lower_bound"):
        assert replayed.history[column].tobytes() == requested.history[column].tobytes()


def test_after_a_rejected_step_a_new_smoothing_takes_its_own_curvature():
    """A new smoothing re-evaluates the current point: the products after it are those of a run that starts
    there under that smoothing, whether the step before was accepted or rejected."""
    X, y = load_svmlight("a9a.xz")
    X, y = X[:1000], y[:1000]
    w, v = np.full(X.shape[1], 0.05), np.linspace(-1.0, 1.0, X.shape[1])
    l2 = get_regularizer("l2")

    def newton(delta):
        return tron._Newton(oracle_of("hinge", X, y), 1e-3, l2, delta, precondition=0.01)

    fresh = newton(0.05)
    fresh.point(w)
    expected = fresh.hessian(v)
    stepped = newton(0.5)
    stepped.point(w)
    stepped.point(w + v)  # a trial step ...
    stepped.step(False)   # ... rejected
    stepped.smooth(0.05)
    stepped.point(w)
    assert stepped.hessian(v).tobytes() == expected.tobytes()


def test_the_hessian_matrix_gives_the_hessian_products():
    """The Hessian formed as a matrix (one pass, the blocks' triangles summed exactly) times v is the product of
    a pass at the same point, for a twice differentiable loss and the hinge's smoothing."""
    X, y = load_svmlight("a9a.xz")
    X, y = X[:1500], y[:1500]
    w, v = np.linspace(-0.2, 0.3, X.shape[1]), np.linspace(-1.0, 1.0, X.shape[1])
    l2 = get_regularizer("l2")
    for loss, delta in (("logistic", 0.0), ("hinge", 0.3)):
        products, matrix = (tron._Newton(oracle_of(loss, X, y), 1e-3, l2, delta, 0.0, matrix=m) for m in (False, True))
        for newton in (products, matrix):
            M = newton.point(w)[2]
        H = matrix.metric(M).H
        np.testing.assert_array_equal(H, H.T)
        np.testing.assert_allclose(H @ v, products.hessian(v), rtol=1e-12, atol=1e-12 * np.abs(H).max())
        assert matrix.hessian(v).tobytes() == (H @ v).tobytes() and matrix.products == 0


def test_the_matrix_is_formed_only_where_its_blocks_triangles_fit(monkeypatch):
    X, y = planted("logistic", d=12)
    oracle = oracle_of("hinge", X, y)
    assert tron.matrix_fits(oracle) and not tron.matrix_fits(oracle, matrix_dim=11)
    per_block = 12 * 13 // 2 + 1
    monkeypatch.setattr(tron, "MATRIX_ENTRIES", oracle.n_parts * per_block)
    assert tron.matrix_fits(oracle)
    monkeypatch.setattr(tron, "MATRIX_ENTRIES", oracle.n_parts * per_block - 1)
    assert not tron.matrix_fits(oracle)
    codes, request = [], oracle.request
    oracle.request = lambda code: (codes.append(code), request(code))[1]
    result = minimize(oracle, np.zeros(X.shape[1]), 1e-3, method="tron", epsilon=1e-6, rel_epsilon=0)
    assert result.success and tron._MATRIX not in codes and tron._HESSIAN_NEW in codes  # products, no matrix


def test_the_hessian_matrix_certifies_the_hinge_on_columns_of_far_apart_scales():
    """Columns scaled over 1e8, as kddcup99's raw counts are: TRON with the Hessian as a matrix (the default for
    the hinge on few weights) certifies the gap, whose bounds lie below cvxpy's optimum."""
    X, y = planted("logistic", m=400, d=8, seed=3)
    X = X * np.logspace(-4, 4, X.shape[1])
    lam = 1e-5
    result = minimize(oracle_of("hinge", X, y), np.zeros(X.shape[1]), lam, method="tron", epsilon=1e-6,
                      rel_epsilon=0, max_iter=2000)
    optimum = cvxpy_hinge_optimum(X, y, lam)
    assert result.success and result.gap <= 1e-6
    assert np.all(result.history["lower_bound"] <= optimum + 1e-9)
    assert optimum - 1e-9 <= result.fun <= optimum + 1e-6 + 1e-9


class DenseProducts:
    """The Hessian products of a dense H, counted, for the conjugate gradients alone."""

    def __init__(self, H):
        self.H, self.products = H, 0

    def restart(self):
        pass

    def hessian(self, v):
        self.products += 1
        return self.H @ v


def test_conjugate_gradients_find_a_step_of_small_residual_before_their_own_residual_is_small():
    """With `enough`, the step returned has ``-g - H s`` as its residual, of plain norm at most `enough`, inside
    the region with the model decreasing; on a Hessian of unevenly scaled columns (LIBLINEAR's preconditioner
    spans 1 to 4e3) the smoothing of the CG steps finds it in fewer products than a plain preconditioned CG's
    own residual gets there (written out here)."""
    rng = np.random.default_rng(4)
    m, d, lam = 400, 60, 1e-4
    X = rng.normal(size=(m, d)) * rng.lognormal(0, 1.5, d)
    H = X.T @ (rng.uniform(0, 0.25, m)[:, None] * X) / m + lam * np.eye(d)
    g = 1e-3 * rng.normal(size=d)
    M = 0.99 + 0.01 * np.diag(H) / lam
    enough = 0.1 * np.linalg.norm(g)

    s, r, z = np.zeros(d), -g, -g / M
    p, plain = z.copy(), 0
    while np.linalg.norm(r) > enough:
        Hp = H @ p
        plain += 1
        alpha = (z @ r) / (p @ Hp)
        s, r_new = s + alpha * p, r - alpha * Hp
        z_new = r_new / M
        p = z_new + (z_new @ r_new) / (z @ r) * p
        r, z = r_new, z_new

    newton = DenseProducts(H)
    step, residual, on_boundary = tron._conjugate_gradient(newton, g, tron._Diagonal(M), 1e9, 1e-12, 1000, enough)
    assert np.linalg.norm(residual) <= enough and not on_boundary
    np.testing.assert_allclose(residual, -g - H @ step, rtol=0, atol=1e-9 * np.linalg.norm(g))
    assert g @ step + step @ H @ step / 2 < 0
    assert newton.products < plain  # 14 against 21


def test_scipy_linalg_is_imported_only_where_a_hessian_is_factored():
    """The command's modules (every rank imports them) leave scipy.linalg out; rank 0 imports it when TRON
    first factors a Hessian, and the factor solves the Newton system."""
    code = ("import sys, numpy as np, prbmrm.cli.train, prbmrm.solvers.tron as tron; "
            "print('scipy.linalg' in sys.modules); H = np.array([[4.0, 1.0], [1.0, 3.0]]); "
            "z = tron._Factored(H).solve(np.array([1.0, 2.0])); "
            "print('scipy.linalg' in sys.modules, bool(np.allclose(H @ z, [1.0, 2.0])))")
    printed, errors = printed_by_fresh_python(code)
    assert printed == ["False", "True", "True"], errors
