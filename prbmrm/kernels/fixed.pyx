# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The fixed-point limbs of many partial sums at once (:class:`prbmrm.distributed.exact.FixedPointSum`).

One pass over the partials (one row per canonical block) instead of a
dozen numpy passes with their temporaries: on kddcup99 (256 blocks, 119
components) the numpy form cost more than the rest of an evaluation's
bookkeeping. Each entry goes through the same float64 operations as that
numpy form (a product by a power of two, floor, a difference, rint, a cast
of an integer-valued float), which are exact or correctly rounded, so the
limbs are bitwise those; their sums over rows are integer sums, exact in
any order. floor and rint are written out (:func:`_floor`, :func:`_rint`): the
C library's are calls, not instructions, on the baseline x86-64 ISA, and cost
most of the pass. The partials may be a slice of columns of a wider array (the sums go a chunk of columns at a
time).
"""

from libc.math cimport fabs, isnan, ldexp
from libc.stdint cimport int64_t


cdef double _INTEGERS = 4503599627370496.0  # 2^52: from here up every float64 is an integer


cdef inline int64_t _floor(double x) noexcept nogil:
    """floor(x) for |x| < 2^63: the truncation (toward zero, exact), less one where it rounded up."""
    cdef int64_t t = <int64_t>x
    return t - (<double>t > x)  # t converts back exactly: below 2^52 it is small, above it is x


cdef inline int64_t _rint(double x) noexcept nogil:
    """rint(x) (the nearest integer, ties to even) for 0 <= x < 2^63: below 2^52, x + 2^52 lies where the floats
    are the integers, so the sum rounds x's fraction away as rint does, and taking 2^52 off again is exact (the
    kernels are built without value-changing optimizations, setup.py)."""
    if x < _INTEGERS:
        x = (x + _INTEGERS) - _INTEGERS
    return <int64_t>x


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
    """Write the sums over rows of the two fixed-point limbs of every entry of `partials` into `high` and `low`;
    return False (the limbs then unfinished) at the first entry that is not below ``2^(2 bits)`` on the grid.

    Entry ``p`` of column j is ``s = p * scale[j]`` on the grid (`scale` holds powers of two), its
    limbs ``h = floor(s * 2^-bits)`` and ``rint(s - h * 2^bits)``. An entry at or beyond ``2^(2 bits)`` on
    the grid (or NaN) has reached its component's bound: the bounds must grow first
    (:meth:`prbmrm.distributed.exact.FixedPointSum.rescale`), so the check is the pass itself, not a
    pass of its own. The rows must be few enough for the integer sums.
    """
    cdef bint fits
    if scale.shape[0] != partials.shape[1] or high.shape[0] != partials.shape[1] or low.shape[0] != partials.shape[1]:
        raise ValueError("one scale and one limb of each kind per column")
    with nogil:
        fits = _limbs(partials, scale, bits, high, low)
    return fits


cdef bint _limbs(const double[:, :] partials, const double[::1] scale, int bits, int64_t[::1] high,
                 int64_t[::1] low) noexcept nogil:
    cdef Py_ssize_t rows = partials.shape[0], n = partials.shape[1], k, j
    cdef double down = ldexp(1.0, -bits), up = ldexp(1.0, bits), limit = ldexp(1.0, 2 * bits), s
    cdef int64_t h
    for j in range(n):
        high[j] = 0
        low[j] = 0
    for k in range(rows):
        for j in range(n):
            if partials[k, j] == 0.0:  # its limbs are 0 and 0 (-0.0 too): a block's triangle is mostly zeros
                continue
            s = partials[k, j] * scale[j]
            if not fabs(s) < limit:  # NaN compares false too
                return False
            h = _floor(s * down)
            high[j] += h
            low[j] += _rint(s - <double>h * up)  # exact, in [0, 2^bits)
    return True


def fixed_point_sums(const int64_t[::1] high, const int64_t[::1] low, const short[::1] exponent, int bits,
                     double[::1] out):
    """Write the float64 sums of the two-limb fixed-point sums (`high`, `low`) into `out`.

    Component j's grids are ``2^(exponent[j] - bits)`` (high) and ``2^(exponent[j] - 2 bits)`` (low); the
    low sums are >= 0 and carry into the high ones. The same float64 operations as the numpy form
    ``ldexp(float(high + (low >> bits)), e - bits) + ldexp(float(low & (2^bits - 1)), e - 2 bits)``, so
    bitwise its result, in one pass without temporaries (the numpy form's ten passes cost more than
    the rest of a small sum's bookkeeping).
    """
    cdef Py_ssize_t n = out.shape[0], j
    cdef int64_t mask = (<int64_t>1 << bits) - 1
    if high.shape[0] != n or low.shape[0] != n or exponent.shape[0] != n:
        raise ValueError("one limb of each kind and one exponent per sum")
    with nogil:
        for j in range(n):
            out[j] = (ldexp(<double>(high[j] + (low[j] >> bits)), exponent[j] - bits)
                      + ldexp(<double>(low[j] & mask), exponent[j] - 2 * bits))
