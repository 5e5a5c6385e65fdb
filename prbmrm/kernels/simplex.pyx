# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The projected-gradient steps of :func:`prbmrm.regularizers.qp.solve_simplex_pg`, compiled.

Written with explicit loops: every sum runs from 0.0 in index order, and
the module is built with ``-ffp-contract=off``, so the steps are the same
bitwise on every machine.
"""

import numpy as np

from libc.math cimport fabs

cdef double ALPHA_MIN = 1e-10, ALPHA_MAX = 1e10, TINY = 1e-20
cdef double SUPPORT = 1e-15  # entries of x at most this are off the support in the KKT test


cdef inline double fmax2(double a, double b) noexcept nogil:
    return a if a > b else b


cdef inline double fmin2(double a, double b) noexcept nogil:
    return a if a < b else b


cdef void sift_down(double* a, Py_ssize_t root, Py_ssize_t end) noexcept nogil:
    """Restore the max-heap order of ``a[:end]`` below `root`."""
    cdef Py_ssize_t child
    cdef double t
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and a[child] < a[child + 1]:
            child += 1
        if not a[root] < a[child]:
            return
        t = a[root]
        a[root] = a[child]
        a[child] = t
        root = child


cdef void heapsort(double* a, Py_ssize_t n) noexcept nogil:
    """Sort ``a[:n]`` increasingly in place."""
    cdef Py_ssize_t root, end
    cdef double t
    for root in range(n // 2 - 1, -1, -1):
        sift_down(a, root, n)
    for end in range(n - 1, 0, -1):
        t = a[0]
        a[0] = a[end]
        a[end] = t
        sift_down(a, 0, end)


cdef void project(const double* v, Py_ssize_t n, bint below, double* out) noexcept nogil:
    """Write into `out` the projection of `v` onto the simplex (`below`: onto ``{x >= 0, sum(x) <= 1}``).

    Sort-based (Held et al. 1974): the threshold is ``(sum_{i<=k} u_i - 1) / k``
    for the largest k with ``u_k > (sum_{i<=k} u_i - 1) / k``, u being v
    sorted decreasingly. That k never reaches an entry at most ``max(v) - 1``,
    so only the entries above are sorted: usually a handful of the bundle's hundreds.
    """
    cdef Py_ssize_t i, k, count = 0
    cdef double total, top, cut, css, shift, x
    if below:
        total = 0.0
        for i in range(n):
            out[i] = v[i] if v[i] > 0.0 else 0.0
            total += out[i]
        if total <= 1.0:
            return
    top = v[0]
    for i in range(n):
        top = fmax2(top, v[i])
    cut = top - 1.0
    for i in range(n):
        if v[i] > cut:
            out[count] = v[i]
            count += 1
    heapsort(out, count)  # out is rewritten whole below
    css = -1.0
    shift = 0.0
    for k in range(count):
        css += out[count - 1 - k]
        if out[count - 1 - k] * (k + 1.0) > css:
            shift = css / (k + 1.0)
    for i in range(n):
        x = v[i] - shift
        out[i] = x if x > 0.0 else 0.0


cdef void product(const double* G, Py_ssize_t stride, double scale, const double* d, Py_ssize_t n,
                  double* out) noexcept nogil:
    """``out = scale * G @ d`` over the rows of G where d is nonzero (G symmetric with rows of `stride`
    values, its leading n x n block read)."""
    cdef Py_ssize_t i, j
    cdef double dj
    for i in range(n):
        out[i] = 0.0
    for j in range(n):
        dj = d[j]
        if dj != 0.0:
            for i in range(n):
                out[i] += G[j * stride + i] * dj
    for i in range(n):
        out[i] *= scale


cdef double dot(const double* u, const double* v, Py_ssize_t n) noexcept nogil:
    """``u @ v`` summed in index order."""
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        total += u[i] * v[i]
    return total


cdef bint kkt_holds(const double* x, const double* g, Py_ssize_t n, double tol, double ak,
                    double xx) noexcept nogil:
    """BMRM 2.1's test once a step was short (`ak` = its squared length, `xx` = ``|x|^2``).

    g within `tol` of its mean on the support of x, and no smaller than that
    mean minus `tol` elsewhere; with no support, a step shorter still.
    """
    cdef double total = 0.0, mean
    cdef Py_ssize_t i, count = 0
    for i in range(n):
        if x[i] > SUPPORT:
            total += g[i]
            count += 1
    if count == 0:
        return ak < 0.25 * tol * tol * xx
    mean = total / count
    for i in range(n):
        if x[i] > SUPPORT:
            if fabs(g[i] - mean) > tol:
                return False
        elif g[i] < mean - tol:
            return False
    return True


cdef Py_ssize_t steps(const double* G, Py_ssize_t stride, double scale, const double* b, const double* x0,
                      double* x, Py_ssize_t n, double tol, bint below, Py_ssize_t max_iter, double* work,
                      bint* converged) noexcept nogil:
    cdef double* t = work
    cdef double* g = work + n
    cdef double* d = work + 2 * n
    cdef double* Qd = work + 3 * n
    cdef double* y = work + 4 * n
    cdef double* v = work + 5 * n
    cdef Py_ssize_t i, iteration, since_best = 0, nonzero_y, nonzero_d
    cdef double step = 0.0, alpha, f_ref, f, f_best, f_c, f_start, ak_old = 0.0, bk_old = 0.0
    cdef double gd, ak, bk, f_new, s, xx
    converged[0] = True
    project(x0, n, below, x)
    product(G, stride, scale, x, n, t)
    for i in range(n):
        g[i] = t[i] - b[i]
        v[i] = x[i] - g[i]
    project(v, n, below, d)
    for i in range(n):
        step = fmax2(step, fabs(d[i] - x[i]))
    if step < tol * 1e-3:
        return 0
    alpha = 1.0 / fmax2(step, ALPHA_MIN)
    f_ref = ALPHA_MAX
    f = 0.0
    for i in range(n):
        f += x[i] * (0.5 * t[i] - b[i])
    f_best = f_c = f_start = f
    for iteration in range(1, max_iter + 1):
        for i in range(n):
            v[i] = x[i] - alpha * g[i]
        project(v, n, below, y)
        # Qd = Q (y - x): from the rows of Q where y - x is nonzero, or as
        # Q y - t where y has fewer nonzeros (as BMRM 2.1 does).
        nonzero_y = 0
        nonzero_d = 0
        for i in range(n):
            d[i] = y[i] - x[i]
            nonzero_y += y[i] != 0.0
            nonzero_d += d[i] != 0.0
        gd = dot(d, g, n)
        if nonzero_y < nonzero_d:
            product(G, stride, scale, y, n, Qd)
            for i in range(n):
                Qd[i] -= t[i]
        else:
            product(G, stride, scale, d, n, Qd)
        ak = dot(d, d, n)
        bk = dot(d, Qd, n)
        f_new = f + gd + 0.5 * bk
        if f_new >= (f_start if iteration == 1 else f_ref) and bk > TINY * ak and gd < 0.0:
            # The nonmonotone test failed: exact line search along d.
            s = -gd / bk
            for i in range(n):
                d[i] *= s
                Qd[i] *= s
            f_new = f + s * gd + 0.5 * s * s * bk
            ak = s * s * ak
            bk = s * s * bk
        for i in range(n):
            x[i] += d[i]
            t[i] += Qd[i]
            g[i] = t[i] - b[i]
        f = f_new
        if f_new < f_best:
            f_best = f_c = f_new
            since_best = 0
        else:
            f_c = fmax2(f_c, f_new)
            since_best += 1
            if since_best == 2:
                f_ref = f_c
                f_c = f_new
                since_best = 0
        if bk <= TINY * ak:
            alpha = ALPHA_MAX
        else:
            alpha = ak / bk if bk_old < TINY * ak_old else (ak_old + ak) / (bk_old + bk)
            alpha = fmin2(fmax2(alpha, ALPHA_MIN), ALPHA_MAX)
        ak_old = ak
        bk_old = bk
        xx = dot(x, x, n)
        if ak < 100.0 * tol * tol * xx and kkt_holds(x, g, n, tol, ak, xx):
            return iteration
    converged[0] = False
    return max_iter


def pg_steps(const double[:, ::1] G, double scale, const double[::1] b, const double[::1] x0, double[::1] x,
             double tol, bint below, Py_ssize_t max_iter):
    """Run the projected-gradient steps from `x0` projected into `x` (written); return (steps, converged).

    Minimizes ``f(x) = 0.5 x^T Q x - b^T x`` with ``Q = scale * G`` over the
    simplex (`below`: ``sum(x) <= 1``), as :func:`prbmrm.regularizers.qp.solve_simplex_pg`
    describes: Dai and Fletcher's nonmonotone Barzilai-Borwein steps with
    BMRM 2.1's stopping test. Per step: one product with the rows of G where
    the step is nonzero and one projection; f, ``<d, g>`` and the curvatures
    are carried as scalars (``f(x + d) = f + <g, d> + <d, Qd> / 2``).
    `G` may be larger than n x n (its leading block is read), n = ``len(b)``.
    """
    cdef Py_ssize_t n = b.shape[0], taken
    cdef bint converged
    if x0.shape[0] != n or x.shape[0] != n or G.shape[0] < n or G.shape[1] < n or n == 0:
        raise ValueError("pg_steps needs vectors of one size n > 0 and G at least n x n")
    work = np.empty(6 * n)
    cdef double[::1] scratch = work
    with nogil:
        taken = steps(&G[0, 0], G.shape[1], scale, &b[0], &x0[0], &x[0], n, tol, below, max_iter, &scratch[0],
                      &converged)
    return int(taken), bool(converged)
