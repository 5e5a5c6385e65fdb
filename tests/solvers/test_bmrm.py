"""BMRM against independent optima: cvxpy on the full primal, LIBLINEAR, the exact ridge solution."""

import numpy as np
import pytest

from helpers import OBJECTIVES, cvxpy_optimum, load_svmlight
from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import Bundle, minimize


def train(X, y, loss, lam, **options):
    oracle = DistributedRisk(get_loss(loss), X, y, len(y), SerialComm())
    return minimize(oracle, np.zeros(X.shape[1]), lam, **options)


def synthetic(loss, m=80, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, d))
    w_true = rng.normal(size=d)
    if loss == "least_squares":
        y = X @ w_true + 0.3 * rng.normal(size=m)
    else:
        y = np.where(X @ w_true + 0.5 * rng.normal(size=m) > 0, 1.0, -1.0)
    return X, y


@pytest.mark.parametrize("loss", ["hinge", "logistic", "least_squares"])
@pytest.mark.parametrize("lam", [1e-2, 1e-4])
def test_synthetic_reaches_cvxpy_optimum(loss, lam):
    X, y = synthetic(loss)
    reference = cvxpy_optimum(X, y, loss, lam)
    eps = 1e-6
    result = train(X, y, loss, lam, epsilon=eps, rel_epsilon=0)
    assert result.success and result.gap <= eps
    assert result.fun == pytest.approx(OBJECTIVES[loss](X, y, result.w, lam), rel=1e-12)
    assert abs(result.fun - reference) <= eps + 1e-7 * abs(reference)
    # Every lower bound along the way is below the optimum.
    assert np.all(result.history["lower_bound"] <= reference + 1e-7 * abs(reference))


def liblinear_optimum(X, y, loss, lam):
    """J at LIBLINEAR's solution, solved to a tight tolerance (C = 1 / (lam m))."""
    from liblinear.liblinearutil import train as liblinear_train

    solver = {"hinge": 3, "logistic": 0}[loss]
    C = 1.0 / (lam * X.shape[0])
    model = liblinear_train(y, X, f"-s {solver} -c {C!r} -e 1e-7 -q")
    w, _ = model.get_decfun()
    w = np.asarray(w) * (1.0 if model.get_labels()[0] == 1 else -1.0)
    return OBJECTIVES[loss](X, y, w, lam)


def ridge_optimum(X, y, lam):
    """J at the exact minimizer of lam/2 |w|^2 + 1/(2m) |Xw - y|^2."""
    m, d = X.shape
    w = np.linalg.solve((X.T @ X).toarray() / m + lam * np.eye(d), X.T @ y / m)
    return OBJECTIVES["least_squares"](X, y, w, lam)


def real_data(name):
    if name == "dna-binary":
        X, y = load_svmlight("dna.scale.xz")
        return X, np.where(y == 3, 1.0, -1.0)
    return load_svmlight({"a9a": "a9a.xz", "w8a": "w8a.xz"}[name])


@pytest.mark.parametrize("name", ["a9a", "w8a", "dna-binary"])
@pytest.mark.parametrize("loss", ["hinge", "logistic", "least_squares"])
@pytest.mark.parametrize("lam", [1e-2, 1e-4])
def test_real_data_reaches_independent_optimum(name, loss, lam):
    X, y = real_data(name)
    if loss == "least_squares":
        reference = ridge_optimum(X, y, lam)
    elif name == "dna-binary":  # small enough for cvxpy on the full primal
        reference = cvxpy_optimum(X, y, loss, lam)
    else:
        reference = liblinear_optimum(X, y, loss, lam)
    eps = 1e-4 * reference
    result = train(X, y, loss, lam, epsilon=eps, rel_epsilon=0)
    assert result.success and result.gap <= eps
    # J* <= reference, so J(w) - J* <= eps implies the first; the second
    # checks the reference is itself that close to the optimum.
    assert result.fun - reference <= eps
    assert reference - result.fun <= eps
    assert result.lower_bound <= reference


