"""The compiled risk pass of scalar losses on dense rows (issue 13, P8: prbmrm.kernels.dense_numba).

References: each loss's numpy formulas with BLAS products
(:meth:`ScalarLoss.loss_gradient` per block, the path the kernel replaces),
and oracles holding only some of the blocks (as a rank does). The
``distributed`` test runs again under mpiexec -n 2 and -n 3
(tests/distributed/test_mpiexec.py): ranks must agree with one rank bitwise.
"""

import numpy as np
import pytest

import prbmrm.kernels.blocks
from helpers import shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local
from prbmrm.losses.scalar import SCALAR_LOSSES
from prbmrm.distributed.oracle import DistributedRisk, run_distributed

# Parameters away from the defaults, so that a parameter the kernel ignored would show.
PARAMS = {"huber_hinge": {"delta": 0.3}, "novelty": {"rho": 0.7}, "quantile": {"tau": 0.8},
          "epsilon_insensitive": {"epsilon": 0.25}, "huber": {"delta": 0.4}}


@pytest.fixture
def compiled(monkeypatch):
    """Take the compiled pass whatever the data's size."""
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", 0)


def data_for(loss, rows=700, features=41, seed=0):
    """Dense rows of density 1/2 and labels the loss accepts (signs, or counts for every regression loss)."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((rows, features)) < 0.5, rng.standard_normal((rows, features)), 0.0)
    if loss.task == "classification":
        y = np.where(rng.random(rows) < 0.5, 1.0, -1.0)
    else:
        y = rng.poisson(2.0, rows).astype(np.float64)
    return X, y, rng.standard_normal(features) * 0.4


def partials_at(oracle, w):
    """The oracle's per-block partial sums at w, as its observer sees them (before they are added)."""
    seen = []
    oracle.observer = lambda _, partials: seen.append(partials.copy())
    oracle(w)
    return seen[0]


def test_every_scalar_loss_has_compiled_formulas():
    assert set(prbmrm.kernels.blocks._DENSE_LOSSES) == set(SCALAR_LOSSES)


@pytest.mark.parametrize("cls", SCALAR_LOSSES, ids=lambda cls: cls.name)
def test_pass_equals_the_numpy_path_per_block(compiled, cls):
    loss = cls(**PARAMS.get(cls.name, {}))
    X, y, w = data_for(loss)
    bounds = np.array([0, 1, 1, 250, 700])
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    assert oracle._dense is not None
    partials = partials_at(oracle, w)
    for partial, a, b in zip(partials, bounds[:-1], bounds[1:]):
        risk, gradient = loss.loss_gradient(w, X[a:b], y[a:b])
        assert partial[-1] == pytest.approx(risk, rel=1e-12, abs=1e-13)
        np.testing.assert_allclose(partial[:-1], gradient, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(gradient).max()))


def test_a_blocks_sums_do_not_depend_on_the_blocks_held_with_it(compiled):
    loss = SCALAR_LOSSES[0]()
    X, y, w = data_for(loss, rows=900)
    whole = partials_at(DistributedRisk(loss, X, y, len(y), SerialComm(), [0, 300, 650, 900]), w)
    alone = partials_at(DistributedRisk(loss, X[300:650], y[300:650], len(y), SerialComm()), w)
    np.testing.assert_array_equal(whole[1], alone[0])


def test_the_pass_is_taken_on_large_dense_data_only(monkeypatch):
    loss = SCALAR_LOSSES[0]()
    X, y, w = data_for(loss)
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", X.size + 1)
    numpy_path = DistributedRisk(loss, X, y, len(y), SerialComm())
    assert numpy_path._dense is None
    monkeypatch.setattr(prbmrm.kernels.blocks, "DENSE_KERNEL_VALUES", X.size)
    compiled_path = DistributedRisk(loss, X, y, len(y), SerialComm())
    assert compiled_path._dense is not None
    np.testing.assert_allclose(compiled_path(w)[1], numpy_path(w)[1], rtol=1e-12, atol=1e-15)
    # Arrays the kernel does not take keep the numpy path: Fortran order, float32 labels, a loss subclass.
    assert prbmrm.kernels.blocks._dense_scalar(loss, np.asfortranarray(X), y, None) is None
    assert prbmrm.kernels.blocks._dense_scalar(loss, X, y.astype(np.float32), None) is None
    assert prbmrm.kernels.blocks._dense_scalar(type("Changed", (type(loss),), {})(), X, y, None) is None


