"""Pragam (paper 001, Alg. 1) and its projection against independent references.

- the projection onto {0 <= alpha <= u, sum y alpha = 0} (and the box alone) equals cvxpy's
  and the sort-based serial kernel, on random and degenerate instances (hypothesis);
- pragam and pragam_b reach cvxpy's optimum of the hinge SVM primal (with the offset
  unregularized for pragam_b) on 1000 rows of a9a within 1e-3 relative, with every reported
  lower bound below the optimum and objectives equal to J written out here and to the risk
  oracle's;
- (marker ``distributed``, also run on 2 and 3 ranks) bitwise the same multipliers, iterates and
  objectives on any number of ranks, and an error on one rank stops every rank;
- the command line trains with both solvers on 2 ranks.
"""

import os
import subprocess
import sys

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import REPO, load_svmlight, run_ranks, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local
from prbmrm.solvers.dual import DistributedProjection, project_box_equality
from prbmrm.errors import CollectiveError, UsageError
from prbmrm.losses import get_loss
from prbmrm.model import load_model
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.solvers import minimize


def cvxpy_projection(v, y, upper, equality):
    """The projection by cvxpy/Clarabel, solved in units of `upper` to tight tolerances."""
    s = cp.Variable(len(v))
    constraints = [s >= 0, s <= 1] + ([y @ s == 0] if equality else [])
    cp.Problem(cp.Minimize(cp.sum_squares(s - v / upper)), constraints).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return upper * s.value


def distributed_projection(v, y, upper, blocks, guess=0.0, equality=True):
    """The distributed projection on one process, with `blocks` canonical blocks."""
    bounds = np.linspace(0, len(v), blocks + 1).astype(int)
    project = DistributedProjection(y, bounds, blocks, SerialComm(), upper, equality=equality)
    return project(v, guess=guess)


@pytest.mark.parametrize("equality", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_projection_equals_cvxpy(seed, equality):
    rng = np.random.default_rng(seed)
    n = 40 + 10 * seed
    y = rng.choice([-1.0, 1.0], n)
    upper = 1.0 / n
    v = rng.normal(scale=[0.3, 1.0, 3.0, 10.0][seed] * upper, size=n)
    expected = cvxpy_projection(v, y, upper, equality)
    alpha, _ = distributed_projection(v, y, upper, blocks=3, equality=equality)
    np.testing.assert_allclose(alpha, expected, rtol=0, atol=1e-8 * upper)
    if equality:
        np.testing.assert_allclose(project_box_equality(v, y, upper)[0], expected, rtol=0,
                                   atol=1e-8 * upper)


@st.composite
def instances(draw):
    """(v, y, upper, blocks, guess): random, duplicated, constant, one-class and badly scaled v."""
    n = draw(st.integers(1, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["random", "duplicates", "constant", "one class"]))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3, 1e8]))
    upper = 1.0 / n
    y = np.ones(n) * draw(st.sampled_from([-1.0, 1.0])) if kind == "one class" else rng.choice([-1.0, 1.0], n)
    v = rng.normal(size=n) * scale * upper
    if kind == "duplicates":
        v = np.round(v / (scale * upper) * 2) * scale * upper / 2
    elif kind == "constant":
        v = np.full(n, v[0])
    blocks = draw(st.integers(1, min(n, 5)))
    guess = draw(st.sampled_from([0.0, 1.0, -1.0])) * scale * upper
    return v, y, upper, blocks, guess


