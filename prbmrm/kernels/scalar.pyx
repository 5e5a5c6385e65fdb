# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The built-in scalar losses l(f, y), each written once, and the compiled risk passes that use them.

Each loss of :mod:`prbmrm.losses.scalar` is a pair of ``cdef inline``
functions here (its value and its derivative in f), as scikit-learn's
``sklearn/_loss/_loss.pyx.tp`` writes its losses once for Python and the
compiled loops alike. A :class:`CyLoss` subclass per loss carries them (and
the loss's parameter) into the loops written once in :class:`CyLoss`: the
elementwise ``value`` and ``derivative`` that the Python classes call, the
risk pass on dense rows (:meth:`CyLoss.dense_pass`) and the second half of
the pass on CSR rows (:meth:`CyLoss.csr_update`). A Python loss class names
its counterpart in its ``compiled`` attribute.

The formulas follow numpy's semantics where they differ from C's: a NaN
in either operand of ``maximum``, ``minimum`` or ``clip`` propagates (so a
NaN score makes the risk NaN, and the solver reports it), and a boolean
mask multiplies as 0.0 or 1.0. The module is built with
``-ffp-contract=off``: every operation rounds as written, so results are
the same bitwise on every machine and every number of ranks.
"""

import numpy as np

from libc.math cimport exp, fabs, log1p
from libc.stdint cimport int32_t, int64_t

ctypedef fused index_t:
    int32_t
    int64_t

cdef double LOG2 = 0.693147180559945309417232121458176568  # numpy's NPY_LOGE2


# numpy's elementwise semantics (maximum, minimum, clip, sign, logaddexp), NaN propagating.

cdef inline double maximum(double a, double b) noexcept nogil:
    return a if (a >= b or a != a) else b


cdef inline double clip(double x, double low, double high) noexcept nogil:
    cdef double t = x if (x != x or x > low) else low
    return t if (t != t or t < high) else high


cdef inline double sign(double x) noexcept nogil:
    if x > 0.0:
        return 1.0
    if x < 0.0:
        return -1.0
    return x if x != x else 0.0


cdef inline double mask(bint condition) noexcept nogil:
    return 1.0 if condition else 0.0


cdef inline double expit_of(double z, double e) noexcept nogil:
    """``1 / (1 + exp(-z))`` without overflow, given ``e = exp(-|z|)``."""
    if z >= 0.0:
        return 1.0 / (1.0 + e)
    return e / (1.0 + e)


cdef inline double log1pexp_of(double z, double e) noexcept nogil:
    """``log(1 + exp(z))`` (numpy's ``logaddexp(0, z)``), given ``e = exp(-|z|)``."""
    if z == 0.0:
        return LOG2
    if z < 0.0:
        return log1p(e)
    if z > 0.0:
        return z + log1p(e)
    return z + z  # NaN


cdef inline double expit(double z) noexcept nogil:
    """``1 / (1 + exp(-z))`` without overflow."""
    return expit_of(z, exp(-fabs(z)))


cdef inline double log1pexp(double z) noexcept nogil:
    """``log(1 + exp(z))``: numpy's ``logaddexp(0, z)``."""
    return log1pexp_of(z, exp(-fabs(z)))


# The losses: value and derivative in f, labels y (paper 000, Table 5; paper 002, Table 1).

cdef inline double hinge_value(double f, double y) noexcept nogil:
    return maximum(0.0, 1.0 - y * f)


cdef inline double hinge_derivative(double f, double y) noexcept nogil:
    return -y * mask(y * f < 1.0)


cdef inline double squared_hinge_value(double f, double y) noexcept nogil:
    cdef double m = maximum(0.0, 1.0 - y * f)
    return 0.5 * (m * m)


cdef inline double squared_hinge_derivative(double f, double y) noexcept nogil:
    return -y * maximum(0.0, 1.0 - y * f)


cdef inline double squared_hinge_curvature(double f, double y) noexcept nogil:
    # The generalized second derivative (Mangasarian 2002), as LIBLINEAR's -s 2 uses.
    return (y * y) * mask(y * f < 1.0)


cdef inline double zero_hinge_value(double f, double y) noexcept nogil:
    return maximum(0.0, -y * f)


cdef inline double zero_hinge_derivative(double f, double y) noexcept nogil:
    return -y * mask(y * f < 0.0)


cdef inline double squared_zero_hinge_value(double f, double y) noexcept nogil:
    cdef double m = maximum(0.0, -y * f)
    return 0.5 * (m * m)


cdef inline double squared_zero_hinge_derivative(double f, double y) noexcept nogil:
    return -y * maximum(0.0, -y * f)


cdef inline double squared_zero_hinge_curvature(double f, double y) noexcept nogil:
    return (y * y) * mask(y * f < 0.0)


cdef inline double exponential_value(double f, double y) noexcept nogil:
    return exp(-y * f)


cdef inline double exponential_derivative(double f, double y) noexcept nogil:
    return -y * exp(-y * f)


cdef inline double exponential_curvature(double f, double y) noexcept nogil:
    return (y * y) * exp(-y * f)


cdef inline double logistic_value(double f, double y) noexcept nogil:
    return log1pexp(-y * f)


cdef inline double logistic_derivative(double f, double y) noexcept nogil:
    return -y * expit(-y * f)


cdef inline double logistic_curvature_of(double y, double e) noexcept nogil:
    # expit(z) expit(-z) = e / (1 + e)^2 with e = exp(-|z|): one exp, no overflow
    return (y * y) * (e / ((1.0 + e) * (1.0 + e)))


cdef inline double logistic_curvature(double f, double y) noexcept nogil:
    return logistic_curvature_of(y, exp(-fabs(y * f)))


cdef inline double huber_hinge_value(double f, double y, double h) noexcept nogil:
    cdef double u = (1.0 + h) - y * f
    cdef double q = clip(u, 0.0, 2.0 * h)
    # q^2 / (4h) is the quadratic piece, capped at h where u = 2h; the linear rest adds u - 2h.
    return q * q / (4.0 * h) + maximum(u - 2.0 * h, 0.0)


cdef inline double huber_hinge_derivative(double f, double y, double h) noexcept nogil:
    return y * clip((1.0 + h) - y * f, 0.0, 2.0 * h) * (-0.5 / h)


cdef inline double huber_hinge_curvature(double f, double y, double h) noexcept nogil:
    return ((y * y) * mask(fabs(1.0 - y * f) <= h)) * (0.5 / h)


cdef inline double novelty_value(double f, double rho) noexcept nogil:
    return maximum(0.0, rho - f)


cdef inline double novelty_derivative(double f, double rho) noexcept nogil:
    return mask(f < rho) * -1.0


cdef inline double least_squares_value(double f, double y) noexcept nogil:
    cdef double r = f - y
    return 0.5 * (r * r)


cdef inline double least_squares_derivative(double f, double y) noexcept nogil:
    return f - y


cdef inline double least_squares_curvature(double f, double y) noexcept nogil:
    return 1.0


cdef inline double least_absolute_deviation_value(double f, double y) noexcept nogil:
    return fabs(f - y)


cdef inline double least_absolute_deviation_derivative(double f, double y) noexcept nogil:
    return sign(f - y)


cdef inline double quantile_value(double f, double y, double tau) noexcept nogil:
    cdef double r = f - y
    return r * (mask(r > 0.0) - tau)


cdef inline double quantile_derivative(double f, double y, double tau) noexcept nogil:
    return mask(f > y) - tau


cdef inline double epsilon_insensitive_value(double f, double y, double epsilon) noexcept nogil:
    return maximum(0.0, fabs(f - y) - epsilon)


cdef inline double epsilon_insensitive_derivative(double f, double y, double epsilon) noexcept nogil:
    cdef double r = f - y
    return mask(r > epsilon) * 1.0 - mask(r < -epsilon)


cdef inline double huber_value(double f, double y, double delta) noexcept nogil:
    cdef double r = f - y
    cdef double c = clip(r, -delta, delta)
    # c (r - c/2) is r^2/2 inside the band and delta (|r| - delta/2) outside.
    return c * (r - 0.5 * c)


cdef inline double huber_derivative(double f, double y, double delta) noexcept nogil:
    return clip(f - y, -delta, delta)


cdef inline double huber_curvature(double f, double y, double delta) noexcept nogil:
    return mask(fabs(f - y) <= delta)


cdef inline double poisson_value(double f, double y) noexcept nogil:
    return exp(f) - y * f


cdef inline double poisson_derivative(double f, double y) noexcept nogil:
    return exp(f) - y


cdef inline double poisson_curvature(double f, double y) noexcept nogil:
    return exp(f)


cdef inline double dot(const double* x, const double* w, Py_ssize_t n) noexcept nogil:
    """``<x, w>`` in four interleaved partial sums (independent additions pipeline; the order is this code's)."""
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef Py_ssize_t j, end = n - n % 4
    for j in range(0, end, 4):
        s0 += x[j] * w[j]
        s1 += x[j + 1] * w[j + 1]
        s2 += x[j + 2] * w[j + 2]
        s3 += x[j + 3] * w[j + 3]
    for j in range(end, n):
        s0 += x[j] * w[j]
    return (s0 + s1) + (s2 + s3)


def _operands(f, y):
    """`f` and `y` broadcast together as flat C-contiguous float64 arrays, and their shape (`y` None: zeros)."""
    f = np.asarray(f, dtype=np.float64)
    y = np.zeros_like(f) if y is None else np.asarray(y, dtype=np.float64)
    f, y = np.broadcast_arrays(f, y)
    return np.ascontiguousarray(f).ravel(), np.ascontiguousarray(y).ravel(), f.shape


def _check_blocks(const Py_ssize_t[::1] bounds, Py_ssize_t rows, partials, Py_ssize_t width):
    """Raise ValueError unless `bounds` increase within ``[0, rows]`` and `partials` is one row per block of
    `width` values."""
    cdef Py_ssize_t b
    for b in range(bounds.shape[0]):
        if bounds[b] < 0 or bounds[b] > rows or (b and bounds[b] < bounds[b - 1]):
            raise ValueError("the block bounds are not increasing row indices")
    if partials.shape[0] != max(bounds.shape[0] - 1, 0) or partials.shape[1] != width:
        raise ValueError(f"the partial sums do not have one row of {width} values per block")


# Newton's passes (prbmrm.solvers.tron): every block's sums in one call, from per-row coefficients the loss gives.

cdef void _zero(double* partial, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        partial[j] = 0.0


cdef void _row_sums(const double[:, ::1] columns, Py_ssize_t start, Py_ssize_t stop, double* out) noexcept nogil:
    """``out[c] = sum of columns[c, start:stop]``, added in row order from +0.0."""
    cdef Py_ssize_t c, i
    for c in range(columns.shape[0]):
        out[c] = 0.0
        for i in range(start, stop):
            out[c] += columns[c, i]


def _check_newton(const Py_ssize_t[::1] bounds, Py_ssize_t rows, Py_ssize_t d, partials, columns, *coefficients):
    """Raise ValueError unless the per-row arrays have `rows` entries and `partials` one row per block of
    ``2 d`` (with `columns`: ``2 d + len(columns)``; without: ``d + 1``) values."""
    width = d + 1 if columns is None else 2 * d + columns.shape[0]
    _check_blocks(bounds, rows, partials, width)
    if any(a.shape[0] != rows for a in coefficients) or (columns is not None and columns.shape[1] != rows):
        raise ValueError("the per-row coefficients do not have one entry per row")


def dense_matvec(const double[:, ::1] X, const double[::1] w, double[::1] out):
    """Write ``X @ w`` into `out`, each row's sum in this module's order (a row's score depends on it alone)."""
    cdef Py_ssize_t i
    if w.shape[0] != X.shape[1] or out.shape[0] != X.shape[0]:
        raise ValueError("dense_matvec: the arrays' shapes do not agree")
    with nogil:
        for i in range(X.shape[0]):
            out[i] = dot(&X[i, 0], &w[0], X.shape[1])


cdef void _newton_blocks(const index_t* indptr, const index_t* indices, const double* data, Py_ssize_t d,
                         bint dense, const Py_ssize_t[::1] bounds, const double[::1] slope,
                         const double[::1] curvature, const double[:, ::1] columns,
                         double[:, ::1] partials) noexcept nogil:
    """:func:`csr_newton_sums`, on CSR rows or (`dense`) on the C-contiguous rows of d values at `data`."""
    cdef Py_ssize_t b, i, j, k, start, stop
    cdef double c, h, x
    cdef double* partial
    for b in range(bounds.shape[0] - 1):
        partial = &partials[b, 0]
        _zero(partial, 2 * d)
        for i in range(bounds[b], bounds[b + 1]):
            c, h = slope[i], curvature[i]
            if c == 0.0 and h == 0.0:
                continue
            start = i * d if dense else <Py_ssize_t>indptr[i]
            stop = start + d if dense else <Py_ssize_t>indptr[i + 1]
            for k in range(start, stop):
                j = k - start if dense else <Py_ssize_t>indices[k]
                x = data[k]
                partial[j] += x * c
                partial[d + j] += (x * x) * h
        _row_sums(columns, bounds[b], bounds[b + 1], partial + 2 * d)


cdef void _hessian_blocks(const index_t* indptr, const index_t* indices, const double* data, Py_ssize_t d,
                          bint dense, const Py_ssize_t[::1] bounds, const double[::1] curvature,
                          const double[::1] v, double[:, ::1] partials) noexcept nogil:
    """:func:`csr_hessian_sums`, on CSR rows or (`dense`) on the C-contiguous rows of d values at `data`."""
    cdef Py_ssize_t b, i, k, start, stop
    cdef double h, s
    cdef double* partial
    for b in range(bounds.shape[0] - 1):
        partial = &partials[b, 0]
        _zero(partial, d + 1)
        for i in range(bounds[b], bounds[b + 1]):
            h = curvature[i]
            if h == 0.0:
                continue
            start = i * d if dense else <Py_ssize_t>indptr[i]
            stop = start + d if dense else <Py_ssize_t>indptr[i + 1]
            s = 0.0
            for k in range(start, stop):
                s += data[k] * v[k - start if dense else <Py_ssize_t>indices[k]]
            s = s * h
            for k in range(start, stop):
                partial[k - start if dense else <Py_ssize_t>indices[k]] += data[k] * s


def _check_csr(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data, Py_ssize_t rows):
    if indptr.shape[0] != rows + 1 or indices.shape[0] != data.shape[0] or (rows and (
            indptr[0] < 0 or indptr[rows] > data.shape[0])):
        raise ValueError("the CSR arrays do not agree with the rows")


def csr_newton_sums(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                    const Py_ssize_t[::1] bounds, const double[::1] slope, const double[::1] curvature,
                    const double[:, ::1] columns, double[:, ::1] partials):
    """Fill ``partials[b] = [X_b^T slope, (X_b * X_b)^T curvature, columns' sums over b's rows]`` for each block
    b of the CSR rows between `bounds` (d columns: the partials' width less the columns', halved).

    Rows are added in order from +0.0 (a row whose slope and curvature are zero adds nothing and is
    skipped), so a block's sums depend on its rows only, whatever rank holds it. The column indices must
    lie in ``[0, d)`` (the loader checks the shards').
    """
    cdef Py_ssize_t d = (partials.shape[1] - columns.shape[0]) // 2
    _check_csr(indptr, indices, data, slope.shape[0])
    _check_newton(bounds, slope.shape[0], d, partials, columns, slope, curvature)
    with nogil:
        _newton_blocks(&indptr[0], &indices[0], &data[0], d, False, bounds, slope, curvature, columns, partials)


def dense_newton_sums(const double[:, ::1] X, const Py_ssize_t[::1] bounds, const double[::1] slope,
                      const double[::1] curvature, const double[:, ::1] columns, double[:, ::1] partials):
    """:func:`csr_newton_sums` on dense rows."""
    _check_newton(bounds, X.shape[0], X.shape[1], partials, columns, slope, curvature)
    with nogil:
        _newton_blocks(<const int32_t*>NULL, NULL, &X[0, 0], X.shape[1], True, bounds, slope, curvature, columns,
                       partials)


def csr_hessian_sums(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                     const Py_ssize_t[::1] bounds, const double[::1] curvature, const double[::1] v,
                     double[:, ::1] partials):
    """Fill ``partials[b] = [X_b^T (D_b (X_b v)), 0]`` (D the diagonal of `curvature`) for each block b of the CSR
    rows between `bounds`: each row read once, for ``<x, v>`` and then ``+= D_i <x, v> x``, as LIBLINEAR's
    Hessian products do; rows with zero curvature skipped, the sums in order from +0.0 as in
    :func:`csr_newton_sums`."""
    _check_csr(indptr, indices, data, curvature.shape[0])
    _check_newton(bounds, curvature.shape[0], v.shape[0], partials, None, curvature)
    with nogil:
        _hessian_blocks(&indptr[0], &indices[0], &data[0], v.shape[0], False, bounds, curvature, v, partials)


def dense_hessian_sums(const double[:, ::1] X, const Py_ssize_t[::1] bounds, const double[::1] curvature,
                       const double[::1] v, double[:, ::1] partials):
    """:func:`csr_hessian_sums` on dense rows."""
    if v.shape[0] != X.shape[1]:
        raise ValueError("dense_hessian_sums: the arrays' shapes do not agree")
    _check_newton(bounds, X.shape[0], X.shape[1], partials, None, curvature)
    with nogil:
        _hessian_blocks(<const int32_t*>NULL, NULL, &X[0, 0], X.shape[1], True, bounds, curvature, v, partials)


cdef void _gram_blocks(const index_t* indptr, const index_t* indices, const double* data, Py_ssize_t d,
                       bint dense, const Py_ssize_t[::1] bounds, const double[::1] curvature,
                       double[:, ::1] partials) noexcept nogil:
    """:func:`csr_gram_sums`, on CSR rows or (`dense`) on the C-contiguous rows of d values at `data`."""
    cdef Py_ssize_t b, i, j, k, p, q, start, stop
    cdef double h, x
    cdef double* partial
    for b in range(bounds.shape[0] - 1):
        partial = &partials[b, 0]
        _zero(partial, partials.shape[1])
        for i in range(bounds[b], bounds[b + 1]):
            h = curvature[i]
            if h == 0.0:
                continue
            start = i * d if dense else <Py_ssize_t>indptr[i]
            stop = start + d if dense else <Py_ssize_t>indptr[i + 1]
            for p in range(start, stop):
                x = h * data[p]
                j = p - start if dense else <Py_ssize_t>indices[p]
                for q in range(start, stop):
                    k = q - start if dense else <Py_ssize_t>indices[q]
                    if k >= j:  # the upper triangle, row by row: entry (j, k) at j (2 d - j - 1) / 2 + k
                        partial[j * (2 * d - j - 1) // 2 + k] += x * data[q]


def csr_gram_sums(const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                  const Py_ssize_t[::1] bounds, const double[::1] curvature, double[:, ::1] partials):
    """Fill ``partials[b] = [upper triangle of X_b^T D_b X_b, 0]`` (D the diagonal of `curvature`) for each block
    b of the CSR rows between `bounds`: the Hessian's data part as a matrix, its upper triangle row by row
    (``numpy.triu_indices`` order, ``d (d + 1) / 2`` values, d the width of the partials' triangle).

    Each row adds ``D_i x_ij x_ik`` to entry (j, k) in the row's order of nonzeros, rows in order from +0.0
    (zero curvature skipped), so a block's sums depend on its rows only. Column indices in ``[0, d)``, each
    at most once in a row (the loader checks both).
    """
    cdef Py_ssize_t d = _triangle_side(partials.shape[1] - 1)
    _check_csr(indptr, indices, data, curvature.shape[0])
    _check_blocks(bounds, curvature.shape[0], partials, partials.shape[1])
    with nogil:
        _gram_blocks(&indptr[0], &indices[0], &data[0], d, False, bounds, curvature, partials)


def dense_gram_sums(const double[:, ::1] X, const Py_ssize_t[::1] bounds, const double[::1] curvature,
                    double[:, ::1] partials):
    """:func:`csr_gram_sums` on dense rows."""
    if _triangle_side(partials.shape[1] - 1) != X.shape[1] or curvature.shape[0] != X.shape[0]:
        raise ValueError("dense_gram_sums: the arrays' shapes do not agree")
    _check_blocks(bounds, X.shape[0], partials, partials.shape[1])
    with nogil:
        _gram_blocks(<const int32_t*>NULL, NULL, &X[0, 0], X.shape[1], True, bounds, curvature, partials)


def _triangle_side(Py_ssize_t entries):
    """The d whose upper triangle has `entries` entries, d (d + 1) / 2; ValueError if there is none."""
    cdef Py_ssize_t d = <Py_ssize_t>((8 * entries + 1) ** 0.5 - 1) // 2
    while d * (d + 1) // 2 < entries:
        d += 1
    if d * (d + 1) // 2 != entries:
        raise ValueError(f"{entries} entries are not the upper triangle of a square matrix")
    return d


cdef enum Formula:
    VALUE, DERIVATIVE, CURVATURE


cdef class CyLoss:
    """A compiled scalar loss: its value, derivative and curvature, elementwise and in the risk passes.

    Subclasses define :meth:`value1` and :meth:`derivative1` from the loss's
    inline functions, and a twice differentiable one :meth:`curvature1` (and
    :attr:`twice_differentiable`); the loops are written here once.
    """

    twice_differentiable = False
    """Whether :meth:`curvature` is defined (l'' exists, or a generalized one where l' has a kink)."""

    cdef double param  # the loss's parameter, if it has one

    cdef double value1(self, double f, double y) noexcept nogil:
        return 0.0

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return 0.0

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return 0.0

    cdef void newton1(self, double f, double y, double* value, double* slope, double* curvature) noexcept nogil:
        """Write l, l' and l'' at (f, y) through the three pointers: :meth:`value1`, :meth:`derivative1`
        and :meth:`curvature1`; a loss whose three share work overrides it (the same bits)."""
        value[0] = self.value1(f, y)
        slope[0] = self.derivative1(f, y)
        curvature[0] = self.curvature1(f, y)

    cdef double formula(self, Formula which, double f, double y) noexcept nogil:
        if which == VALUE:
            return self.value1(f, y)
        if which == DERIVATIVE:
            return self.derivative1(f, y)
        return self.curvature1(f, y)

    cdef elementwise(self, Formula which, f, y):
        """One formula per example (arrays broadcast together; `y` may be None), in the operands' shape."""
        cdef const double[::1] fs, ys
        cdef double[::1] out
        cdef Py_ssize_t i
        fs, ys, shape = _operands(f, y)
        result = np.empty(fs.shape[0])
        out = result
        with nogil:
            for i in range(fs.shape[0]):
                out[i] = self.formula(which, fs[i], ys[i])
        return result.reshape(shape)

    def value(self, f, y):
        """Return the per-example losses ``l(f_i, y_i)`` (arrays broadcast together; `y` may be None)."""
        return self.elementwise(VALUE, f, y)

    def derivative(self, f, y):
        """Return the per-example derivatives ``l'(f_i, y_i)`` in f (a subgradient at a kink)."""
        return self.elementwise(DERIVATIVE, f, y)

    def curvature(self, f, y):
        """Return the per-example second derivatives ``l''(f_i, y_i)`` in f (at a kink of l', one side's).

        Raises NotImplementedError for a loss that is not :attr:`twice_differentiable`.
        """
        if not self.twice_differentiable:
            raise NotImplementedError(f"{type(self).__name__} has no second derivative")
        return self.elementwise(CURVATURE, f, y)

    def newton_terms(self, const double[::1] f, const double[::1] y, double[::1] value, double[::1] slope,
                     double[::1] curvature):
        """Write ``l(f_i, y_i)``, ``l'`` and ``l''`` into `value`, `slope` and `curvature` in one pass (Newton's
        method reads all three at every point: one loop instead of three, each the formula :meth:`value`,
        :meth:`derivative` and :meth:`curvature` compute, so the same bits; the logistic's three from one exp)."""
        cdef Py_ssize_t i, n = f.shape[0]
        if not self.twice_differentiable:
            raise NotImplementedError(f"{type(self).__name__} has no second derivative")
        if y.shape[0] != n or value.shape[0] != n or slope.shape[0] != n or curvature.shape[0] != n:
            raise ValueError("newton_terms: the arrays' shapes do not agree")
        with nogil:
            for i in range(n):
                self.newton1(f[i], y[i], &value[i], &slope[i], &curvature[i])

    def dense_pass(self, const double[:, ::1] X, const double[::1] y, const double[::1] w,
                   const Py_ssize_t[::1] bounds, double[:, ::1] partials):
        """Fill ``partials[b]`` (the gradient sum, then the risk sum) of each block b of rows between `bounds`.

        Each row is read from memory once: its score ``f = <x, w>``, then l
        and ``c = l'``, then ``g += c x`` while the row is in the L1 cache
        (BLAS's ``X @ w`` then ``X^T l'`` reads each chunk twice). Rows with
        ``c = 0`` add nothing and are skipped. Rows are added in order from
        +0.0, so a block's sums depend on its rows only.
        """
        cdef Py_ssize_t rows = X.shape[0], d = X.shape[1], b, i, j
        cdef double risk, f, c
        cdef double* partial
        cdef const double* x
        if w.shape[0] != d or y.shape[0] != rows:
            raise ValueError("dense_pass: the arrays' shapes do not agree")
        _check_blocks(bounds, rows, partials, d + 1)
        with nogil:
            for b in range(bounds.shape[0] - 1):
                partial = &partials[b, 0]
                for j in range(d + 1):
                    partial[j] = 0.0
                risk = 0.0
                for i in range(bounds[b], bounds[b + 1]):
                    x = &X[i, 0]
                    f = dot(x, &w[0], d)
                    risk += self.value1(f, y[i])
                    c = self.derivative1(f, y[i])
                    if c != 0.0:
                        for j in range(d):
                            partial[j] += c * x[j]
                partial[d] = risk

    def csr_update(self, const index_t[::1] indptr, const index_t[::1] indices, const double[::1] data,
                   const double[::1] f, const double[::1] y, const Py_ssize_t[::1] bounds,
                   double[:, ::1] partials):
        """Fill ``partials[b]`` (the gradient sum, then the risk sum) of each block b of CSR rows between
        `bounds`, from the rows' scores `f`: the second half of the pass.

        l and l' per row, then ``g += l' x`` on the nonzeros of the rows with
        ``l' != 0``, in the order of scipy's ``csc_matvec`` (the gradient is
        the same bitwise as ``X.T @ l'`` by it); the risk is added row by row
        from +0.0. The column indices must lie in ``[0, partials.shape[1] - 1)``
        (the loader checks the shards').
        """
        cdef Py_ssize_t rows = f.shape[0], d = partials.shape[1] - 1, b, i, k
        cdef double risk, c
        cdef double* partial
        if indptr.shape[0] != rows + 1 or y.shape[0] != rows or indices.shape[0] != data.shape[0]:
            raise ValueError("csr_update: the arrays' shapes do not agree")
        if rows and (indptr[0] < 0 or indptr[rows] > data.shape[0]):
            raise ValueError("csr_update: indptr points outside the nonzeros")
        _check_blocks(bounds, rows, partials, d + 1)
        with nogil:
            for b in range(bounds.shape[0] - 1):
                partial = &partials[b, 0]
                for k in range(d + 1):
                    partial[k] = 0.0
                risk = 0.0
                for i in range(bounds[b], bounds[b + 1]):
                    risk += self.value1(f[i], y[i])
                    c = self.derivative1(f[i], y[i])
                    if c != 0.0:
                        for k in range(indptr[i], indptr[i + 1]):
                            partial[indices[k]] += data[k] * c
                partial[d] = risk


cdef class CyHinge(CyLoss):
    """:class:`prbmrm.losses.scalar.Hinge`, compiled."""

    cdef double value1(self, double f, double y) noexcept nogil:
        return hinge_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return hinge_derivative(f, y)


cdef class CySquaredHinge(CyLoss):
    """:class:`prbmrm.losses.scalar.SquaredHinge`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return squared_hinge_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return squared_hinge_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return squared_hinge_curvature(f, y)


cdef class CyZeroHinge(CyLoss):
    """:class:`prbmrm.losses.scalar.ZeroHinge`, compiled."""

    cdef double value1(self, double f, double y) noexcept nogil:
        return zero_hinge_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return zero_hinge_derivative(f, y)


cdef class CySquaredZeroHinge(CyLoss):
    """:class:`prbmrm.losses.scalar.SquaredZeroHinge`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return squared_zero_hinge_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return squared_zero_hinge_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return squared_zero_hinge_curvature(f, y)


cdef class CyExponential(CyLoss):
    """:class:`prbmrm.losses.scalar.Exponential`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return exponential_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return exponential_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return exponential_curvature(f, y)


cdef class CyLogistic(CyLoss):
    """:class:`prbmrm.losses.scalar.Logistic`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return logistic_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return logistic_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return logistic_curvature(f, y)

    cdef void newton1(self, double f, double y, double* value, double* slope, double* curvature) noexcept nogil:
        # One exp for the three: each formula takes exp(-|y f|), the same bits as computed apart
        cdef double z = -y * f
        cdef double e = exp(-fabs(z))
        value[0] = log1pexp_of(z, e)
        slope[0] = -y * expit_of(z, e)
        curvature[0] = logistic_curvature_of(y, e)


cdef class CyHuberHinge(CyLoss):
    """:class:`prbmrm.losses.scalar.HuberHinge` with its `delta`, compiled."""

    twice_differentiable = True

    def __init__(self, double delta):
        self.param = delta

    cdef double value1(self, double f, double y) noexcept nogil:
        return huber_hinge_value(f, y, self.param)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return huber_hinge_derivative(f, y, self.param)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return huber_hinge_curvature(f, y, self.param)


cdef class CyNovelty(CyLoss):
    """:class:`prbmrm.losses.scalar.Novelty` with its `rho`, compiled (the labels are ignored)."""

    def __init__(self, double rho):
        self.param = rho

    cdef double value1(self, double f, double y) noexcept nogil:
        return novelty_value(f, self.param)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return novelty_derivative(f, self.param)


cdef class CyLeastSquares(CyLoss):
    """:class:`prbmrm.losses.scalar.LeastSquares`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return least_squares_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return least_squares_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return least_squares_curvature(f, y)


cdef class CyLeastAbsoluteDeviation(CyLoss):
    """:class:`prbmrm.losses.scalar.LeastAbsoluteDeviation`, compiled."""

    cdef double value1(self, double f, double y) noexcept nogil:
        return least_absolute_deviation_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return least_absolute_deviation_derivative(f, y)


cdef class CyQuantile(CyLoss):
    """:class:`prbmrm.losses.scalar.Quantile` with its `tau`, compiled."""

    def __init__(self, double tau):
        self.param = tau

    cdef double value1(self, double f, double y) noexcept nogil:
        return quantile_value(f, y, self.param)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return quantile_derivative(f, y, self.param)


cdef class CyEpsilonInsensitive(CyLoss):
    """:class:`prbmrm.losses.scalar.EpsilonInsensitive` with its `epsilon`, compiled."""

    def __init__(self, double epsilon):
        self.param = epsilon

    cdef double value1(self, double f, double y) noexcept nogil:
        return epsilon_insensitive_value(f, y, self.param)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return epsilon_insensitive_derivative(f, y, self.param)


cdef class CyHuber(CyLoss):
    """:class:`prbmrm.losses.scalar.Huber` with its `delta`, compiled."""

    twice_differentiable = True

    def __init__(self, double delta):
        self.param = delta

    cdef double value1(self, double f, double y) noexcept nogil:
        return huber_value(f, y, self.param)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return huber_derivative(f, y, self.param)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return huber_curvature(f, y, self.param)


cdef class CyPoisson(CyLoss):
    """:class:`prbmrm.losses.scalar.Poisson`, compiled."""

    twice_differentiable = True

    cdef double value1(self, double f, double y) noexcept nogil:
        return poisson_value(f, y)

    cdef double derivative1(self, double f, double y) noexcept nogil:
        return poisson_derivative(f, y)

    cdef double curvature1(self, double f, double y) noexcept nogil:
        return poisson_curvature(f, y)
