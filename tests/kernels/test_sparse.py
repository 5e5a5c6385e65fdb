"""The CSR products of prbmrm.kernels.sparse against scipy's public ``X @ x``, ``X.T @ v`` and ``X[rows]``.

scipy's products add in the same order (a row's sum from 0.0 in order of
its nonzeros; ``X.T @ v`` row by row), so the results agree bitwise.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from prbmrm.kernels.sparse import compiled_rows, csr_matvec, csr_rmatmat, csr_rmatvec, csr_rows
from prbmrm.losses.vector import flat_gradient


@pytest.fixture(params=[np.int32, np.int64])
def matrix(request):
    X = sp.random(400, 90, density=0.1, random_state=3, format="csr")
    X.indices, X.indptr = X.indices.astype(request.param), X.indptr.astype(request.param)
    return X


def test_matvec_is_scipys(matrix):
    x = np.random.default_rng(0).normal(size=90)
    out = np.full(400, np.nan)
    csr_matvec(matrix.indptr, matrix.indices, matrix.data, x, out)
    np.testing.assert_array_equal(out, matrix @ x)


def test_rmatvec_adds_scipys_transposed_product_over_a_row_range(matrix):
    v = np.random.default_rng(1).normal(size=400)
    out = np.zeros(90)
    csr_rmatvec(matrix.indptr, matrix.indices, matrix.data, v, out)
    np.testing.assert_array_equal(out, matrix.T @ v)
    csr_rmatvec(matrix.indptr, matrix.indices, matrix.data, v, out)  # it adds onto what out holds
    np.testing.assert_allclose(out, 2.0 * (matrix.T @ v), rtol=1e-13, atol=1e-13)
    part = np.zeros(90)  # rows 100:250 through their slice of indptr (absolute offsets)
    csr_rmatvec(matrix.indptr[100:251], matrix.indices, matrix.data, v[100:250], part)
    np.testing.assert_array_equal(part, matrix[100:250].T @ v[100:250])


@pytest.mark.parametrize("width", [1, 2, 5])
def test_rmatmat_is_scipys_transposed_product_with_a_dense_matrix(matrix, width):
    matrix = matrix.copy()
    matrix.data[matrix.indptr[7]:matrix.indptr[9]] = 0.0  # explicit zeros stay in the sum, as in scipy's
    empty = sp.csr_matrix((3, 90))  # rows of no nonzeros
    rows = sp.vstack([matrix, empty], format="csr")
    rows.indices, rows.indptr = rows.indices.astype(matrix.indices.dtype), rows.indptr.astype(matrix.indptr.dtype)
    assert compiled_rows(rows)
    V = np.random.default_rng(width).normal(size=(403, width))
    out = np.zeros((90, width))
    csr_rmatmat(rows.indptr, rows.indices, rows.data, V, out)
    np.testing.assert_array_equal(out, rows.T @ V)
    np.testing.assert_array_equal(flat_gradient(rows, V), (rows.T @ V).ravel())
    part = np.zeros((90, width))  # rows 100:250 through their slice of indptr (absolute offsets)
    csr_rmatmat(rows.indptr[100:251], rows.indices, rows.data, V[100:250], part)
    np.testing.assert_array_equal(part, rows[100:250].T @ V[100:250])
    with pytest.raises(ValueError):
        csr_rmatmat(rows.indptr, rows.indices, rows.data, V, np.zeros((90, width + 1)))


def test_rows_of_other_types_take_scipys_products():
    X = sp.random(30, 8, density=0.3, random_state=4, format="csr")
    mixed = X.copy()
    mixed.indices = mixed.indices.astype(np.int64)  # indptr stays int32
    V = np.random.default_rng(5).normal(size=(30, 3))
    for other in (X.tocsc(), X.astype(np.float32), mixed, X.toarray()):
        assert not compiled_rows(other)
        np.testing.assert_array_equal(flat_gradient(other, V), np.asarray(other.T @ V).ravel())


def test_rows_are_scipys_row_selection(matrix):
    rows = np.array([0, 5, 6, 200, 399], dtype=np.intp)
    starts = matrix.indptr[rows]
    indptr = np.zeros(rows.size + 1, dtype=matrix.indptr.dtype)
    np.cumsum(matrix.indptr[rows + 1] - starts, out=indptr[1:])
    indices, data = np.empty(indptr[-1], dtype=matrix.indices.dtype), np.empty(indptr[-1])
    csr_rows(matrix.indptr, matrix.indices, matrix.data, rows, indptr, indices, data)
    picked = sp.csr_matrix((data, indices, indptr), shape=(rows.size, 90))
    assert (picked != matrix[rows]).nnz == 0


def test_inconsistent_arrays_are_refused(matrix):
    with pytest.raises(ValueError):
        csr_matvec(matrix.indptr[:-1], matrix.indices, matrix.data, np.zeros(90), np.zeros(400))
    with pytest.raises(ValueError):
        csr_rows(matrix.indptr, matrix.indices, matrix.data, np.array([400], dtype=np.intp),
                 np.zeros(2, dtype=matrix.indptr.dtype), matrix.indices[:0].copy(), np.zeros(0))
