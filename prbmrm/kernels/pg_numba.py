"""The projected-gradient steps of :func:`prbmrm.regularizers.qp.solve_simplex_pg`, as one loop numba compiles.

Written with explicit loops (no numpy reductions), so that the compiled
kernel and the plain Python functions (``NUMBA_DISABLE_JIT=1``) run the same
floating-point operations in the same order: the tests check them bitwise
equal. The kernel allocates nothing (the caller passes its scratch) and
uses numpy's error model (nothing raises), so that :mod:`prbmrm.kernels.native` can
run its entry point (:func:`entry`) from a file without loading numba; only
there, or where that file cannot be made, is this module imported.
"""

import numba
import numpy as np

_ALPHA_MIN, _ALPHA_MAX, _TINY = 1e-10, 1e10, 1e-20
# Entries of x at most this are off the support in the KKT test.
_SUPPORT = 1e-15


@numba.njit(cache=True, error_model="numpy")
def project(v, below, out):
    """Write into `out` the projection of `v` onto the simplex (`below`: onto ``{x >= 0, sum(x) <= 1}``).

    Sort-based (Held et al. 1974): the threshold is ``(sum_{i<=k} u_i - 1) / k``
    for the largest k with ``u_k > (sum_{i<=k} u_i - 1) / k``, u being v
    sorted decreasingly. That k never reaches an entry at most ``max(v) - 1``
    (there ``sum_{i<=k} u_i - 1 >= k u_k``), so only the entries above are
    sorted: usually a handful of the bundle's hundreds.
    """
    n = v.size
    if below:
        total = 0.0
        for i in range(n):
            out[i] = v[i] if v[i] > 0.0 else 0.0
            total += out[i]
        if total <= 1.0:
            return
    top = v[0]
    for i in range(n):
        top = max(top, v[i])
    cut = top - 1.0
    count = 0
    for i in range(n):
        if v[i] > cut:
            out[count] = v[i]
            count += 1
    u = out[:count]
    heapsort(u)  # out is rewritten whole below
    css = -1.0
    shift = 0.0
    for k in range(count):
        css += u[count - 1 - k]
        if u[count - 1 - k] * (k + 1.0) > css:
            shift = css / (k + 1.0)
    for i in range(n):
        x = v[i] - shift
        out[i] = x if x > 0.0 else 0.0


