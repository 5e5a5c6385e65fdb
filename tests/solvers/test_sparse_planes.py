"""Sparse planes: the bundle stores a plane of small support as indices and values.

Checked against the dense bundle (same planes: Gram matrix, ``A^T alpha``,
``A w`` and aggregation within rounding; whole runs: the same optimum), against
cvxpy on a small problem, and for checkpoints: a run resumed from sparse planes
is bitwise the uninterrupted one, a checkpoint with dense planes (the format
before sparse planes) still resumes, and damaged sparse planes are refused.
The ``distributed`` test runs serially here and under ``mpiexec -n 2/3``
(test_mpiexec.py) and asserts bitwise equality with the serial run.
"""

import numpy as np
import pytest

from helpers import shared_shards
from prbmrm.checkpoint import load_checkpoint, save_checkpoint
from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import CollectiveError, InputError
from prbmrm.solvers import bundle as _bundle
from prbmrm.solvers.bundle import SPARSE_MIN_DIM, Bundle
from prbmrm.training import run
from test_highdim import text_like


def random_planes(rng, d, count):
    """Planes of 5% support, and every fourth dense."""
    for k in range(count):
        a = np.zeros(d)
        support = rng.choice(d, d if k % 4 == 3 else d // 20, replace=False)
        a[support] = rng.normal(size=len(support))
        yield a, float(rng.normal())


@pytest.mark.parametrize("metric", [None, "diagonal"])
def test_sparse_bundle_agrees_with_the_dense_one(metric):
    rng = np.random.default_rng(3)
    d = 400
    scale = rng.random(d) + 0.5
    metric = None if metric is None else (lambda a: a / scale)
    dense, sparse = Bundle(d, metric, max_size=7, sparse=False), Bundle(d, metric, max_size=7, sparse=True)
    alpha = np.zeros(0)
    for a, b in random_planes(rng, d, 20):
        kept = dense.make_room(alpha)
        np.testing.assert_array_equal(sparse.make_room(alpha), kept)
        dense.add(a, b)
        sparse.add(a, b)
        alpha = np.append(kept, 0.0)
        alpha[rng.random(len(alpha)) < 0.3] = 0.0  # some idle planes, aggregated or dropped
        alpha = alpha + (alpha.sum() == 0)
        alpha /= alpha.sum()
        np.testing.assert_allclose(sparse.A, dense.A, rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(sparse.b, dense.b)
        np.testing.assert_allclose(sparse.gram, dense.gram, rtol=1e-12, atol=1e-13)
        w = rng.normal(size=d)
        np.testing.assert_allclose(sparse.combine(alpha), alpha @ dense.A, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sparse.products(w), dense.A @ w, rtol=1e-12, atol=1e-13)
    # The Gram matrix kept up to date is that of the planes (in the metric).
    A = sparse.A
    M = A if metric is None else np.array([metric(a) for a in A])
    np.testing.assert_allclose(sparse.gram, A @ M.T, rtol=1e-12, atol=1e-13)
    stored = [index is not None for index, _ in sparse._planes]
    assert any(stored) and sparse.nbytes < dense.nbytes


def test_sparse_planes_are_stored_sparsely_only_below_half_the_support():
    d = 100
    bundle = Bundle(d, sparse=True)
    for support in (49, 50, 0):
        a = np.zeros(d)
        a[:support] = 1.0
        bundle.add(a, 0.0)
    assert [index is None for index, _ in bundle._planes] == [False, True, False]
    assert bundle.nbytes == 49 * 12 + 100 * 8
    assert Bundle(SPARSE_MIN_DIM).sparse and not Bundle(SPARSE_MIN_DIM - 1).sparse


def test_sparse_state_restores_the_same_storage():
    rng = np.random.default_rng(5)
    d = 300
    bundle = Bundle(d, sparse=True)
    for a, b in random_planes(rng, d, 6):
        bundle.add(a, b)
    state = bundle.state()
    assert "A" not in state and state["indptr"][-1] == len(state["values"])
    again = Bundle(d, sparse=True)
    again.restore(state)
    for (i, v), (j, u) in zip(bundle._planes, again._planes):
        assert (i is None) == (j is None) and (i is None or np.array_equal(i, j))
        assert v.tobytes() == u.tobytes()
    np.testing.assert_array_equal(again.gram, bundle.gram)
    # Either storage reads either format.
    dense = Bundle(d, sparse=False)
    dense.restore(state)
    np.testing.assert_array_equal(dense.A, bundle.A)
    back = Bundle(d, sparse=True)
    back.restore(dense.state())
    np.testing.assert_array_equal(back.A, bundle.A)


def test_a_run_with_sparse_planes_reaches_the_dense_runs_optimum(monkeypatch):
    X, y = text_like(rows=800, d=2**16, per_row=15, seed=2)
    # Exact subproblems: storage is then the only difference, and rounding moves the path by an
    # iteration or two; BMRM's loose solves would turn an ulp into another (equally certified) path.
    options = dict(loss="hinge", lam=1e-3, epsilon=0.0, rel_epsilon=1e-5, max_iter=500, comm=SerialComm(),
                   solver="bmrm", solver_params={"inexact": 0})
    sparse, _, _ = run((X, y), **options)
    assert sparse.bundle.sparse and any(index is not None for index, _ in sparse.bundle._planes)
    monkeypatch.setattr(_bundle, "SPARSE_MIN_DIM", np.inf)
    dense, _, _ = run((X, y), **options)
    assert not dense.bundle.sparse and sparse.success and dense.success
    # Sums plane by plane instead of BLAS products: the iterates differ by rounding only.
    assert abs(sparse.nit - dense.nit) <= 2
    assert sparse.fun == pytest.approx(dense.fun, rel=1e-10)
    assert sparse.lower_bound == pytest.approx(dense.lower_bound, rel=1e-10)
    np.testing.assert_allclose(sparse.w, dense.w, rtol=0, atol=1e-6 * np.abs(dense.w).max())


class ByteSpy(Bundle):
    """A Bundle that asserts, after every change, that its planes hold at most max_bytes."""

    largest, aggregations = 0, 0

    def add(self, a, b, point=None):
        super().add(a, b, point)
        self.check()

    def aggregate_oldest(self, alpha, keep):
        ByteSpy.aggregations += 1
        alpha = super().aggregate_oldest(alpha, keep)
        self.check()
        return alpha

    def check(self):
        assert self.nbytes <= self.max_bytes
        ByteSpy.largest = max(ByteSpy.largest, self.size)


@pytest.mark.parametrize("solver", ["bmrm", "proximal"])
def test_sparse_planes_within_a_memory_budget_reach_the_cvxpy_optimum(monkeypatch, solver):
    # --bundle-memory counts the bytes sparse planes hold: more of them fit than dense planes would.
    cp = pytest.importorskip("cvxpy")
    monkeypatch.setattr(_bundle, "SPARSE_MIN_DIM", 1)
    monkeypatch.setattr(f"prbmrm.solvers.{'base' if solver == 'bmrm' else solver}.Bundle", ByteSpy)
    ByteSpy.largest = ByteSpy.aggregations = 0
    X, y = text_like(rows=200, d=2**14, per_row=10, seed=5)
    lam, dense_planes = 1e-2, 3  # per bundle: the proximal method keeps two, half the budget each
    budget = dense_planes * 8 * X.shape[1] * (2 if solver == "proximal" else 1)
    result, _, _ = run((X, y), loss="hinge", lam=lam, solver=solver, epsilon=1e-6, rel_epsilon=0, max_iter=3000,
                       bundle_memory=budget, comm=SerialComm())
    assert result.success and ByteSpy.aggregations > 0 and ByteSpy.largest > dense_planes
    if solver == "bmrm":
        assert result.bundle.sparse and result.bundle.max_bytes == budget and result.bundle.max_size is None
        assert all(index is not None for index, _ in result.bundle._planes)  # aggregates too
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(lam / 2 * cp.sum_squares(w) + cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    assert np.all(result.history["lower_bound"] <= problem.value + 1e-7)
    assert result.fun == pytest.approx(problem.value, abs=1.1e-6)


def test_a_memory_budget_that_never_binds_leaves_bmrm_as_it_is(monkeypatch):
    # BMRM's loose subproblems (its default) stay on until the budget makes the bundle aggregate.
    monkeypatch.setattr(_bundle, "SPARSE_MIN_DIM", 1)
    X, y = text_like(rows=300, d=2**13, per_row=10, seed=9)
    options = dict(loss="hinge", lam=1e-3, solver="bmrm", rel_epsilon=1e-3, max_iter=300, comm=SerialComm())
    unlimited, _, _ = run((X, y), **options)
    within, _, _ = run((X, y), bundle_memory=1000 * 8 * X.shape[1], **options)
    assert within.bundle.max_bytes and unlimited.success and within.nit == unlimited.nit
    np.testing.assert_array_equal(within.w, unlimited.w)
    np.testing.assert_array_equal(within.history["lower_bound"], unlimited.history["lower_bound"])


def test_memory_budget_of_a_sparse_bundle_leaves_room_for_the_aggregate_and_the_new_plane():
    d = 1000
    bundle = Bundle(d, sparse=True, max_bytes=5 * 8 * d)
    assert Bundle(d, sparse=True, max_bytes=8).max_bytes == 2 * 8 * d  # at least two dense planes
    assert Bundle(d, sparse=False, max_bytes=5 * 8 * d + 7).max_size == 5  # dense: a plane count
    rng = np.random.default_rng(8)
    alpha = np.zeros(0)
    largest = 0
    for a, b in random_planes(rng, d, 40):
        assert (bundle.room() is None) == (bundle.nbytes + 8 * d <= bundle.max_bytes)
        alpha = bundle.make_room(alpha)
        assert bundle.nbytes + 8 * d <= bundle.max_bytes  # a dense plane still fits
        bundle.add(a, b)
        largest = max(largest, bundle.size)
        alpha = rng.random(bundle.size)
        alpha /= alpha.sum()
    assert bundle.nbytes <= bundle.max_bytes
    assert largest > 5  # planes of 5% support: more than the five dense ones the budget holds


RESUME = dict(loss="hinge", lam=1e-4, solver="bmrm", rel_epsilon=1e-4, comm=SerialComm())


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory):
    """A text-like problem at d = 2^16 (sparse planes), its full run and a checkpoint after 15 iterations."""
    data = text_like(rows=1500, d=2**16, per_row=15, seed=4)
    full, _, _ = run(data, **RESUME)
    path = str(tmp_path_factory.mktemp("sparse") / "state.h5")
    part, _, _ = run(data, max_iter=15, checkpoint=path, **RESUME)
    assert part.nit == 15 and full.nit > 20 and full.bundle.sparse
    return data, full, path


def test_resume_from_sparse_planes_is_bitwise_the_uninterrupted_run(sparse_run):
    data, full, path = sparse_run
    state, _ = load_checkpoint(path)
    assert "indices" in state["bundle"] and "A" not in state["bundle"]
    assert len(state["bundle"]["values"]) < state["bundle"]["indptr"].size * 2**16 / 2
    resumed, _, _ = run(data, resume=path, **RESUME)
    assert resumed.nit == full.nit
    np.testing.assert_array_equal(resumed.w, full.w)
    np.testing.assert_array_equal(resumed.history["lower_bound"], full.history["lower_bound"])


def rewritten(path, tmp_path, change):
    state, meta = load_checkpoint(path)
    change(state["bundle"])
    path = str(tmp_path / "changed.h5")
    save_checkpoint(path, state, meta)
    return path


def to_dense(bundle):
    planes = Bundle(2**16, sparse=True)
    planes.restore(bundle)
    A = planes.A
    for key in ("indptr", "indices", "values"):
        bundle.pop(key)
    bundle["A"] = A


def test_a_checkpoint_with_dense_planes_still_resumes(sparse_run, tmp_path):
    data, full, path = sparse_run
    resumed, _, _ = run(data, resume=rewritten(path, tmp_path, to_dense), **RESUME)
    assert resumed.success and resumed.nit == full.nit
    np.testing.assert_allclose(resumed.w, full.w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["indices"].__setitem__(0, 2**16), "bundle: indptr, indices and values do not form sparse planes"),
    (lambda s: s.update(values=s["values"][:-1]), "bundle: indptr, indices and values do not form sparse planes"),
    (lambda s: s.update(indptr=s["indptr"][:-1]), "bundle/indptr has shape .*, expected"),
    (lambda s: s["values"].__imul__(2.0), "bundle/gram is not the Gram matrix of bundle/A"),
])
def test_damaged_sparse_planes_are_refused(sparse_run, tmp_path, change, message):
    data, _, path = sparse_run
    with pytest.raises((CollectiveError, InputError), match=message):
        run(data, resume=rewritten(path, tmp_path, change), **RESUME)


