"""The steps of :func:`prbmrm.kernels.pg_numba.pg_steps` in numpy, bitwise equal to the compiled kernel.

Loading numba and the cached kernel costs a process 0.6-1 s (and the first
run on a machine ~6 s to compile), against 2-7 us per step saved: a run
with a few thousand steps in all is faster without it. So
:func:`prbmrm.regularizers.qp.solve_simplex_pg` takes its first steps here and loads
numba only once a process has taken :data:`prbmrm.regularizers.qp.PG_NUMPY_STEPS`.

Every operation is the kernel's, in the kernel's order: elementwise
arithmetic is the same in numpy, and each sum the kernel accumulates in
index order from 0.0 is :func:`ordered_sum` (``cumsum`` adds in order; the
final ``+ 0.0`` gives an all-zero sum the kernel's sign), so x, the step
count and the stopping decision are bitwise the kernel's (tests/test_qp.py
checks it) and a run's results do not depend on which of the two ran.

Imports: numpy; of prbmrm: nothing (the kernel's constants are repeated: importing :mod:`prbmrm.kernels.pg_numba` loads numba).
"""

import numpy as np

# The kernel's constants (prbmrm.kernels.pg_numba; tests/test_qp.py checks that they agree).
_ALPHA_MIN, _ALPHA_MAX, _TINY = 1e-10, 1e10, 1e-20
_SUPPORT = 1e-15


def ordered_sum(values):
    """``0.0 + values[0] + values[1] + ...`` added in index order, as the kernel's loops do."""
    return float(np.cumsum(values)[-1]) + 0.0 if values.size else 0.0


def project(v, below):
    """:func:`prbmrm.kernels.pg_numba.project`, returning the projection."""
    if below:
        out = np.where(v > 0.0, v, 0.0)
        if ordered_sum(out) <= 1.0:
            return out
    # Only the entries above max(v) - 1 can be in the support; sorted decreasingly.
    u = np.sort(v[v > v.max() - 1.0])[::-1]
    css = np.cumsum(np.concatenate(([-1.0], u)))[1:]
    above = (u * (np.arange(u.size) + 1.0) > css).nonzero()[0]
    shift = css[above[-1]] / (above[-1] + 1.0) if above.size else 0.0
    out = v - shift
    return np.where(out > 0.0, out, 0.0)


def product(G, scale, d):
    """:func:`prbmrm.kernels.pg_numba.product`: ``scale * G @ d`` over the rows of G where d is nonzero."""
    rows = d.nonzero()[0]
    if rows.size == 0:
        return np.zeros(d.size) * scale
    terms = G[rows, : d.size] * d[rows, None]
    return (np.cumsum(terms, axis=0)[-1] + 0.0) * scale


def kkt_holds(x, g, tol, ak, xx):
    """:func:`prbmrm.kernels.pg_numba.kkt_holds`."""
    support = x > _SUPPORT
    count = int(support.sum())
    if count == 0:
        return ak < 0.25 * tol * tol * xx
    mean = ordered_sum(g[support]) / count
    return not ((np.abs(g[support] - mean) > tol).any() or (g[~support] < mean - tol).any())


def pg_steps(G, scale, b, x0, x, tol, below, max_iter):
    """:func:`prbmrm.kernels.pg_numba.pg_steps` in numpy: the same arguments, the same x, steps and convergence."""
    x[:] = project(x0, below)
    t = product(G, scale, x)
    g = t - b
    d = project(x - g, below)
    step = float(np.abs(d - x).max())
    if step < tol * 1e-3:
        return 0, True
    alpha = 1.0 / max(step, _ALPHA_MIN)
    f_ref = _ALPHA_MAX
    f = ordered_sum(x * (0.5 * t - b))
    f_best = f_c = f_start = f
    since_best, ak_old, bk_old = 0, 0.0, 0.0
    for iteration in range(1, max_iter + 1):
        y = project(x - alpha * g, below)
        d = y - x
        gd = ordered_sum(d * g)
        if np.count_nonzero(y) < np.count_nonzero(d):
            Qd = product(G, scale, y) - t
        else:
            Qd = product(G, scale, d)
        ak, bk = ordered_sum(d * d), ordered_sum(d * Qd)
        f_new = f + gd + 0.5 * bk
        if f_new >= (f_start if iteration == 1 else f_ref) and bk > _TINY * ak and gd < 0.0:
            s = -gd / bk
            d *= s
            Qd *= s
            f_new = f + s * gd + 0.5 * s * s * bk
            ak, bk = s * s * ak, s * s * bk
        x += d
        t += Qd
        g = t - b
        f = f_new
        if f_new < f_best:
            f_best = f_c = f_new
            since_best = 0
        else:
            f_c = max(f_c, f_new)
            since_best += 1
            if since_best == 2:
                f_ref, f_c, since_best = f_c, f_new, 0
        if bk <= _TINY * ak:
            alpha = _ALPHA_MAX
        else:
            alpha = ak / bk if bk_old < _TINY * ak_old else (ak_old + ak) / (bk_old + bk)
            alpha = min(max(alpha, _ALPHA_MIN), _ALPHA_MAX)
        ak_old, bk_old = ak, bk
        xx = ordered_sum(x * x)
        if ak < 100.0 * tol * tol * xx and kkt_holds(x, g, tol, ak, xx):
            return iteration, True
    return max_iter, False
