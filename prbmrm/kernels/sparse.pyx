# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Products of CSR rows with dense vectors, in the order scipy's sparse kernels use, without their checks.

scipy's public products (``X @ w``, ``X[rows]``) check and convert their
operands on every call, which costs more than the products on a9a-sized
groups of rows; these loops take the arrays as they are. Each runs the
floating-point operations of scipy's ``csr_matvec`` and ``csc_matvec`` in
the same order (a row's sum from 0.0 in order of its nonzeros; ``out[j] +=
data[k] * v[i]`` row by row), so the results are bitwise scipy's.

The indices must lie within the matrix (the loader checks the shards');
`indptr` and `indices` share one integer type (int32 or int64).
"""

from libc.stdint cimport int32_t, int64_t

import numpy as np
import scipy.sparse as sp

ctypedef fused index_t:
    int32_t
    int64_t


cdef _check(const index_t[::1] indptr, Py_ssize_t rows, Py_ssize_t nonzeros):
    if indptr.shape[0] != rows + 1 or (rows and (indptr[0] < 0 or indptr[rows] > nonzeros)):
        raise ValueError("the CSR arrays do not agree (indptr, indices, data and the rows)")


def compiled_rows(X):
    """Whether these products take `X` as it is: a CSR matrix of float64 values whose indptr and indices
    share one type (int32 or int64)."""
    return (sp.issparse(X) and X.format == "csr" and X.dtype == np.float64
            and X.indptr.dtype == X.indices.dtype and X.indices.dtype in (np.int32, np.int64))


def csr_matvec(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
               const double[::1] x, double[::1] out):
    """Write ``X @ x`` into `out` (one entry per row of the CSR matrix X), each row summed from 0.0 in order."""
    cdef Py_ssize_t rows = out.shape[0], i, k
    cdef double total
    _check(indptr, rows, min(indices.shape[0], data.shape[0]))
    with nogil:
        for i in range(rows):
            total = 0.0
            for k in range(indptr[i], indptr[i + 1]):
                total += data[k] * x[indices[k]]
            out[i] = total


def csr_rmatvec(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                const double[::1] v, double[::1] out):
    """Add ``X^T v`` onto `out` (``out[j] += data[k] * v[i]`` over the rows i of X in order and their nonzeros).

    `indptr` has one entry more than `v` and may start anywhere in `indices` and `data` (absolute offsets).
    """
    cdef Py_ssize_t rows = v.shape[0], i, k
    cdef double c
    _check(indptr, rows, min(indices.shape[0], data.shape[0]))
    with nogil:
        for i in range(rows):
            c = v[i]
            for k in range(indptr[i], indptr[i + 1]):
                out[indices[k]] += data[k] * c


def csr_rmatmat(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                const double[:, ::1] V, double[:, ::1] out):
    """Add ``X^T V`` onto `out` (d x k): ``out[j, :] += data[k] * V[i, :]`` over the rows i of X in order
    and their nonzeros, the order of scipy's ``csc_matvecs`` for ``X.T @ V``.

    `indptr` has one entry more than `V` has rows, as in :func:`csr_rmatvec`.
    """
    cdef Py_ssize_t rows = V.shape[0], width = V.shape[1], i, k, j
    cdef double c
    _check(indptr, rows, min(indices.shape[0], data.shape[0]))
    if out.shape[1] != width:
        raise ValueError("out and V differ in their number of columns")
    with nogil:
        for i in range(rows):
            for k in range(indptr[i], indptr[i + 1]):
                c = data[k]
                for j in range(width):
                    out[indices[k], j] += c * V[i, j]


def csr_rows(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
             const Py_ssize_t[::1] rows, const index_t[::1] new_indptr, index_t[::1] new_indices,
             double[::1] new_data):
    """Copy the nonzeros of `rows` (in that order) into `new_indices` and `new_data`, laid out by `new_indptr`."""
    cdef Py_ssize_t n = indptr.shape[0] - 1, r, i, k, at
    _check(indptr, n, min(indices.shape[0], data.shape[0]))
    if new_indptr.shape[0] != rows.shape[0] + 1:
        raise ValueError("new_indptr needs one entry more than rows")
    for r in range(rows.shape[0]):
        i = rows[r]
        if i < 0 or i >= n or new_indptr[r + 1] - new_indptr[r] != indptr[i + 1] - indptr[i]:
            raise ValueError("a row is outside the matrix or new_indptr does not fit it")
    if rows.shape[0] and (new_indptr[0] != 0 or new_indptr[rows.shape[0]] > min(new_indices.shape[0],
                                                                                 new_data.shape[0])):
        raise ValueError("new_indptr points outside new_indices or new_data")
    with nogil:
        for r in range(rows.shape[0]):
            i = rows[r]
            at = new_indptr[r]
            for k in range(indptr[i], indptr[i + 1]):
                new_indices[at] = indices[k]
                new_data[at] = data[k]
                at += 1



def hinge_dual_pass(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                    const double[::1] y, const double[::1] diagonal, const Py_ssize_t[::1] order,
                    double upper, double largest_before, double smallest_before, double[::1] alpha,
                    double[::1] w, signed char[::1] keep):
    """One pass of dual coordinate descent for the hinge SVM over the CSR rows in `order`, with shrinking
    (Hsieh et al. 2008, Alg. 1 and Sec. 3.2, as LIBLINEAR's ``-s 3``).

    The dual is ``max sum_i alpha_i - ||sum_i alpha_i y_i x_i||^2 / 2`` over ``0 <= alpha_i <= upper``
    with ``w = sum_i alpha_i y_i x_i`` kept up to date: for each row i in turn, ``G = y_i <x_i, w> - 1``
    and ``alpha_i`` moves to ``clip(alpha_i - G / diagonal[i], 0, upper)`` (to `upper` for an empty
    row, ``diagonal[i] == 0``). A row at a bound whose G points out of the box by more than the last
    pass's extreme projected gradients (`largest_before`, `smallest_before`) is left alone and
    ``keep[t]`` set to 0 (else 1): shrinking, which only chooses the rows a pass visits. Updates
    `alpha` and `w` in place; returns the largest and smallest projected gradient of the rows kept and
    the sum over them of their duality-gap terms as the pass comes to each row, before its update,
    ``upper * max(0, -G) + alpha_i G`` with ``G = y_i <x_i, w> - 1`` (an estimate of the gap ``P(w) -
    D(alpha)``, whose terms these are: the rows left alone contribute about 0, the others' G moved with
    the later updates).
    """
    cdef Py_ssize_t rows = order.shape[0], t, i, k
    cdef double g, projected, old, change, largest = -1e300, smallest = 1e300, estimate = 0.0
    _check(indptr, y.shape[0], min(indices.shape[0], data.shape[0]))
    if alpha.shape[0] != y.shape[0] or diagonal.shape[0] != y.shape[0] or keep.shape[0] != rows:
        raise ValueError("alpha, diagonal and y differ in length, or keep and order")
    for t in range(rows):
        if order[t] < 0 or order[t] >= y.shape[0]:
            raise ValueError("an entry of order is not a row")
    with nogil:
        for t in range(rows):
            i = order[t]
            g = 0.0
            for k in range(indptr[i], indptr[i + 1]):
                g += data[k] * w[indices[k]]
            g = y[i] * g - 1.0
            old = alpha[i]
            keep[t] = 1
            projected = g
            if old == 0.0:
                if g > largest_before:
                    keep[t] = 0
                    continue
                projected = min(g, 0.0)
            elif old == upper:
                if g < smallest_before:
                    keep[t] = 0
                    continue
                projected = max(g, 0.0)
            largest = max(largest, projected)
            smallest = min(smallest, projected)
            estimate += upper * max(-g, 0.0) + old * g
            if projected == 0.0:
                continue
            alpha[i] = min(max(old - g / diagonal[i], 0.0), upper) if diagonal[i] > 0.0 else upper
            change = (alpha[i] - old) * y[i]
            for k in range(indptr[i], indptr[i + 1]):
                w[indices[k]] += change * data[k]
    return largest, smallest, estimate