@pytest.mark.distributed
def test_sparse_planes_are_bitwise_equal_across_ranks(comm, mpi_tmp_path):
    X, y = text_like(rows=2000, d=2**17, per_row=15, seed=6)
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 1)
    options = dict(loss="hinge", lam=1e-4, solver="bmrm", rel_epsilon=1e-4, max_iter=300,
                   bundle_memory=10 * 8 * X.shape[1])
    result, _, _ = run(directory, comm=comm, **options)
    if comm.is_root:
        assert result.bundle.sparse and any(index is not None for index, _ in result.bundle._planes)
        expected, _, _ = run(directory, comm=SerialComm(), **options)
        assert result.nit == expected.nit
        np.testing.assert_array_equal(result.w, expected.w)
        np.testing.assert_array_equal(result.history["lower_bound"], expected.history["lower_bound"])


def test_plane_kernels_are_bitwise_scipys_and_numpys():
    # The compiled loops replace scipy's CSR product, numpy's fancy-index add and flatnonzero: the same bits.
    import scipy.sparse as sp

    rng = np.random.default_rng(11)
    d = 5000
    x, y = rng.normal(size=d), rng.normal(size=d)
    planes = [_bundle._plane(a) for a, _ in random_planes(rng, d, 6)]
    alpha = rng.random(len(planes))
    alpha[2] = 0.0
    expected = np.zeros(d)
    for (index, values), weight in zip(planes, alpha):
        if index is None:
            assert _bundle._dot((index, values), x) == float(np.dot(values, x))
            expected += weight * values
            continue
        row = sp.csr_matrix((values, index, np.array([0, len(index)])), shape=(1, d))
        assert _bundle._dot((index, values), x) == float((row @ x)[0])
        assert _bundle._dots((index, values), x, y) == (float((row @ x)[0]), float((row @ y)[0]))
        if weight != 0.0:
            expected[index] += weight * values
    np.testing.assert_array_equal(_bundle._combine(alpha, planes, d), expected)
    a = np.zeros(d)
    a[[0, 7, 9, d - 1]] = [1.5, -0.0, np.nan, -2.0]  # -0.0 is a zero, NaN is not (as for flatnonzero)
    for a in (a, -a, np.zeros(d)):
        index, values = _bundle._plane(a)
        np.testing.assert_array_equal(index, np.flatnonzero(a))
        np.testing.assert_array_equal(values, a[np.flatnonzero(a)])
        assert index.dtype == np.int32 and values.dtype == np.float64