@settings(max_examples=300, deadline=None)
@given(instances())
def test_projection_equals_the_sort_based_kernel(instance):
    v, y, upper, blocks, guess = instance
    expected, _ = project_box_equality(v, y, upper)
    alpha, nu = distributed_projection(v, y, upper, blocks, guess)
    # Both are clip(v - nu y, 0, upper) at a root of sum y alpha, found up to the rounding of v.
    tolerance = 1e-12 * max(upper, np.abs(v).max())
    np.testing.assert_allclose(alpha, expected, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(alpha, np.clip(v - nu * y, 0.0, upper))
    assert np.all((alpha >= 0) & (alpha <= upper))
    assert abs(y @ alpha) <= len(v) * tolerance


def test_projection_of_a_non_finite_vector_is_nan():
    alpha, nu = distributed_projection(np.array([0.1, np.nan, 0.2]), np.array([1.0, -1.0, 1.0]), 1 / 3, 1)
    assert np.all(np.isnan(alpha)) and np.isnan(nu)


def test_reproducible_sum_with_a_known_bound():
    """A bound known on every rank replaces the Allreduce-max: same sums, integers exact."""
    rng = np.random.default_rng(3)
    partials = rng.normal(size=(7, 4))
    comm = SerialComm()
    largest = np.abs(partials).max(axis=0)
    np.testing.assert_array_equal(comm.reproducible_sum(partials, 7, largest),
                                  comm.reproducible_sum(partials, 7))
    counts = rng.integers(0, 10**6, size=(7, 3)).astype(np.float64)
    np.testing.assert_array_equal(comm.reproducible_sum(counts, 7, 2e6), counts.sum(axis=0))


@pytest.fixture(scope="module")
def a9a_1000():
    X, y = load_svmlight("a9a.xz")
    return X[:1000], y[:1000]


def hinge_svm_optimum(X, y, lam, offset):
    """cvxpy's min of lam ||w||^2 / 2 + mean hinge(1 - y (X w [+ b])), the offset unregularized."""
    w, b = cp.Variable(X.shape[1]), cp.Variable()
    scores = X @ w + (b if offset else 0)
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w)
                                     + cp.sum(cp.pos(1 - cp.multiply(y, scores))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


@pytest.mark.parametrize("method", ["pragam", "pragam_b"])
def test_pragam_reaches_the_cvxpy_optimum(a9a_1000, method):
    X, y = a9a_1000
    lam = 1e-2
    offset = method == "pragam_b"
    Xb = np.hstack([X.toarray(), np.ones((len(y), 1))]) if offset else X
    optimum = hinge_svm_optimum(X, y, lam, offset)
    risk = DistributedRisk(get_loss("hinge"), Xb, y, len(y), SerialComm(), blocks=[0, 300, 700, 1000])
    result = minimize(risk, np.zeros(risk.dim), lam, method=method, rel_epsilon=1e-3, epsilon=0)
    assert result.success and result.gap <= 1e-3 * result.fun
    assert optimum <= result.fun <= optimum * (1 + 1e-3)
    history = result.history
    assert np.all(history["lower_bound"] <= optimum * (1 + 1e-8))
    assert np.all(np.diff(history["lower_bound"]) >= 0) and np.all(np.diff(history["best_objective"]) <= 0)
    np.testing.assert_allclose(history["gap"], history["best_objective"] - history["lower_bound"])
    # The objective is J of the returned model, written out here and through the risk oracle.
    w, b = (result.w[:-1], result.w[-1]) if offset else (result.w, 0.0)
    written = 0.5 * lam * w @ w + np.mean(np.maximum(0.0, 1.0 - y * (X @ w + b)))
    assert result.fun == pytest.approx(written, rel=1e-12)
    assert result.fun == pytest.approx(0.5 * lam * w @ w + risk(result.w)[0], rel=1e-12)


def test_pragam_without_offset_regularizes_the_bias_feature(a9a_1000):
    """pragam with --bias solves the same problem as BMRM: the constant feature is an ordinary one."""
    X, y = a9a_1000
    Xb = np.hstack([X.toarray(), np.ones((len(y), 1))])
    optimum = hinge_svm_optimum(Xb, y, 1e-2, offset=False)
    risk = DistributedRisk(get_loss("hinge"), Xb, y, len(y), SerialComm())
    result = minimize(risk, np.zeros(risk.dim), 1e-2, method="pragam", rel_epsilon=1e-3)
    assert optimum <= result.fun <= optimum * (1 + 1e-3)
    assert result.lower_bound <= optimum * (1 + 1e-8)


def test_pragam_refuses_what_it_cannot_solve():
    X = np.random.default_rng(0).normal(size=(20, 3))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    hinge = DistributedRisk(get_loss("hinge"), X, y, 20, SerialComm())
    with pytest.raises(UsageError, match="constant last feature 1"):
        minimize(hinge, np.zeros(3), 0.1, method="pragam_b")
    # The refusals it shares with dcd: tests/solvers/test_dcd.py.


def test_lipschitz_estimate_bounds_the_largest_singular_value(a9a_1000):
    from prbmrm.solvers.dual import SVMDual

    X, y = a9a_1000
    lam = 1e-3
    risk = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm(), blocks=[0, 500, 1000])
    sigma2 = np.linalg.norm(X.toarray(), 2) ** 2
    estimate = SVMDual(risk, lam, offset=False).lipschitz()
    assert sigma2 / lam <= estimate <= 1.1 * sigma2 / lam * (1 + 1e-3)


