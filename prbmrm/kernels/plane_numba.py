"""Loops over a sparse plane (indices and values) that numba compiles: its support, dot products, scatter-add.

Each runs the floating-point operations of the numpy and scipy code it
replaces in the same order (a sum from 0.0 in index order, as scipy's CSR
kernel does; ``out[i] += weight * value``, as ``out[index] += weight *
values`` does), so the results are bitwise those, without the temporaries:
``out[index] += weight * values`` writes two vectors of the plane's length
first, and a plane of a million nonzeros is 8 MB each. Only
:mod:`prbmrm.solvers.bundle` imports this module, when a bundle first
stores a sparse plane, so numba is loaded only by runs with sparse planes;
compiled code is cached on disk.

Imports: numba, numpy; nothing of prbmrm.
"""

import numba
import numpy as np


@numba.njit(cache=True)
def sparse_dot(index, values, x):
    """Return ``sum_k values[k] * x[index[k]]``, summed from 0.0 in order of k."""
    total = 0.0
    for k in range(index.size):
        total += values[k] * x[index[k]]
    return total


@numba.njit(cache=True)
def sparse_dots(index, values, x, y):
    """Return :func:`sparse_dot` of the plane with `x` and with `y`, reading the plane once."""
    first = 0.0
    second = 0.0
    for k in range(index.size):
        value = values[k]
        i = index[k]
        first += value * x[i]
        second += value * y[i]
    return first, second


CHUNK = 2 ** 15
"""Coordinates per slice of the blocked kernels: 256 KB of a dense vector, which stays in a core's L2 cache."""

GROUP = 16
"""Planes per call of the blocked kernels: a tuple of fixed size has one compiled version (numba's typed
lists, which would take any number of planes, cost 12 MB of resident memory when first used)."""


@numba.njit(cache=True)
def sparse_dot_group(indices, values, x, out):
    """``out[p] = sparse_dot(indices[p], values[p], x)`` for the :data:`GROUP` planes, bitwise, 30% faster.

    One plane at a time, a plane of a fifth of d = 2^22 coordinates touches
    nearly every cache line of `x` (32 MB, more than the cache), and its sum
    waits on each addition before the next. Here `x` is taken a slice of
    :data:`CHUNK` coordinates at a time, and the entries of every plane of
    the group in that slice (their indices increase) go through it while it
    is in cache, four planes in lockstep: their independent sums advance
    together. Each plane's sum still runs from 0.0 in order of k. A group
    of fewer planes is padded with empty ones.
    """
    cursor = np.zeros(GROUP, dtype=np.int64)
    stop = np.zeros(GROUP, dtype=np.int64)
    total = np.zeros(GROUP)
    for start in range(0, x.size, CHUNK):
        for p in range(GROUP):
            stop[p] = np.searchsorted(indices[p], start + CHUNK)
        for g in range(0, GROUP, 4):
            i0, i1, i2, i3 = indices[g], indices[g + 1], indices[g + 2], indices[g + 3]
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
        for p in range(GROUP):
            index, value, s = indices[p], values[p], total[p]
            for k in range(cursor[p], stop[p]):
                s += value[k] * x[index[k]]
            total[p], cursor[p] = s, stop[p]
    out[:] = total


@numba.njit(cache=True)
def scatter_add_group(indices, values, weights, out):
    """``out += weights[p] * plane p`` for p in order, bitwise as plane by plane (``out[index[k]] +=
    weight * values[k]``; numpy's ``out += weight * values`` for a dense plane), 15% faster.

    `out` is written a slice of :data:`CHUNK` coordinates at a time (as
    :func:`sparse_dot_group` reads `x`); per coordinate the planes still
    add in order. A plane with no indices and ``out.size`` values is dense.
    A zero weight adds only zeros: its plane is skipped, which leaves every
    bit of `out` (and pads a group of fewer planes).
    """
    cursor = np.zeros(GROUP, dtype=np.int64)
    for start in range(0, out.size, CHUNK):
        end = min(start + CHUNK, out.size)
        for p in range(GROUP):
            weight, index, value = weights[p], indices[p], values[p]
            if weight == 0.0:
                continue
            if index.size == 0 and value.size == out.size:
                for i in range(start, end):
                    out[i] += weight * value[i]
                continue
            stop = np.searchsorted(index, end)
            for k in range(cursor[p], stop):
                out[index[k]] += weight * value[k]
            cursor[p] = stop


@numba.njit(cache=True)
def fill_support(a, index, values):
    """Write the positions and values of the nonzeros of `a` (``np.flatnonzero``'s) into `index` and `values`.

    Both must hold one slot more than `a` has nonzeros: without a branch
    every coordinate is written to the next free slot, which only a nonzero
    advances (5x faster than ``flatnonzero`` and a gather on a million
    nonzeros among 4M coordinates; a branch per coordinate mispredicts).
    """
    k = 0
    for i in range(a.size):
        x = a[i]
        index[k] = i
        values[k] = x
        k += x != 0.0