def test_blocked_plane_kernels_are_bitwise_plane_by_plane():
    # The Gram row and A^T alpha go over groups of planes a slice of the coordinates at a time, four
    # planes in lockstep: the same bits as one plane at a time, across slices and groups (a last group
    # padded), with planes of any length and dense ones among them.
    from prbmrm.kernels.planes import CHUNK, GROUP, sparse_dot

    rng = np.random.default_rng(12)
    d = 3 * CHUNK + 17
    planes = [_bundle._plane(a) for a, _ in random_planes(rng, d, GROUP + 7)]
    planes.insert(2, _bundle._plane(np.zeros(d)))  # no nonzeros
    a = np.zeros(d)
    a[CHUNK - 1:CHUNK + 1] = [0.5, -1.5]  # a plane whose nonzeros straddle a slice's edge
    planes.append(_bundle._plane(a))
    x = rng.normal(size=d) * np.exp(rng.normal(size=d) * 5)  # wide exponents make order show in the bits
    expected = [float(np.dot(values, x)) if index is None else sparse_dot(index, values, x) for index, values in planes]
    np.testing.assert_array_equal(_bundle._dot_planes(planes, x), expected)
    alpha = rng.random(len(planes)) * np.exp(rng.normal(size=len(planes)) * 5)
    alpha[4] = 0.0
    total = np.zeros(d)
    for (index, values), weight in zip(planes, alpha):
        if weight != 0.0:
            if index is None:
                total += weight * values
            else:
                total[index] += weight * values
    np.testing.assert_array_equal(_bundle._combine(alpha, planes, d), total)