def test_non_finite_scores_make_the_risk_non_finite(compiled):
    loss = dict((cls.name, cls) for cls in SCALAR_LOSSES)["exponential"]()
    X, y, w = data_for(loss)
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm())
    assert oracle(w * 1e4)[0] == np.inf
    hinge = SCALAR_LOSSES[0]()
    w[0] = np.nan
    assert np.isnan(partials_at(DistributedRisk(hinge, X, y, len(y), SerialComm()), w)[0, -1])


@pytest.fixture
def csr_compiled(monkeypatch):
    """Take the compiled CSR pass whatever the data's size."""
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", 0)


def sparse_data_for(loss, rows=700, features=41, seed=0):
    import scipy.sparse as sp

    X, y, w = data_for(loss, rows, features, seed)
    return sp.csr_matrix(np.where(np.random.default_rng(seed + 1).random(X.shape) < 0.3, X, 0.0)), y, w


@pytest.mark.parametrize("cls", SCALAR_LOSSES, ids=lambda cls: cls.name)
def test_csr_pass_equals_scipys_kernels_per_block(csr_compiled, monkeypatch, cls):
    # The gradient adds the same products in the same order as scipy's csc_matvec: bitwise where l'
    # is computed alike (all but the losses through exp); the risk is summed row by row, where numpy
    # sums a chunk pairwise.
    loss = cls(**PARAMS.get(cls.name, {}))
    X, y, w = sparse_data_for(loss)
    bounds = np.array([0, 1, 1, 250, 700])
    compiled = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", 2**62)
    scipy_path = DistributedRisk(loss, X, y, len(y), SerialComm(), bounds)
    assert compiled._csr_compiled is not None and scipy_path._csr_compiled is None
    got, want = partials_at(compiled, w), partials_at(scipy_path, w)
    np.testing.assert_allclose(got[:, -1], want[:, -1], rtol=1e-13, atol=1e-13)
    if cls.name in ("exponential", "logistic", "poisson"):  # l' through exp: libm's against numpy's
        np.testing.assert_allclose(got[:, :-1], want[:, :-1], rtol=1e-13, atol=1e-13)
    else:
        np.testing.assert_array_equal(got[:, :-1], want[:, :-1])


def test_the_csr_pass_is_taken_on_large_data_of_few_columns_only(monkeypatch):
    loss = SCALAR_LOSSES[0]()
    X, y, w = sparse_data_for(loss)
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", X.nnz + 1)
    assert DistributedRisk(loss, X, y, len(y), SerialComm())._csr_compiled is None
    monkeypatch.setattr(prbmrm.kernels.blocks, "CSR_KERNEL_NONZEROS", X.nnz)
    assert DistributedRisk(loss, X, y, len(y), SerialComm())._csr_compiled is not None
    # Matrices the kernel does not take keep scipy's kernels: too many columns, 64-bit indices,
    # compact sums, a loss subclass.
    wide = X.copy()
    wide._shape = (X.shape[0], prbmrm.kernels.blocks.CSR_KERNEL_COLUMNS + 1)
    assert prbmrm.kernels.blocks._csr_compiled(loss, wide, y, None, False) is None
    long_indices = X.copy()
    long_indices.indices, long_indices.indptr = X.indices.astype(np.int64), X.indptr.astype(np.int64)
    assert prbmrm.kernels.blocks._csr_compiled(loss, long_indices, y, None, False) is None
    assert prbmrm.kernels.blocks._csr_compiled(loss, X, y, None, True) is None
    assert prbmrm.kernels.blocks._csr_compiled(type("Changed", (type(loss),), {})(), X, y, None, False) is None
    assert prbmrm.kernels.blocks._csr_compiled(loss, X, y, None, False) is not None


def test_non_finite_scores_make_the_csr_risk_non_finite(csr_compiled):
    loss = SCALAR_LOSSES[0]()
    X, y, w = sparse_data_for(loss)
    w[:] = np.nan
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm())
    assert oracle._csr_compiled is not None and np.isnan(partials_at(oracle, w)[0, -1])


@pytest.mark.distributed
@pytest.mark.parametrize("held", ["dense", "csr"])
def test_ranks_agree_with_one_rank_bitwise(compiled, csr_compiled, held, comm, mpi_tmp_path):
    # The compiled passes on any number of ranks: hinge on dense rows, logistic (l' through exp) on CSR rows.
    dense = held == "dense"
    loss = dict((cls.name, cls) for cls in SCALAR_LOSSES)["hinge" if dense else "logistic"]()
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