@pytest.mark.distributed
def test_projection_is_the_same_on_every_rank_count(comm):
    rng = np.random.default_rng(7)
    n = 997
    y = rng.choice([-1.0, 1.0], n)
    v = rng.normal(size=n) / n
    bounds = np.linspace(0, n, 6).astype(int)  # 5 blocks over any number of ranks
    first, last = comm.rank * 5 // comm.size, (comm.rank + 1) * 5 // comm.size
    mine = slice(bounds[first], bounds[last])
    project = DistributedProjection(y[mine], bounds[first:last + 1] - bounds[first], 5, comm, 1.0 / n)
    alpha, nu = project(v[mine])
    everything = comm.gather_scalars(alpha)
    if comm.is_root:
        serial = DistributedProjection(y, bounds, 5, SerialComm(), 1.0 / n)
        expected, expected_nu = serial(v)
        assert nu == expected_nu
        np.testing.assert_array_equal(everything, expected)


@pytest.mark.distributed
@pytest.mark.parametrize("method", ["pragam", "pragam_b"])
def test_pragam_run_is_the_same_on_every_rank_count(comm, mpi_tmp_path, method):
    X, y = load_svmlight("a9a.xz")
    directory = shared_shards(comm, mpi_tmp_path, X[:2000], y[:2000], parts=comm.size + 2)
    options = dict(method=method, rel_epsilon=0, max_iter=25)

    def run(local, comm):
        oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, comm,
                                 local.blocks)
        return run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), 1e-3, **options))

    result = run(load_local(directory, comm, bias=True), comm)
    if comm.is_root:
        expected = run(load_local(directory, SerialComm(), bias=True), SerialComm())
        for column in ("objective", "best_objective", "lower_bound", "gap"):
            np.testing.assert_array_equal(result.history[column], expected.history[column])
        np.testing.assert_array_equal(result.w, expected.w)
        np.testing.assert_array_equal(result.w_last, expected.w_last)


@pytest.mark.distributed
def test_a_bad_offset_column_on_one_rank_stops_every_rank(comm):
    X = np.ones((2, 3))
    if comm.rank == comm.size - 1:
        X[1, -1] = 2.0  # this rank's last feature is not the constant 1
    y = np.array([1.0, -1.0])
    oracle = DistributedRisk(get_loss("hinge"), X, y, 2 * comm.size, comm)
    with pytest.raises(CollectiveError, match="constant last feature 1"):
        run_distributed(oracle, lambda risk: minimize(risk, np.zeros(3), 0.1, method="pragam_b"))


@pytest.mark.parametrize("method", ["pragam", "pragam_b"])
def test_command_line_trains_on_two_ranks(tmp_path, method):
    out = tmp_path / "model.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--solver", method, "--bias", "--lam", "0.1",
                                 "--out", str(out)], timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert sum(line.startswith("converged") for line in completed.stdout.splitlines()) == 1
    model = load_model(str(out))
    assert model.attrs["solver"] == method
    assert model.attrs["lower_bound"] <= model.attrs["objective"]
    assert model.attrs["gap"] <= 1e-3 * model.attrs["objective"]
    # The stored objective is J of the stored model (offset unregularized for pragam_b).
    from prbmrm.training import load_demo

    X, y = load_demo()
    hinge = np.mean(np.maximum(0.0, 1.0 - y * (X @ model.w + model.bias)))
    penalty = model.w @ model.w + (0.0 if method == "pragam_b" else model.bias ** 2)
    assert model.attrs["objective"] == pytest.approx(0.05 * penalty + hinge, rel=1e-9)


def test_command_line_pragam_b_needs_bias(tmp_path):
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--solver", "pragam_b", "--out",
                                 str(tmp_path / "model.h5")], timeout=120)
    assert completed.returncode == 2
    assert "--bias" in completed.stderr


def test_a_serving_rank_builds_a_service_whose_solver_it_never_imported():
    """Solver modules load on first use, so a serving rank need not have imported the module of the
    service rank 0 attaches (found under mpiexec: the ranks of an in-process pragam run stopped with
    "unknown service"). Every service is in SERVICE_MODULES, and attaching one imports its module."""
    code = """
import numpy as np
import prbmrm.distributed.oracle as r
from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss

assert not r.SERVICES, sorted(r.SERVICES)  # a fresh process has imported no solver module
X, y = np.array([[1.0, 1.0], [-1.0, 1.0]]), np.array([1.0, -1.0])
oracle = r.DistributedRisk(get_loss("hinge"), X, y, 2, SerialComm())
for name, args in (("pragam", [0.001, True, None]), ("argsup", []), ("tron", [0.0]),
                   ("planes", [0.001, "l2", {}, 10, 0, 0]), ("dcd", [0.001, 0])):
    built = oracle._build_service([name, args])
    assert type(built) is r.SERVICES[name] and type(built).__module__ == r.SERVICE_MODULES[name], name
assert sorted(r.SERVICES) == sorted(r.SERVICE_MODULES)
print("ok")
"""
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    assert completed.returncode == 0 and completed.stdout.strip() == "ok", completed.stderr[-3000:]