def test_products_at_the_recorded_point_are_bitwise_a_fresh_pass():
    # Bundle.add(point=...) records A w; adds at the same point, a new point, prunes and aggregation keep it.
    rng = np.random.default_rng(13)
    d = 600
    bundle, alpha = Bundle(d, max_size=6, sparse=True), np.zeros(0)
    point = rng.normal(size=d)
    for k, (a, b) in enumerate(random_planes(rng, d, 25)):
        if k % 3 == 0:
            point = rng.normal(size=d)  # a new array: the record starts afresh
        alpha = np.append(bundle.make_room(alpha), 0.0)
        bundle.add(a, b, point=point)
        alpha[rng.random(len(alpha)) < 0.4] = 0.0
        alpha = alpha + (alpha.sum() == 0)
        bundle.update_idle(alpha)
        alpha = bundle.prune(2, alpha)
        recorded = bundle.products(point)
        assert bundle._point is point
        np.testing.assert_array_equal(recorded, bundle.products(point.copy()))
    bundle.make_room(alpha)
    bundle.add(*next(random_planes(rng, d, 1)))  # an add without a point ends the record
    assert bundle._point is None


def test_a_plane_with_the_last_planes_support_shares_its_indices():
    d = 100
    bundle = Bundle(d, sparse=True)
    for support in ([1, 5, 7], [1, 5, 7], [1, 5, 8], [1, 5, 8]):
        a = np.zeros(d)
        a[support] = np.arange(1.0, 4.0)
        bundle.add(a, 0.0)
    index = [plane[0] for plane in bundle._planes]
    assert index[1] is index[0] and index[2] is not index[1] and index[3] is index[2]
    np.testing.assert_array_equal(bundle.A[:, [1, 5, 7, 8]], [[1, 2, 3, 0], [1, 2, 3, 0], [1, 2, 0, 3], [1, 2, 0, 3]])
    assert bundle.nbytes == 4 * 3 * 12  # counted per plane


