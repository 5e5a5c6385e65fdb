"""Bounded memory (paper 000, Sec. 3.1 and Alg. 4): plane aggregation keeps the optimum."""

import json

import numpy as np
import pytest

from helpers import check_run_against_serial, load_svmlight
from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.regularizers.qp import solve_simplex_qp, solve_two_plane_qp
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import Bundle
from helpers import cvxpy_optimum
from test_bmrm import train


def random_bundle(rng, t, d, metric=None):
    bundle = Bundle(d, metric)
    for _ in range(t):
        bundle.add(rng.normal(size=d), rng.normal())
    return bundle


def dual_value(bundle, alpha, lam):
    return float(bundle.b @ alpha - alpha @ bundle.gram @ alpha / (2 * lam))


def test_two_plane_closed_form_equals_the_simplex_qp():
    rng = np.random.default_rng(0)
    interior = 0
    for trial in range(300):
        A = rng.normal(size=(2, 4)) * rng.choice([1e-3, 1.0, 1e3])
        if trial % 10 == 0:
            A[1] = A[0]  # identical subgradients: the objective is linear in eta
        lam = 10.0 ** rng.uniform(-4, 1)
        Q, b = A @ A.T / lam, rng.normal(size=2) * rng.choice([1e-2, 1.0, 1e2])
        closed, reference = solve_two_plane_qp(Q, b), solve_simplex_qp(Q, b)
        assert closed.x.min() >= 0 and closed.x.sum() == pytest.approx(1.0, abs=1e-15)
        scale = np.abs(b).max() + np.abs(Q).max()
        assert closed.value == pytest.approx(reference.value, abs=1e-12 * scale)
        np.testing.assert_allclose(closed.x, reference.x, atol=1e-8)
        interior += 0.0 < closed.x[0] < 1.0
    assert interior > 50  # the unclipped case is well covered, not only the vertices


@pytest.mark.parametrize("keep", [0, 1, 4, 10])
@pytest.mark.parametrize("with_metric", [False, True])
def test_aggregation_preserves_the_dual_optimum(keep, with_metric):
    rng = np.random.default_rng(keep)
    d, t, lam = 6, 14, 0.3
    M = None
    if with_metric:
        B = rng.normal(size=(d, d))
        M = B @ B.T + np.eye(d)
    for _ in range(5):
        bundle = random_bundle(rng, t, d, None if M is None else (lambda a: M @ a))
        qp = solve_simplex_qp(bundle.gram / lam, bundle.b)
        alpha = bundle.aggregate_oldest(qp.x, keep)
        assert bundle.size == keep + 1 and alpha.sum() == pytest.approx(1.0, abs=1e-14)
        # The Gram matrix follows without recomputation, and is exact.
        metric = np.eye(d) if M is None else M
        np.testing.assert_allclose(bundle.gram, bundle.A @ metric @ bundle.A.T, rtol=1e-10, atol=1e-12)
        # The same dual value at the carried multipliers, and the same optimum.
        assert dual_value(bundle, alpha, lam) == pytest.approx(qp.value, rel=1e-12, abs=1e-12)
        again = solve_simplex_qp(bundle.gram / lam, bundle.b)
        assert again.value == pytest.approx(qp.value, rel=1e-10, abs=1e-12)


def test_aggregating_planes_with_zero_multipliers_drops_them():
    rng = np.random.default_rng(7)
    bundle = random_bundle(rng, 8, 5)
    bundle.b[:5] -= 100.0  # the oldest planes lie far below the others
    qp = solve_simplex_qp(bundle.gram, bundle.b)
    assert np.all(qp.x[:5] == 0.0)
    newest = bundle.A[5:].copy()
    alpha = bundle.aggregate_oldest(qp.x, 3)
    assert bundle.size == 3 and np.array_equal(bundle.A, newest)
    np.testing.assert_array_equal(alpha, qp.x[5:])


class CapacitySpy(Bundle):
    """A Bundle that asserts, after every change, that its storage never exceeds max_size rows."""

    largest = 0

    def add(self, a, b, point=None):
        super().add(a, b, point)
        self.check()

    def aggregate_oldest(self, alpha, keep):
        alpha = super().aggregate_oldest(alpha, keep)
        self.check()
        return alpha

    def check(self):
        rows = max(self._A.shape[0], self._b.shape[0], *self._gram.shape, self._idle.shape[0])
        assert rows <= self.max_size
        CapacitySpy.largest = max(CapacitySpy.largest, rows)


@pytest.fixture(scope="module")
def a9a_sample():
    X, y = load_svmlight("a9a.xz")
    X, y = X[:1500], y[:1500]
    return X, y, cvxpy_optimum(X, y, "hinge", 1e-3)