@numba.njit(cache=True, error_model="numpy")
def heapsort(a):
    """Sort `a` increasingly in place (numba's sort allocates a list for its stack)."""
    n = a.size
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(a, root, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift_down(a, 0, end)


@numba.njit(cache=True, error_model="numpy")
def _sift_down(a, root, end):
    """Restore the max-heap order of ``a[:end]`` below `root`."""
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and a[child] < a[child + 1]:
            child += 1
        if not a[root] < a[child]:
            return
        a[root], a[child] = a[child], a[root]
        root = child


@numba.njit(cache=True, error_model="numpy")
def product(G, scale, d, out):
    """``out = scale * G @ d`` over the rows of G where d is nonzero (G symmetric, its leading
    ``len(d) x len(d)`` block read)."""
    n = d.size
    for i in range(n):
        out[i] = 0.0
    for j in range(n):
        dj = d[j]
        if dj != 0.0:
            for i in range(n):
                out[i] += G[j, i] * dj
    for i in range(n):
        out[i] *= scale


@numba.njit(cache=True, error_model="numpy")
def dot(u, v):
    """``u @ v`` summed in index order."""
    total = 0.0
    for i in range(u.size):
        total += u[i] * v[i]
    return total


@numba.njit(cache=True, error_model="numpy")
def kkt_holds(x, g, tol, ak, xx):
    """BMRM 2.1's test once a step was short (`ak` = its squared length, `xx` = ``|x|^2``).

    g within `tol` of its mean on the support of x, and no smaller than that
    mean minus `tol` elsewhere; with no support, a step shorter still.
    """
    n = x.size
    total, count = 0.0, 0
    for i in range(n):
        if x[i] > _SUPPORT:
            total += g[i]
            count += 1
    if count == 0:
        return ak < 0.25 * tol * tol * xx
    mean = total / count
    for i in range(n):
        if x[i] > _SUPPORT:
            if abs(g[i] - mean) > tol:
                return False
        elif g[i] < mean - tol:
            return False
    return True


@numba.njit(cache=True, error_model="numpy")
def pg_steps(G, scale, b, x0, x, tol, below, max_iter, work):
    """Run the projected-gradient steps from `x0` projected into `x` (updated in place); return (steps, converged).

    Minimizes ``f(x) = 0.5 x^T Q x - b^T x`` with ``Q = scale * G`` over the
    simplex (`below`: ``sum(x) <= 1``), as :func:`prbmrm.regularizers.qp.solve_simplex_pg`
    describes: Dai and Fletcher's nonmonotone Barzilai-Borwein steps with
    BMRM 2.1's stopping test. Per step: one product with the rows of G where
    the step is nonzero and one projection; f, ``<d, g>`` and the curvatures
    are carried as scalars (``f(x + d) = f + <g, d> + <d, Qd> / 2``).
    `work` is scratch of at least 6 x n.
    """
    n = b.size
    t, g, d, Qd, y, v = work[0], work[1], work[2], work[3], work[4], work[5]
    project(x0, below, x)
    product(G, scale, x, t)
    for i in range(n):
        g[i] = t[i] - b[i]
        v[i] = x[i] - g[i]
    project(v, below, d)
    step = 0.0
    for i in range(n):
        step = max(step, abs(d[i] - x[i]))
    if step < tol * 1e-3:
        return 0, True
    alpha = 1.0 / max(step, _ALPHA_MIN)
    f_ref = _ALPHA_MAX
    f = 0.0
    for i in range(n):
        f += x[i] * (0.5 * t[i] - b[i])
    f_best = f_c = f_start = f
    since_best, ak_old, bk_old = 0, 0.0, 0.0
    for iteration in range(1, max_iter + 1):
        for i in range(n):
            v[i] = x[i] - alpha * g[i]
        project(v, below, y)
        # Qd = Q (y - x): from the rows of Q where y - x is nonzero, or as
        # Q y - t where y has fewer nonzeros (as BMRM 2.1 does).
        nonzero_y, nonzero_d = 0, 0
        for i in range(n):
            d[i] = y[i] - x[i]
            nonzero_y += y[i] != 0.0
            nonzero_d += d[i] != 0.0
        gd = dot(d, g)
        if nonzero_y < nonzero_d:
            product(G, scale, y, Qd)
            for i in range(n):
                Qd[i] -= t[i]
        else:
            product(G, scale, d, Qd)
        ak, bk = dot(d, d), dot(d, Qd)
        f_new = f + gd + 0.5 * bk
        if f_new >= (f_start if iteration == 1 else f_ref) and bk > _TINY * ak and gd < 0.0:
            # The nonmonotone test failed: exact line search along d.
            s = -gd / bk
            for i in range(n):
                d[i] *= s
                Qd[i] *= s
            f_new = f + s * gd + 0.5 * s * s * bk
            ak, bk = s * s * ak, s * s * bk
        for i in range(n):
            x[i] += d[i]
            t[i] += Qd[i]
            g[i] = t[i] - b[i]
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
        xx = dot(x, x)
        if ak < 100.0 * tol * tol * xx and kkt_holds(x, g, tol, ak, xx):
            return iteration, True
    return max_iter, False


def entry():
    """Compile and return the C entry point of :func:`pg_steps` (:mod:`prbmrm.kernels.native`'s ``pg_steps``).

    ``steps = c_pg_steps(G, rows, cols, scale, b, x0, x, n, tol, below,
    max_iter, work, converged)``: pointers to C-contiguous float64 arrays
    (G rows x cols, its leading n x n block read; work 6 x n) and to one
    int64 that receives the convergence flag.
    """
    from numba import carray, cfunc, types

    f8, i8 = types.float64, types.int64
    f8p = types.CPointer(f8)

    @cfunc(i8(f8p, i8, i8, f8, f8p, f8p, f8p, i8, f8, i8, i8, f8p, types.CPointer(i8)), error_model="numpy")
    def c_pg_steps(G, rows, cols, scale, b, x0, x, n, tol, below, max_iter, work, converged):
        steps, done = pg_steps(carray(G, (rows, cols)), scale, carray(b, n), carray(x0, n), carray(x, n), tol,
                               below != 0, max_iter, carray(work, (6, n)))
        converged[0] = 1 if done else 0
        return steps

    return c_pg_steps