def test_gap_is_best_objective_minus_lower_bound():
    X, y = synthetic("hinge", m=200, d=10)
    h = train(X, y, "hinge", 1e-3, rel_epsilon=1e-3).history
    np.testing.assert_allclose(h["gap"], h["best_objective"] - h["lower_bound"])
    np.testing.assert_array_equal(h["best_objective"], np.minimum.accumulate(h["objective"]))
    assert np.all(np.diff(h["iteration"]) == 1)


def test_idle_planes_are_pruned_and_the_optimum_is_unchanged():
    X, y = real_data("a9a")
    X = X[:5000]
    y = y[:5000]
    kept = train(X, y, "hinge", 1e-4, epsilon=1e-5, rel_epsilon=0, idle_age=0)
    pruned = train(X, y, "hinge", 1e-4, epsilon=1e-5, rel_epsilon=0, idle_age=10)
    assert kept.history["planes"][-1] == kept.nit
    assert pruned.history["planes"].max() < kept.nit
    assert abs(kept.fun - pruned.fun) <= 2e-5


def test_max_iter_and_callback_stop():
    X, y = synthetic("hinge", m=300, d=20)
    result = train(X, y, "hinge", 1e-6, rel_epsilon=0, max_iter=5)
    assert result.nit == 5 and result.status == 2 and not result.success

    def stop_at_three(row):
        if row.iteration == 3:
            raise StopIteration

    result = train(X, y, "hinge", 1e-6, rel_epsilon=0, callback=stop_at_three)
    assert result.nit == 3 and result.status == 3


def test_bundle_gram_matrix_stays_exact():
    rng = np.random.default_rng(3)
    bundle = Bundle(7)
    for _ in range(20):
        bundle.add(rng.normal(size=7), rng.normal())
    np.testing.assert_allclose(bundle.gram, bundle.A @ bundle.A.T, rtol=1e-12, atol=1e-14)
    alpha = np.zeros(20)
    alpha[[2, 5]] = 0.5
    for _ in range(3):
        bundle.update_idle(alpha)
    kept = bundle.prune(3, alpha)
    assert bundle.size == 2 and np.array_equal(kept, [0.5, 0.5])
    np.testing.assert_allclose(bundle.gram, bundle.A @ bundle.A.T, rtol=1e-12, atol=1e-14)


def test_overflowing_planes_stop_with_a_clear_error():
    from prbmrm.errors import InputError

    X = np.array([[1e160, 1.0], [2e160, -1.0]])
    with pytest.raises(InputError, match="not finite at iteration 1"):
        train(X, np.array([1.0, -1.0]), "hinge", 1e-4)


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
@pytest.mark.parametrize("lam", [1e-2, 1e-4, 1e-6])
def test_inexact_subproblems_report_only_valid_lower_bounds(loss, lam):
    # The inexact rule (inexact=1) stops the subproblem early: every lower
    # bound it reports must still be below min J, here cvxpy's optimum (the
    # objective of a feasible point, so at least min J), and the run must
    # still end at that optimum.
    from prbmrm.regularizers import get_regularizer

    X, y = synthetic(loss, m=150, d=8, seed=1)
    reference = cvxpy_optimum(X, y, loss, lam)
    reg = get_regularizer("l2")
    reg.prepare(X.shape[1], get_loss(loss).risk_floor)
    eps = 1e-6
    result = train(X, y, loss, lam, reg=reg, epsilon=eps, rel_epsilon=0, max_iter=20000, inexact=1)
    bounds = result.history["lower_bound"]
    assert result.success and result.gap <= eps
    assert np.all(bounds <= reference + 1e-12 * abs(reference))
    assert result.fun == pytest.approx(OBJECTIVES[loss](X, y, result.w, lam), rel=1e-12)
    assert reference - eps <= result.fun <= reference + eps
    exact = train(X, y, loss, lam, reg=reg, epsilon=eps, rel_epsilon=0, max_iter=20000, inexact=0)
    assert abs(exact.fun - result.fun) <= eps


