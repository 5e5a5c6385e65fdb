# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The fixed-point limbs of many partial sums at once (:class:`prbmrm.distributed.exact.FixedPointSum`).

One pass over the partials (one row per canonical block) instead of a
dozen numpy passes with their temporaries: on a9a (256 blocks, 124
components) the numpy form cost more than the rest of an evaluation's
bookkeeping. Each entry goes through the same float64 operations as that
numpy form (a product by a power of two, floor, a difference, rint, a cast
of an integer-valued float), which are exact or correctly rounded, so the
limbs are bitwise those; their sums over rows are integer sums, exact in
any order. The partials may be a slice of columns of a wider array (the sums go a chunk of columns at a
time).
"""

from libc.math cimport fabs, floor, isnan, ldexp, rint
from libc.stdint cimport int64_t


def column_max_abs(const double[:, :] partials, double[::1] out):
    """Write ``max(0, max_k |partials[k, j]|)`` into ``out[j]``; NaN where a column holds a NaN.

    The same as ``np.maximum(np.max(p, axis=0, initial=0.0), -np.min(p, axis=0, initial=0.0))``
    up to the sign of a zero.
    """
    cdef Py_ssize_t rows = partials.shape[0], n = partials.shape[1], k, j
    cdef double a
    if out.shape[0] != n:
        raise ValueError("one maximum per column")
    with nogil:
        for j in range(n):
            out[j] = 0.0
        for k in range(rows):
            for j in range(n):
                a = fabs(partials[k, j])
                if a > out[j] or isnan(a):  # NaN once seen stays: nothing compares greater
                    out[j] = a


def fixed_point_limbs(const double[:, :] partials, const double[::1] scale, int bits,
                      int64_t[::1] high, int64_t[::1] low):
    """Write the sums over rows of the two fixed-point limbs of every entry of `partials` into `high` and `low`.

    Entry ``p`` of column j is ``s = p * scale[j]`` on the grid (`scale` holds powers of two), its
    limbs ``h = floor(s * 2^-bits)`` and ``rint(s - h * 2^bits)``. Every entry must be below
    ``2^(2 bits)`` on the grid (the bounds guarantee it), and the rows few enough for the integer sums.
    """
    cdef Py_ssize_t rows = partials.shape[0], n = partials.shape[1], k, j
    cdef double down = ldexp(1.0, -bits), up = ldexp(1.0, bits), s, h
    if scale.shape[0] != n or high.shape[0] != n or low.shape[0] != n:
        raise ValueError("one scale and one limb of each kind per column")
    with nogil:
        for j in range(n):
            high[j] = 0
            low[j] = 0
        for k in range(rows):
            for j in range(n):
                s = partials[k, j] * scale[j]
                h = floor(s * down)
                high[j] += <int64_t>h
                low[j] += <int64_t>rint(s - h * up)
