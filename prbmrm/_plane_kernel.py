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


@numba.njit(cache=True)
def scatter_add(index, values, weight, out):
    """``out[index[k]] += weight * values[k]`` for every k (the indices are distinct)."""
    for k in range(index.size):
        out[index[k]] += weight * values[k]



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