def test_a_risk_that_takes_out_gives_the_same_run_and_planes_that_own_their_values():
    # BMRM hands a risk that takes out= the same array every iteration and writes w_t into earlier
    # iterates' storage: the run must be bitwise the one with a new array per call, the planes must
    # hold the subgradients of their own iterates, and the result must not change after it is returned.
    from prbmrm.solvers.bmrm import minimize_bmrm
    from prbmrm.regularizers import get_regularizer

    import scipy.sparse as sp
    rng = np.random.default_rng(4)
    d = 2 ** 16 + 5  # a sparse bundle, whose combine writes into the spare iterate
    X = sp.random(400, d, density=20 / d, random_state=4, format="csr")
    y = np.where(rng.random(400) < 0.5, 1.0, -1.0)
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    given, points = [], []

    def with_out(w, out=None):
        points.append(w.copy())
        r, a = oracle(w, out=out)
        given.append(a)
        return r, a

    def fresh(w):
        return oracle(w)

    runs, starts = [], []
    for risk in (with_out, fresh):
        regularizer = get_regularizer("l2")
        regularizer.prepare(d, 0.0)
        starts.append(np.zeros(d))
        runs.append(minimize_bmrm(risk, starts[-1], 1e-4, regularizer, rel_epsilon=1e-6, max_iter=40))
    mine, theirs = runs
    assert mine.nit == theirs.nit > 5
    assert not np.any(starts[0]) and not np.any(starts[1])  # w0 is the caller's: never an iterate's storage
    assert len({id(a) for a in given}) == 1  # one array, written every iteration
    for name in ("objective", "lower_bound", "gap"):
        np.testing.assert_array_equal(mine.history[name], theirs.history[name])
    np.testing.assert_array_equal(mine.w, theirs.w)
    np.testing.assert_array_equal(mine.w_last, theirs.w_last)
    assert not np.shares_memory(mine.w, given[0]) and not np.shares_memory(mine.w_last, given[0])
    # The best iterate is still the one whose objective was recorded (not overwritten by a later w_t).
    r, _ = oracle(mine.w)
    assert 1e-4 * regularizer.value(mine.w) + r == mine.fun == min(mine.history["objective"])
    # Every plane still kept is the subgradient at one of the iterates, not the last one written.
    bundle = mine.bundle
    fresh_planes = [oracle(point)[1] for point in points]
    for row in bundle.A:
        assert any(np.array_equal(row, plane) for plane in fresh_planes)
    assert not all(np.array_equal(row, bundle.A[-1]) for row in bundle.A[:-1])


