"""The risk pass of a scalar loss on dense rows, and its second half on CSR rows, as loops numba compiles.

Each row is read from memory once: its score ``f = <x, w>``, then the
loss's value and derivative ``c = l'(f, y)``, then ``g += c x`` while the
row is still in the L1 cache. BLAS's ``X @ w`` then ``X^T l'`` per chunk
reads each chunk from memory and again from cache, and streams at about
60% of a plain read: at most half the memory bandwidth in all (issue 13,
docs/performance.md "Dense data"). Rows with ``c = 0`` (hinge beyond the
margin) add nothing and are skipped.

The dot and the update allow reassociation and fused multiply-adds (LLVM
then vectorizes the dot): the order is fixed by the compiled code, so a
block's sums are the same bitwise on any number of ranks of a machine;
they differ from BLAS's by rounding. The losses' formulas are compiled
without those flags, as :mod:`prbmrm.losses.scalar` writes them.

:func:`csr_update` is the second half of the pass on CSR rows, from their
scores (scipy's ``csr_matvec``: numba's loop of the same order takes twice
its time): l and l', then ``g += l' x`` on the nonzeros of the rows with
``l' != 0``, in the order of scipy's ``csc_matvec``, so the gradient is the
same bitwise; the risk is added row by row (numpy sums a chunk pairwise).

:mod:`prbmrm.kernels.native` runs the entry points (:func:`dense_entry`,
:func:`csr_entry`) from a file without loading numba (the passes allocate
nothing and, with numpy's error model, raise nothing); only there, or where
that file cannot be made, is this module imported. Only runs on large data
call them.

Imports: numba; of prbmrm: nothing (:data:`prbmrm.kernels.blocks._DENSE_LOSSES` holds the codes below).
"""

import math

import numba
import numpy as np

# Loss codes: prbmrm.kernels.blocks._DENSE_LOSSES maps the loss classes to them and to their parameters.
HINGE, SQUARED_HINGE, ZERO_HINGE, SQUARED_ZERO_HINGE, EXPONENTIAL, LOGISTIC, HUBER_HINGE = range(7)
NOVELTY, LEAST_SQUARES, LEAST_ABSOLUTE_DEVIATION, QUANTILE, EPSILON_INSENSITIVE, HUBER, POISSON = range(7, 14)

_FAST = {"reassoc", "contract"}


@numba.njit(fastmath=_FAST, cache=True, error_model="numpy")
def _dot(x, w):
    total = 0.0
    for j in range(x.size):
        total += x[j] * w[j]
    return total


@numba.njit(fastmath=_FAST, cache=True, error_model="numpy")
def _add_scaled(g, c, x):
    for j in range(x.size):
        g[j] += c * x[j]


@numba.njit(cache=True, error_model="numpy")
def _expit(z):
    """``1 / (1 + exp(-z))`` without overflow (scipy's ``expit``)."""
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@numba.njit(cache=True, error_model="numpy", inline="always")
def loss_at(code, p, f, y):
    """Return ``(l(f, y), l'(f, y))`` of the loss `code` with parameters `p` (as in :mod:`prbmrm.losses.scalar`)."""
    if code == HINGE:
        z = y * f
        return max(0.0, 1.0 - z), (-y if z < 1.0 else 0.0)
    if code == SQUARED_HINGE:
        m = max(0.0, 1.0 - y * f)
        return 0.5 * (m * m), -y * m
    if code == ZERO_HINGE:
        z = y * f
        return max(0.0, -z), (-y if z < 0.0 else 0.0)
    if code == SQUARED_ZERO_HINGE:
        m = max(0.0, -y * f)
        return 0.5 * (m * m), -y * m
    if code == EXPONENTIAL:
        e = math.exp(-y * f)
        return e, -y * e
    if code == LOGISTIC:
        z = -y * f
        # numpy's logaddexp(0, z).
        value = z + math.log1p(math.exp(-z)) if z > 0.0 else math.log1p(math.exp(z))
        return value, -y * _expit(z)
    if code == HUBER_HINGE:
        h = p[0]
        u = (1.0 + h) - y * f
        q = min(max(u, 0.0), 2.0 * h)
        return q * q / (4.0 * h) + max(u - 2.0 * h, 0.0), y * q * (-0.5 / h)
    if code == NOVELTY:
        return max(0.0, p[0] - f), (-1.0 if f < p[0] else 0.0)
    r = f - y
    if code == LEAST_SQUARES:
        return 0.5 * r ** 2, r
    if code == LEAST_ABSOLUTE_DEVIATION:
        return abs(r), (1.0 if r > 0.0 else (-1.0 if r < 0.0 else 0.0))
    if code == QUANTILE:
        slope = (1.0 if f > y else 0.0) - p[0]
        return r * ((1.0 if r > 0.0 else 0.0) - p[0]), slope
    if code == EPSILON_INSENSITIVE:
        return max(0.0, abs(r) - p[0]), (1.0 if r > p[0] else (-1.0 if r < -p[0] else 0.0))
    if code == HUBER:
        c = min(max(r, -p[0]), p[0])
        return c * (r - 0.5 * c), c
    e = math.exp(f)  # POISSON
    return e - y * f, e - y


