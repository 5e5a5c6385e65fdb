# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Loops over sparse planes (indices and values): their support, dot products and scatter-add.

Each runs the floating-point operations of the numpy code it replaces in
the same order (a sum from 0.0 in index order; ``out[i] += weight *
value``, as ``out[index] += weight * values`` does), so the results are
bitwise those, without the temporaries: ``out[index] += weight * values``
writes two vectors of the plane's length first, and a plane of a million
nonzeros is 8 MB each. A plane's indices increase, are int32 or int64 (one
type per call) and lie within the dense vectors (the bundle makes them).
"""

from libc.stdint cimport int32_t, int64_t

ctypedef fused index_t:
    int32_t
    int64_t

CHUNK = 2 ** 15
"""Coordinates per slice of the blocked kernels: 256 KB of a dense vector, which stays in a core's L2 cache."""

GROUP = 16
"""Planes per call of the blocked kernels."""

cdef enum:
    _GROUP = 16
    _CHUNK = 32768


def _within(const index_t[::1] index, Py_ssize_t size):
    if index.shape[0] and (index[0] < 0 or index[index.shape[0] - 1] >= size):
        raise IndexError("a plane's indices lie outside the vector")


def sparse_dot(const index_t[::1] index, const double[::1] values, const double[::1] x):
    """Return ``sum_k values[k] * x[index[k]]``, summed from 0.0 in order of k."""
    cdef double total = 0.0
    cdef Py_ssize_t k
    if index.shape[0] != values.shape[0]:
        raise ValueError("a plane needs one value per index")
    _within(index, x.shape[0])
    with nogil:
        for k in range(index.shape[0]):
            total += values[k] * x[index[k]]
    return total


def sparse_dots(const index_t[::1] index, const double[::1] values, const double[::1] x, const double[::1] y):
    """Return :func:`sparse_dot` of the plane with `x` and with `y`, reading the plane once."""
    cdef double first = 0.0, second = 0.0, value
    cdef Py_ssize_t k, i
    if index.shape[0] != values.shape[0] or x.shape[0] != y.shape[0]:
        raise ValueError("a plane needs one value per index, and the vectors one size")
    _within(index, x.shape[0])
    with nogil:
        for k in range(index.shape[0]):
            value = values[k]
            i = index[k]
            first += value * x[i]
            second += value * y[i]
    return first, second


def fill_support(const double[::1] a, index_t[::1] index, double[::1] values):
    """Write the positions and values of the nonzeros of `a` (``np.flatnonzero``'s) into `index` and `values`.

    Both must hold one slot more than `a` has nonzeros: without a branch
    every coordinate is written to the next free slot, which only a nonzero
    advances (5x faster than ``flatnonzero`` and a gather on a million
    nonzeros among 4M coordinates; a branch per coordinate mispredicts).
    """
    cdef Py_ssize_t i, k = 0, n = a.shape[0], slots = min(index.shape[0], values.shape[0])
    cdef double x
    for i in range(n):  # counted first: the slots must hold them all
        k += a[i] != 0.0
    if k >= slots:
        raise ValueError("fill_support needs one slot more than the nonzeros")
    k = 0
    with nogil:
        for i in range(n):
            x = a[i]
            index[k] = <index_t> i
            values[k] = x
            k += x != 0.0