def sparse_text(rows=300, d=2 ** 16, per_row=12, seed=4):
    """Sparse rows of d >= 2^16 columns (BMRM's bundle is sparse: one limb per component), +-1 labels."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    columns = np.minimum(rng.zipf(1.3, rows * per_row), d) - 1
    X = sp.csr_matrix((rng.random(rows * per_row) + 0.5, columns, np.arange(0, rows * per_row + 1, per_row)),
                      shape=(rows, d))
    X.sum_duplicates()
    y = np.where(X @ rng.standard_normal(d) + 0.2 * rng.standard_normal(rows) >= 0, 1.0, -1.0)
    return X, y


@pytest.mark.parametrize("d", [2 ** 16, 2 ** 17 + 3])  # one chunk of the sums, and three
def test_one_limb_planes_stay_below_the_exact_risk_within_the_radius(d):
    # The rounding of one limb (prbmrm/distributed/exact.py), accounted in the plane's offset
    # (rounding_margin): against the blocks' partials summed by math.fsum, at random points and at the
    # worst point of the ball, the rounded plane less the margin stays below the exact plane.
    import math

    from prbmrm.io import load_local, write_shards
    from prbmrm.solvers.base import rounding_margin

    X, y = sparse_text(d=d)
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm(), blocks=np.arange(0, 301, 25))
    oracle.set_limbs(1)
    rng = np.random.default_rng(5)
    w = rng.normal(size=X.shape[1]) * 3.0
    r, a = oracle(w)
    error_r, error_a = oracle.component_bounds(slice(d, None))[0], oracle.component_bounds(slice(0, d))
    blocks = [get_loss("hinge").loss_gradient(w, X[i:i + 25], y[i:i + 25]) for i in range(0, 300, 25)]
    exact_r = math.fsum(risk for risk, _ in blocks) / len(y)
    exact_a = np.array([math.fsum(column) for column in np.array([g for _, g in blocks]).T]) / len(y)
    assert abs(r - exact_r) <= error_r and np.all(np.abs(a - exact_a) <= error_a)
    assert np.any(a != exact_a)  # the limb rounds: the margin is not idle
    # error_bound's scalars, made a chunk at a time, are those of the component bounds.
    chunked_r, weighted, norm = oracle.error_bound(w)
    assert chunked_r == error_r
    assert weighted == pytest.approx(math.fsum(error_a * np.abs(w)), rel=1e-12)
    assert norm == pytest.approx(math.sqrt(math.fsum(error_a ** 2)), rel=1e-12)
    radius = 100.0
    margin = rounding_margin(error_r, weighted, norm, radius)
    worst = (a - exact_a) / np.linalg.norm(a - exact_a) * radius
    for v in [worst, *(rng.normal(size=(5, X.shape[1])))]:
        v = v * min(1.0, radius / np.linalg.norm(v))
        excess = math.fsum(np.append((a - exact_a) * (v - w), r - exact_r))
        assert excess <= margin
    assert margin < 1e-9


def test_one_limb_lower_bounds_stay_below_the_cvxpy_optimum():
    # d = 2^16: BMRM sums with one limb and lowers its planes (solvers/bmrm.py); every lower bound is still
    # below min J (cvxpy on the columns that occur: the others are 0 at the optimum), and the run ends there.
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers.bmrm import single_limb

    X, y = sparse_text()
    lam = 1e-3
    reg = get_regularizer("l2")
    reg.prepare(X.shape[1], get_loss("hinge").risk_floor)
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    assert single_limb(oracle, reg, Bundle(X.shape[1]))
    result = minimize(oracle, np.zeros(X.shape[1]), lam, reg=reg, epsilon=1e-7, rel_epsilon=0, max_iter=5000)
    assert oracle.fixed_point.limbs == 2  # restored for what follows
    used = np.unique(X.indices)
    reference = cvxpy_optimum(X[:, used].toarray(), y, "hinge", lam)
    assert result.success and np.all(result.history["lower_bound"] <= reference)
    assert reference - 1e-7 <= result.fun <= reference + 1e-7


def test_one_limb_planes_handed_to_a_smaller_lam_are_widened_and_stay_below_its_optimum():
    # A lambda path's planes: made for lam 1e-2 (valid within its minimizer's radius), reused at 1e-3,
    # whose minimizer may lie farther out: lowered by slack x the extra radius (Bundle.widen).
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers.bmrm import minimize_bmrm

    X, y = sparse_text()
    reg = get_regularizer("l2")
    reg.prepare(X.shape[1], get_loss("hinge").risk_floor)
    oracle = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    first = minimize_bmrm(oracle, np.zeros(X.shape[1]), 1e-2, reg, epsilon=1e-6, rel_epsilon=0, max_iter=3000)
    bundle = first.bundle
    assert 0 < bundle.slack < 1e-12 and np.isfinite(bundle.radius)
    radius, offsets = bundle.radius, bundle.b.copy()
    state = bundle.state()
    copy = Bundle(X.shape[1])
    copy.restore(state)
    assert (copy.radius, copy.slack) == (bundle.radius, bundle.slack)
    second = minimize_bmrm(oracle, first.w, 1e-3, reg, epsilon=1e-7, rel_epsilon=0, max_iter=5000,
                           bundle=bundle, alpha=first.alpha)
    assert bundle.radius > radius  # widened at the first iteration, the old planes lowered
    used = np.unique(X.indices)
    reference = cvxpy_optimum(X[:, used].toarray(), y, "hinge", 1e-3)
    assert second.success and np.all(second.history["lower_bound"] <= reference)
    widened = Bundle(X.shape[1])
    widened.restore(state)
    widened.widen(2 * radius)
    lowered = offsets - widened.b  # by slack x radius, up to the rounding of the offsets themselves
    assert np.all(np.abs(lowered - widened.slack * radius * 1.0001) <= np.spacing(np.abs(offsets)))
    exact = Bundle(X.shape[1])
    exact.widen(10.0)  # exact planes hold everywhere: nothing to lower
    assert exact.radius == np.inf and exact.slack == 0.0