@numba.njit(cache=True, error_model="numpy")
def dense_pass(X, y, w, code, p, bounds, partials):
    """Fill ``partials[b]`` (the gradient sum, then the risk sum) of each block b of rows between `bounds`.

    Rows are added in order from +0.0, so a block's sums depend on its rows only.
    """
    d = X.shape[1]
    for b in range(bounds.size - 1):
        partial = partials[b]
        partial[:] = 0.0
        risk = 0.0
        for i in range(bounds[b], bounds[b + 1]):
            x = X[i]
            f = _dot(x, w)
            value, c = loss_at(code, p, f, y[i])
            # A NaN score makes the risk NaN (numpy's maximum keeps it; max() here may not).
            risk += f if f != f else value
            if c != 0.0:
                _add_scaled(partial[:d], c, x)
        partial[d] = risk


@numba.njit(cache=True, error_model="numpy")
def csr_update(indptr, indices, data, f, y, code, p, bounds, partials):
    """Fill ``partials[b]`` (the gradient sum, then the risk sum) of each block b of CSR rows between `bounds`,
    from the rows' scores `f`.

    Rows are added in order from +0.0, so a block's sums depend on its rows only.
    """
    d = partials.shape[1] - 1
    for b in range(bounds.size - 1):
        partial = partials[b]
        partial[:] = 0.0
        risk = 0.0
        for i in range(bounds[b], bounds[b + 1]):
            value, c = loss_at(code, p, f[i], y[i])
            risk += f[i] if f[i] != f[i] else value
            if c != 0.0:
                for k in range(np.intp(indptr[i]), np.intp(indptr[i + 1])):
                    # Unsigned: no test for a negative index (loading checks the shards' indices; scipy's
                    # csc_matvec, which this replaces, assumes them in range too).
                    partial[np.uintp(indices[k])] += data[k] * c
        partial[d] = risk


def dense_entry():
    """Compile and return the C entry point of :func:`dense_pass` (:mod:`prbmrm.kernels.native`'s ``dense_pass``).

    ``c_dense_pass(X, rows, cols, y, w, code, p, n_p, bounds, n_bounds,
    partials)``: pointers to C-contiguous arrays, float64 but `bounds`
    (intp); X is rows x cols, `partials` (n_bounds - 1) x (cols + 1).
    """
    from numba import carray, cfunc, types

    f8p, i8, ip = types.CPointer(types.float64), types.int64, types.CPointer(types.intp)

    @cfunc(types.void(f8p, i8, i8, f8p, f8p, i8, f8p, i8, ip, i8, f8p), error_model="numpy")
    def c_dense_pass(X, rows, cols, y, w, code, p, n_p, bounds, n_bounds, partials):
        dense_pass(carray(X, (rows, cols)), carray(y, rows), carray(w, cols), code, carray(p, n_p),
                   carray(bounds, n_bounds), carray(partials, (n_bounds - 1, cols + 1)))

    return c_dense_pass


def csr_entry():
    """Compile and return the C entry point of :func:`csr_update` (:mod:`prbmrm.kernels.native`'s ``csr_update``).

    ``c_csr_update(indptr, indices, data, rows, nonzeros, cols, f, y, code,
    p, n_p, bounds, n_bounds, partials)``: pointers to C-contiguous arrays,
    int32 `indptr` (rows + 1) and `indices`, intp `bounds`, float64 else;
    `partials` is (n_bounds - 1) x (cols + 1).
    """
    from numba import carray, cfunc, types

    f8p, i8 = types.CPointer(types.float64), types.int64
    i4p, ip = types.CPointer(types.int32), types.CPointer(types.intp)

    @cfunc(types.void(i4p, i4p, f8p, i8, i8, i8, f8p, f8p, i8, f8p, i8, ip, i8, f8p), error_model="numpy")
    def c_csr_update(indptr, indices, data, rows, nonzeros, cols, f, y, code, p, n_p, bounds, n_bounds, partials):
        csr_update(carray(indptr, rows + 1), carray(indices, nonzeros), carray(data, nonzeros), carray(f, rows),
                   carray(y, rows), code, carray(p, n_p), carray(bounds, n_bounds),
                   carray(partials, (n_bounds - 1, cols + 1)))

    return c_csr_update