@pytest.mark.parametrize("solver", ["bmrm", "proximal"])
@pytest.mark.parametrize("k", [2, 10, 0])
def test_bounded_bundle_reaches_the_optimum(a9a_sample, monkeypatch, solver, k):
    X, y, reference = a9a_sample
    if k:
        CapacitySpy.largest = 0
        # BMRM's bundle lives in the shared CuttingPlaneModel; the proximal method holds its own.
        monkeypatch.setattr(f"prbmrm.solvers.{'base' if solver == 'bmrm' else solver}.Bundle", CapacitySpy)
    eps = 1e-4
    result = train(X, y, "hinge", 1e-3, method=solver, epsilon=eps, rel_epsilon=0, bundle_size=k)
    assert result.success and result.gap <= eps
    assert abs(result.fun - reference) <= eps + 1e-7 * reference
    assert np.all(result.history["lower_bound"] <= reference + 1e-7 * reference)
    if k:
        assert CapacitySpy.largest == k and result.history["planes"].max() == k


def test_a_bundle_size_keeps_loose_subproblems_until_it_first_aggregates(a9a_sample):
    # Before the bundle is full a bounded run is the unlimited one, loose QPs included (BMRM 2.1's
    # rule): bitwise the same rows; from the first aggregation on exact QPs, every bound still valid.
    X, y, reference = a9a_sample
    k = 12
    bounded = train(X, y, "hinge", 1e-3, epsilon=1e-4, rel_epsilon=0, bundle_size=k)
    free = train(X, y, "hinge", 1e-3, epsilon=1e-4, rel_epsilon=0, max_iter=k)
    exact = train(X, y, "hinge", 1e-3, epsilon=1e-4, rel_epsilon=0, max_iter=k, inexact=0)
    first = int(np.argmax(bounded.history["planes"] == k))  # the row after which the bundle is full
    assert 3 <= first < k
    for name in ("objective", "lower_bound", "planes"):
        np.testing.assert_array_equal(bounded.history[name][:first + 1], free.history[name][:first + 1])
    assert not np.array_equal(free.history["lower_bound"][:first + 1], exact.history["lower_bound"][:first + 1])
    assert bounded.success and abs(bounded.fun - reference) <= 1e-4 + 1e-7 * reference
    assert np.all(bounded.history["lower_bound"] <= reference + 1e-7 * reference)


def test_bundle_size_2_gives_algorithm_4():
    """Alg. 4 run by hand: w_t = (1 - eta) w_{t-1} - eta a_t / lam with eta of eq. 14."""
    X, y = load_svmlight("a9a.xz")
    X, y, lam = X[:500], y[:500], 1e-2
    seen = []
    result = train(X, y, "hinge", lam, bundle_size=2, idle_age=0, rel_epsilon=0, max_iter=30,
                   callback=lambda row: seen.append(row.objective))
    risk = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    r, a = risk(np.zeros(X.shape[1]))
    w, b_hat, objectives = -a / lam, r, [r]
    for _ in range(29):
        r, a = risk(w)
        objectives.append(0.5 * lam * w @ w + r)
        b = r - a @ w
        eta = (b - b_hat + w @ a + lam * w @ w) / ((a + lam * w) @ (a + lam * w) / lam)
        eta = min(max(eta, 0.0), 1.0)
        w, b_hat = (1 - eta) * w - eta * a / lam, (1 - eta) * b_hat + eta * b
    np.testing.assert_allclose(seen, objectives, rtol=1e-9)
    # The lower bound J_t(w_t) is b_hat - lam/2 |w_t|^2 (Alg. 4, line 11, prints
    # the sign of the |w_t|^2 term the other way round).
    lower = b_hat - 0.5 * lam * w @ w
    assert result.history["lower_bound"][-1] == pytest.approx(lower, rel=1e-9)


def test_cli_records_the_bundle_size(tmp_path):
    from prbmrm.model import load_model
    from prbmrm.cli.train import main

    out = str(tmp_path / "m.h5")
    argv = ["--bundle-size", "3", "--lam", "1e-2", "--max-iter", "60", "--quiet", "--out", out]
    assert main(argv, SerialComm()) == 0
    model = load_model(out)
    assert json.loads(model.attrs["options"])["bundle_size"] == 3
    assert model.history["planes"].max() <= 3


@pytest.mark.distributed
@pytest.mark.parametrize("k", [2, 10])
def test_bounded_bundle_run_equals_serial_run(comm, mpi_tmp_path, k):
    check_run_against_serial(comm, mpi_tmp_path, "hinge", 1e-3, rows=3000, bundle_size=k, epsilon=0,
                             rel_epsilon=1e-3, max_iter=400)