def test_pruning_and_aggregating_in_place_keep_exactly_the_chosen_planes():
    # Dense planes move in place (only those whose row changes): the bundle left is bitwise the planes kept,
    # as numpy's selection of the rows gives them, through prunes of any pattern and aggregations.
    rng = np.random.default_rng(5)
    d = 60
    bundle = Bundle(d, sparse=False)
    planes = []
    alpha = np.zeros(0)
    for step, (a, b) in enumerate(random_planes(rng, d, 40)):
        bundle.add(a, b)
        planes.append((a, b))
        alpha = np.append(alpha, 0.0)
        alpha[rng.random(len(alpha)) < 0.5] = 0.0
        alpha[-1] = 1.0
        bundle.update_idle(alpha)
        A, B, gram, idle = bundle.A.copy(), bundle.b.copy(), bundle.gram.copy(), bundle._idle[:bundle.size].copy()
        if step % 7 == 6:
            kept = bundle.aggregate_oldest(alpha / alpha.sum(), 3)
            rows = np.arange(len(B) - 3, len(B))
            first = int(alpha[:len(B) - 3].sum() > 0)  # the aggregate, unless the oldest planes were all idle
            np.testing.assert_array_equal(bundle.A[first:], A[rows])
            np.testing.assert_array_equal(bundle.gram[first:, first:], gram[np.ix_(rows, rows)])
            alpha = kept
            continue
        alpha = bundle.prune(2, alpha)
        rows = np.flatnonzero(idle < 2)
        np.testing.assert_array_equal(bundle.A, A[rows])
        np.testing.assert_array_equal(bundle.b, B[rows])
        np.testing.assert_array_equal(bundle.gram, gram[np.ix_(rows, rows)])
        assert len(alpha) == bundle.size
