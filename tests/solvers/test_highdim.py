"""Sparse data with many features: the CSR risk path, the exact sum, the bundle's memory budget.

The ``distributed`` tests run serially here and under ``mpiexec -n 2/3``
(test_mpiexec.py); each compares its ranks with a serial run over the same
shard files made by rank 0, and asserts bitwise equality.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from helpers import shared_shards
from prbmrm.distributed import oracle as risk_module
from prbmrm.distributed.comm import SerialComm, SupportRows
from prbmrm.io import load_local, write_shards
from prbmrm.errors import InputError, UsageError
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.solvers import minimize
from prbmrm.solvers.bundle import Bundle, planes_within
from prbmrm.options import memory_bytes
from prbmrm.training import run


def text_like(rows=3000, d=2**16, per_row=20, seed=0):
    """Rows with Zipf-distributed features (exponent 1), unit-norm tf values, noisy labels."""
    rng = np.random.default_rng(seed)
    columns = rng.permutation(d)[np.minimum(np.exp(rng.random(rows * per_row) * np.log(d + 1.0)).astype(int) - 1,
                                            d - 1)]
    X = sp.csr_matrix((np.ones(rows * per_row), columns, np.arange(0, rows * per_row + 1, per_row)),
                      shape=(rows, d))
    X.sum_duplicates()
    X.data = 1.0 + np.log(X.data)
    X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(X.multiply(X).sum(axis=1)).A1) @ X)
    f = X @ rng.standard_normal(d)
    y = np.where(f + 0.3 * f.std() * rng.standard_normal(rows) >= 0, 1.0, -1.0)
    return X, y


def serial_oracle(directory, loss):
    local = load_local(directory, SerialComm())
    return DistributedRisk(get_loss(loss), local.X, local.y, local.n_examples_total, SerialComm(), local.blocks)


@pytest.mark.distributed
@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared_hinge"])
def test_sparse_risk_is_bitwise_the_serial_one(comm, mpi_tmp_path, loss, many):
    # Many small shards: every rank keeps its blocks' partial sums on their supports (SupportRows).
    X, y = text_like()
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=30 if many else comm.size + 2)
    local = load_local(directory, comm)
    oracle = DistributedRisk(get_loss(loss), local.X, local.y, local.n_examples_total, comm, local.blocks)
    assert isinstance(oracle._partials, SupportRows) or not many
    points = np.random.default_rng(1).normal(size=(3, X.shape[1]))
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points])
    if comm.is_root:
        serial = serial_oracle(directory, loss)
        for w, (r, a) in zip(points, values):
            r_serial, a_serial = serial(w)
            assert r == r_serial
            np.testing.assert_array_equal(a, a_serial)
            # The blocks' sums, each by the loss's own X^T l' over the whole block, added exactly
            # (math.fsum): within the exact sum's bound, far below a plain float sum's error.
            blocks = np.array([np.append(gradient, risk) for risk, gradient in
                               (get_loss(loss).loss_gradient(w, Xb, yb) for Xb, yb in serial.blocks)])
            exact = np.array([math.fsum(column) for column in blocks.T])
            np.testing.assert_allclose(np.append(a, r) * len(y), exact, rtol=4.5e-16,
                                       atol=2.0**-80 * np.abs(blocks).max())
            np.testing.assert_allclose(a, X.T @ get_loss(loss).derivative(X @ w, y) / len(y), rtol=1e-12, atol=1e-17)


@pytest.mark.distributed
def test_bmrm_on_sparse_data_is_bitwise_the_serial_run(comm, mpi_tmp_path):
    X, y = text_like()
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 1)
    memory = 8 * 8 * X.shape[1]  # eight dense planes' bytes: more sparse ones
    options = dict(solver="bmrm", loss="hinge", lam=1e-3, rel_epsilon=1e-3, max_iter=150, bundle_memory=memory)
    result, _, _ = run(directory, comm=comm, **options)
    if comm.is_root:
        expected, _, _ = run(directory, comm=SerialComm(), **options)
        assert result.nit == expected.nit
        np.testing.assert_array_equal(result.w, expected.w)
        np.testing.assert_array_equal(result.history["lower_bound"], expected.history["lower_bound"])
        assert result.bundle.nbytes <= memory and result.bundle.max_bytes == memory


def test_csr_risk_skips_inactive_rows_and_stays_exact():
    # Hinge at a w where most examples are beyond the margin: only the few active rows are scattered.
    X, _ = text_like(rows=2000)
    w = np.random.default_rng(6).normal(size=X.shape[1])
    y = np.where(X @ w >= 0, 1.0, -1.0)
    w *= 3.0
    slopes = get_loss("hinge").derivative(X @ w, y)
    assert 0 < np.count_nonzero(slopes) < 0.5 * len(y)
    r, a = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())(w)
    dense = X.toarray()
    assert r == pytest.approx(np.maximum(0.0, 1.0 - y * (dense @ w)).mean(), rel=1e-13)
    np.testing.assert_allclose(a, dense.T @ slopes / len(y), rtol=1e-12, atol=1e-18)


def test_csr_risk_accepts_int64_indices():
    X, y = text_like(rows=500, d=2**12)
    wide = sp.csr_matrix((X.data, X.indices.astype(np.int64), X.indptr.astype(np.int32)), shape=X.shape)
    w = np.random.default_rng(2).normal(size=X.shape[1])
    r, a = DistributedRisk(get_loss("logistic"), wide, y, len(y), SerialComm())(w)
    r0, a0 = DistributedRisk(get_loss("logistic"), X, y, len(y), SerialComm())(w)
    assert r == r0
    np.testing.assert_array_equal(a, a0)


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_partials_kept_on_the_blocks_support_are_bitwise_the_dense_rows(monkeypatch, loss):
    # Several blocks on one rank at a large d: each block's partial sum is kept on its columns only.
    X, y = text_like()
    blocks = list(range(0, 2000, 150)) + [2000, 2300, 3000]
    compact = DistributedRisk(get_loss(loss), X, y, len(y), SerialComm(), blocks)
    assert isinstance(compact._partials, SupportRows)
    assert compact._partials.nbytes <= risk_module.COMPACT_PARTIALS * 8 * len(blocks[1:]) * (X.shape[1] + 1)
    monkeypatch.setattr(risk_module, "COMPACT_PARTIALS", 0.0)
    dense = DistributedRisk(get_loss(loss), X, y, len(y), SerialComm(), blocks)
    assert isinstance(dense._partials, np.ndarray)
    rng = np.random.default_rng(7)
    for scale in (0.0, 1.0, 30.0):
        w = scale * rng.normal(size=X.shape[1])
        (r, a), (r0, a0) = compact(w), dense(w)
        assert r == r0
        np.testing.assert_array_equal(a, a0)
        assert not np.any(np.signbit(a[a == 0.0]))  # no -0.0 from either storage


def test_secure_comm_keeps_the_risk_sum_secure():
    # SecureComm passes unknown calls to the plain communicator: the risk's sum must not be one of them.
    from prbmrm.party.secure import SecureComm

    assert "exact_sum" in vars(SecureComm)


def test_memory_budget_gives_the_bundle_size():
    assert planes_within(2 * 10**9, 2**22) == 2 * 10**9 // (8 * 2**22) == 59
    assert planes_within(10, 2**22) == 2
    assert memory_bytes("2GB") == 2 * 10**9 and memory_bytes("512MiB") == 2**29 and memory_bytes("1e6") == 10**6
    with pytest.raises(Exception, match="size in bytes"):
        memory_bytes("lots")
    with pytest.raises(UsageError, match="--bundle-memory"):
        run(None, bundle_memory="lots")


def test_bundle_with_a_limit_never_copies_its_planes():
    bundle = Bundle(50, max_size=5)
    storage = bundle._A
    rng = np.random.default_rng(4)
    alpha = np.zeros(0)
    for _ in range(12):
        alpha = bundle.make_room(alpha)
        bundle.add(rng.normal(size=50), 0.0)
        alpha = np.append(alpha, 1.0) / (len(alpha) + 1)
    assert bundle.size <= 5 and bundle._A is storage


def test_memory_budget_reaches_the_cvxpy_optimum():
    cp = pytest.importorskip("cvxpy")
    X, y = text_like(rows=200, d=2**10, per_row=10, seed=5)
    lam = 1e-2
    result, _, _ = run((X, y), solver="bmrm", loss="hinge", lam=lam, epsilon=1e-6, rel_epsilon=0, max_iter=3000,
                       bundle_memory=10 * 8 * X.shape[1], comm=SerialComm())
    assert result.success and result.bundle.max_size == 10
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(lam / 2 * cp.sum_squares(w) + cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    assert result.lower_bound <= problem.value + 1e-7
    assert result.fun == pytest.approx(problem.value, abs=1.1e-6)


def test_float32_shards_store_rounded_values_and_train(tmp_path):
    X, y = text_like(rows=400, d=2**12)
    write_shards(X, y, tmp_path / "f32", 2, float32=True)
    local = load_local(str(tmp_path / "f32"), SerialComm())
    assert local.X.dtype == np.float64
    np.testing.assert_array_equal(local.X.toarray(), X.astype(np.float32).astype(np.float64).toarray())
    result, _, _ = run(str(tmp_path / "f32"), loss="hinge", lam=1e-3, rel_epsilon=1e-3, comm=SerialComm())
    assert result.success
    huge = sp.csr_matrix(np.array([[1e39, 0.0], [0.0, 1.0]]))
    with pytest.raises(InputError, match="float32 range"):
        write_shards(huge, np.array([1.0, -1.0]), tmp_path / "huge", 1, float32=True)


def test_compact_rows_clear_only_their_supports_and_recover_from_a_failed_pass(monkeypatch):
    # The dense row each block is computed into is cleared on the block's support only (not a row of
    # length d per block): it must be all zero between evaluations, also after a pass that failed midway.
    import prbmrm.kernels.blocks

    monkeypatch.setattr(prbmrm.kernels.blocks, "_CHUNK_NONZEROS", 500)  # several groups per block
    monkeypatch.setattr(prbmrm.kernels.blocks, "_GROUP_ROWS", 50)
    X, y = text_like()
    blocks = list(range(0, 2000, 150)) + [2000, 2300, 3000]
    loss = get_loss("hinge")
    compact = DistributedRisk(loss, X, y, len(y), SerialComm(), blocks)
    assert isinstance(compact._partials, SupportRows)
    assert min(len(groups) for groups in compact._groups[:2]) >= 2
    rng = np.random.default_rng(8)
    w1, w2 = rng.normal(size=X.shape[1]), rng.normal(size=X.shape[1])
    compact(w1)
    assert not np.any(compact._scratch)
    calls = []
    derivative = loss.derivative

    def failing(f, y):
        calls.append(1)
        if len(calls) == len(compact._groups[0]) + 2:  # in the second block, after its first group wrote
            raise RuntimeError("a loss that fails once")
        return derivative(f, y)

    monkeypatch.setattr(loss, "derivative", failing)
    with pytest.raises(Exception, match="fails once"):
        compact(w2)
    assert not np.any(compact._scratch)
    monkeypatch.setattr(loss, "derivative", derivative)
    r, a = compact(w2)
    fresh = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm(), blocks)
    fresh(w1)  # the same history: the sums' fixed-point bounds are agreed from the evaluations so far
    r0, a0 = fresh(w2)
    assert r == r0
    np.testing.assert_array_equal(a, a0)


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.125, 0.5])
def test_partials_are_kept_on_supports_exactly_when_numpys_support_sizes_say(monkeypatch, fraction):
    # The choice counts each block's distinct columns with a mark per column; np.unique is the reference.
    from prbmrm.kernels.blocks import row_block

    monkeypatch.setattr(risk_module, "COMPACT_PARTIALS", fraction)
    X = sp.random(600, 5000, density=0.004, format="csr", random_state=4)
    bounds = [0, 7, 100, 101, 350, 600]
    blocks = [(row_block(X, a, b), None, None) for a, b in zip(bounds[:-1], bounds[1:])]
    supports = [np.unique(block.indices) for block, _, _ in blocks]
    want = 16 * sum(len(s) + 1 for s in supports) <= fraction * 8 * len(blocks) * (X.shape[1] + 1)
    partials, scratch = risk_module._partials_storage(True, blocks, X.shape[1])
    assert isinstance(partials, SupportRows) == want and (scratch is not None) == want
    if want:
        for index, support in zip(partials.index, supports):
            np.testing.assert_array_equal(index, np.append(support, X.shape[1]))