cdef Py_ssize_t search(const index_t* index, Py_ssize_t low, Py_ssize_t high, Py_ssize_t value) noexcept nogil:
    """The first k in [low, high) with ``index[k] >= value`` (high if none): ``np.searchsorted``'s left side."""
    cdef Py_ssize_t middle
    while low < high:
        middle = low + (high - low) // 2
        if index[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


cdef void dot_group(const index_t** index, const double** values, const Py_ssize_t* sizes, const double* x,
                    Py_ssize_t n, double* out) noexcept nogil:
    cdef Py_ssize_t cursor[_GROUP]
    cdef Py_ssize_t stop[_GROUP]
    cdef double total[_GROUP]
    cdef Py_ssize_t start, p, g, j, k, m, c0, c1, c2, c3
    cdef double s0, s1, s2, s3
    cdef const index_t* i0
    cdef const index_t* i1
    cdef const index_t* i2
    cdef const index_t* i3
    cdef const double* v0
    cdef const double* v1
    cdef const double* v2
    cdef const double* v3
    for p in range(_GROUP):
        cursor[p] = 0
        total[p] = 0.0
    start = 0
    while start < n:
        for p in range(_GROUP):
            stop[p] = search(index[p], cursor[p], sizes[p], start + _CHUNK)
        for g in range(0, 16, 4):
            i0, i1, i2, i3 = index[g], index[g + 1], index[g + 2], index[g + 3]
            v0, v1, v2, v3 = values[g], values[g + 1], values[g + 2], values[g + 3]
            c0, c1, c2, c3 = cursor[g], cursor[g + 1], cursor[g + 2], cursor[g + 3]
            s0, s1, s2, s3 = total[g], total[g + 1], total[g + 2], total[g + 3]
            m = min(stop[g] - c0, stop[g + 1] - c1, stop[g + 2] - c2, stop[g + 3] - c3)
            for j in range(m):
                s0 += v0[c0 + j] * x[i0[c0 + j]]
                s1 += v1[c1 + j] * x[i1[c1 + j]]
                s2 += v2[c2 + j] * x[i2[c2 + j]]
                s3 += v3[c3 + j] * x[i3[c3 + j]]
            total[g], total[g + 1], total[g + 2], total[g + 3] = s0, s1, s2, s3
            cursor[g], cursor[g + 1], cursor[g + 2], cursor[g + 3] = c0 + m, c1 + m, c2 + m, c3 + m
        # The longer planes' rest of the slice, one at a time.
        for p in range(_GROUP):
            s0 = total[p]
            for k in range(cursor[p], stop[p]):
                s0 += values[p][k] * x[index[p][k]]
            total[p] = s0
            cursor[p] = stop[p]
        start += _CHUNK
    for p in range(_GROUP):
        out[p] = total[p]


cdef void scatter_group(const index_t** index, const double** values, const Py_ssize_t* sizes,
                        const Py_ssize_t* lengths, const double* weights, double* out,
                        Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t cursor[_GROUP]
    cdef Py_ssize_t start, end, p, i, k, stop
    cdef double weight
    for p in range(_GROUP):
        cursor[p] = 0
    start = 0
    while start < n:
        end = min(start + _CHUNK, n)
        for p in range(_GROUP):
            weight = weights[p]
            if weight == 0.0:
                continue
            if sizes[p] == 0 and lengths[p] == n:
                for i in range(start, end):
                    out[i] += weight * values[p][i]
                continue
            stop = search(index[p], cursor[p], sizes[p], end)
            for k in range(cursor[p], stop):
                out[index[p][k]] += weight * values[p][k]
            cursor[p] = stop
        start = end


cdef int gather(tuple indices, tuple values, Py_ssize_t n, const index_t** index, const double** value,
                Py_ssize_t* sizes, Py_ssize_t* lengths, bint dense) except -1:
    """Fill the pointers and sizes of a group's planes (checked: one value per index, or with `dense` a dense
    plane: no indices and `n` values)."""
    cdef const index_t[::1] one_index
    cdef const double[::1] one_values
    cdef Py_ssize_t p
    if len(indices) != _GROUP or len(values) != _GROUP:
        raise ValueError(f"a group holds {GROUP} planes")
    for p in range(_GROUP):
        one_index = indices[p]
        one_values = values[p]
        _within(one_index, n)
        if one_index.shape[0] != one_values.shape[0] and not (dense and one_index.shape[0] == 0
                                                               and one_values.shape[0] == n):
            raise ValueError("a plane needs one value per index" + (" (or, dense, one per coordinate)" if dense else ""))
        index[p] = &one_index[0]  # the arrays outlive the call: the caller holds them
        value[p] = &one_values[0]
        sizes[p] = one_index.shape[0]
        lengths[p] = one_values.shape[0]
    return 0


def sparse_dot_group(tuple indices, tuple values, const double[::1] x, double[::1] out):
    """``out[p] = sparse_dot(indices[p], values[p], x)`` for the :data:`GROUP` planes, bitwise, 30% faster.

    One plane at a time, a plane of a fifth of d = 2^22 coordinates touches
    nearly every cache line of `x` (32 MB, more than the cache), and its sum
    waits on each addition before the next. Here `x` is taken a slice of
    :data:`CHUNK` coordinates at a time, and the entries of every plane of
    the group in that slice go through it while it is in cache, four planes
    in lockstep: their independent sums advance together. Each plane's sum
    still runs from 0.0 in order of k. A group of fewer planes is padded
    with empty ones; all the planes are sparse and their indices of one type.
    """
    cdef const int32_t* index32[_GROUP]
    cdef const int64_t* index64[_GROUP]
    cdef const double* value[_GROUP]
    cdef Py_ssize_t sizes[_GROUP]
    cdef Py_ssize_t lengths[_GROUP]
    if out.shape[0] != _GROUP:
        raise ValueError(f"out holds {GROUP} values")
    if _wide(indices):
        gather(indices, values, x.shape[0], index64, value, sizes, lengths, False)
        with nogil:
            dot_group(index64, value, sizes, &x[0], x.shape[0], &out[0])
    else:
        gather(indices, values, x.shape[0], index32, value, sizes, lengths, False)
        with nogil:
            dot_group(index32, value, sizes, &x[0], x.shape[0], &out[0])


def scatter_add_group(tuple indices, tuple values, const double[::1] weights, double[::1] out):
    """``out += weights[p] * plane p`` for p in order, bitwise as plane by plane (``out[index[k]] +=
    weight * values[k]``; numpy's ``out += weight * values`` for a dense plane), 15% faster.

    `out` is written a slice of :data:`CHUNK` coordinates at a time (as
    :func:`sparse_dot_group` reads `x`); per coordinate the planes still
    add in order. A plane with no indices and ``out.size`` values is dense.
    A zero weight adds only zeros: its plane is skipped, which leaves every
    bit of `out` (and pads a group of fewer planes).
    """
    cdef const int32_t* index32[_GROUP]
    cdef const int64_t* index64[_GROUP]
    cdef const double* value[_GROUP]
    cdef Py_ssize_t sizes[_GROUP]
    cdef Py_ssize_t lengths[_GROUP]
    if weights.shape[0] != _GROUP:
        raise ValueError(f"weights holds {GROUP} values")
    if _wide(indices):
        gather(indices, values, out.shape[0], index64, value, sizes, lengths, True)
        with nogil:
            scatter_group(index64, value, sizes, lengths, &weights[0], &out[0], out.shape[0])
    else:
        gather(indices, values, out.shape[0], index32, value, sizes, lengths, True)
        with nogil:
            scatter_group(index32, value, sizes, lengths, &weights[0], &out[0], out.shape[0])


def _wide(tuple indices):
    """Whether the planes' indices are int64 (else int32; a TypeError for another type)."""
    itemsize = getattr(indices[0], "itemsize", 0) if indices else 0
    if itemsize not in (4, 8) or indices[0].dtype.kind != "i":
        raise TypeError("a plane's indices are int32 or int64")
    return itemsize == 8
