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

ctypedef fused index_t:
    int32_t
    int64_t


cdef _check(const index_t[::1] indptr, Py_ssize_t rows, Py_ssize_t nonzeros):
    if indptr.shape[0] != rows + 1 or (rows and (indptr[0] < 0 or indptr[rows] > nonzeros)):
        raise ValueError("the CSR arrays do not agree (indptr, indices, data and the rows)")


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
