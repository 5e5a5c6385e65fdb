# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The primal active-set method of :func:`prbmrm.regularizers.qp.solve_simplex_qp`, compiled.

Rank 0 solves the simplex QP of the bundle once or twice per iteration while
every other rank waits, with a few pivots per solve on matrices of a few
dozen rows: in numpy each pivot was some twenty calls of microseconds each,
and the solves took a third of a whole run (a9a, hinge, lam 1e-6: 753 solves,
0.6 s of 1.7). Here a solve is one call. The reduced Hessian's Cholesky
factor is LAPACK's, through scipy's public Cython interface
(``scipy.linalg.cython_lapack``, as scikit-learn uses it); importing this
module imports scipy.linalg, so :mod:`prbmrm.regularizers.qp` imports it at
the first solve. The module's own sums are loops in index order, built with
``-ffp-contract=off``, so they round alike on every machine; the LAPACK
calls round as the kernels scipy's OpenBLAS picks for the CPU do (as the
numpy code they replace did). Rank 0 alone solves, so any number of ranks
gets the same bits.

The method, its reduced coordinates and its safeguards are described in
:func:`prbmrm.regularizers.qp.solve_simplex_qp`; the one case left to numpy
is a start whose reduced Hessian is singular (never a warm start), which
:func:`active_set` hands back to its caller.
"""

import numpy as np

from libc.math cimport INFINITY, fabs, sqrt
from scipy.linalg.cython_lapack cimport dpotrf, dpotrs, dtrtrs

cdef enum:
    _SOLVED = 0
    _SINGULAR_START = 1
    _NOT_PSD = 2

SOLVED, SINGULAR_START, NOT_PSD = _SOLVED, _SINGULAR_START, _NOT_PSD
"""Statuses of :func:`active_set`: done (converged or out of steps); the start's reduced Hessian needed
regularising (the caller shrinks the support and calls again); a reduced Hessian not even regularisable."""

cdef int FACTOR_TRIES = 30  # regularisations tried, each shift 10x the last


cdef class _ActiveSet:
    """The support ``S`` of x (``S[0]`` the reference r), the reduced Hessian ``H`` and its lower Cholesky
    factor ``L`` (column-major, leading dimension t: LAPACK's layout), the reduced gradient ``rg``."""
    cdef const double[:, :] Q
    cdef double[::1] x
    cdef double pd_floor
    cdef int t, size  # size: entries of S; the free coordinates are S[1:], H is (size - 1) x (size - 1)
    cdef Py_ssize_t[::1] S
    cdef char[::1] in_S
    cdef double[::1, :] H, L
    cdef double[::1] rg, z, Hz, d, xS, hp

    def __cinit__(self, const double[:, :] Q, double[::1] x, double pd_floor):
        cdef int t = x.shape[0]
        self.Q, self.x, self.pd_floor, self.t = Q, x, pd_floor, t
        # Only entries written before are read: no zeroing.
        self.S = np.empty(t, dtype=np.intp)
        self.in_S = np.empty(t, dtype=np.int8)
        self.H = np.empty((t, t), order="F")
        self.L = np.empty((t, t), order="F")
        self.rg, self.z, self.Hz = np.empty(t), np.empty(t), np.empty(t)
        self.d, self.xS, self.hp = np.empty(t), np.empty(t), np.empty(t)

    cdef void set_support(self) noexcept nogil:
        """Make the nonzero entries of x the support, the largest (the first of equals) the reference; build H."""
        cdef int i, j, k = 0, n
        cdef Py_ssize_t r
        cdef double qrr
        self.size = 0
        for i in range(self.t):
            self.in_S[i] = self.x[i] > 0.0
            if self.in_S[i]:
                self.S[self.size] = i
                if self.x[i] > self.x[self.S[k]]:
                    k = self.size
                self.size += 1
        self.S[0], self.S[k] = self.S[k], self.S[0]
        r, n = self.S[0], self.size - 1
        qrr = self.Q[r, r]
        for j in range(n):
            for i in range(n):
                self.H[i, j] = self.Q[self.S[1 + i], self.S[1 + j]] - self.Q[self.S[1 + i], r] \
                    - self.Q[self.S[1 + j], r] + qrr

    cdef int factor(self) noexcept nogil:
        """Cholesky-factor H into L: 1 as it is, 0 regularised (singular to rounding), -1 not even so."""
        cdef int n = self.size - 1, ld = self.t, info, i, j, attempt
        cdef double shift = 0.0, smallest
        if n == 0:
            return 1
        for attempt in range(FACTOR_TRIES):
            for j in range(n):
                for i in range(j, n):
                    self.L[i, j] = self.H[i, j]
                self.L[j, j] += shift
            dpotrf(b"L", &n, &self.L[0, 0], &ld, &info)
            if info == 0:
                smallest = self.L[0, 0]
                for i in range(1, n):
                    if self.L[i, i] < smallest:
                        smallest = self.L[i, i]
                if smallest * smallest > self.pd_floor:
                    return 1 if shift == 0.0 else 0
            # Singular to rounding: regularise, more strongly if needed.
            shift = self.pd_floor if shift == 0.0 else 10.0 * shift
        return -1

    cdef void set_gradient(self, const double[::1] g) noexcept nogil:
        """Set the reduced gradient from the gradient `g` (of every index)."""
        cdef int i
        for i in range(self.size - 1):
            self.rg[i] = g[self.S[1 + i]] - g[self.S[0]]

    cdef void add(self, Py_ssize_t j, double rg_j) noexcept nogil:
        """Bring `j` (x_j = 0, reduced gradient `rg_j`) into S: border H and L with its row."""
        cdef Py_ssize_t r = self.S[0]
        cdef int n = self.size - 1, ld = self.t, one = 1, info, i
        cdef double qrj = self.Q[r, j], qrr = self.Q[r, r], h, c, squares = 0.0
        h = self.Q[j, j] - 2.0 * qrj + qrr
        self.H[n, n] = h
        if n:
            for i in range(n):
                c = self.Q[self.S[1 + i], j] - self.Q[self.S[1 + i], r] - (qrj - qrr)
                self.H[n, i] = c
                self.H[i, n] = c
                self.z[i] = c
            # The new row of L: ell with L ell = c.
            dtrtrs(b"L", b"N", b"N", &n, &one, &self.L[0, 0], &ld, &self.z[0], &ld, &info)
            for i in range(n):
                self.L[n, i] = self.z[i]
                squares += self.z[i] * self.z[i]
            h -= squares
        # A Schur complement at rounding level means a_j lies in the affine hull of the support: regularise,
        # the next step runs to a bound.
        self.L[n, n] = sqrt(h if h > self.pd_floor else self.pd_floor)
        self.S[self.size] = j
        self.rg[n] = rg_j
        self.in_S[j] = 1
        self.size += 1

    cdef int newton_step(self) noexcept nogil:
        """One line-searched Newton step on S: 1 if no bound blocked it (x minimizes f on S, to rounding), 0
        if indices left S, -1 if no bound blocks an unbounded step or the reduced Hessian left after the drop
        cannot be factored even regularised (Q not positive semidefinite, or not finite)."""
        cdef int n = self.size - 1, ld = self.t, one = 1, info, i, k, kb = -1
        cdef double slope = 0.0, curv = 0.0, step, total = 0.0, ratio, best = INFINITY
        if n == 0:
            return 1
        # In the free coordinates the Newton direction is -z, H z = rg.
        for i in range(n):
            self.z[i] = self.rg[i]
        dpotrs(b"L", &n, &one, &self.L[0, 0], &ld, &self.z[0], &ld, &info)
        for i in range(n):
            slope -= self.rg[i] * self.z[i]
        if slope >= 0.0:
            return 1  # no descent left on S (only rounding in the gradient)
        for i in range(n):
            self.Hz[i] = 0.0
        for k in range(n):
            for i in range(n):
                self.Hz[i] += self.H[i, k] * self.z[k]
        for i in range(n):
            curv += self.z[i] * self.Hz[i]
            total += self.z[i]
        # Exact line search with the unregularised H: along a regularised Newton direction the unit step is
        # not the minimizer.
        step = -slope / curv if curv > 0.0 else INFINITY
        self.d[0] = total
        for i in range(n):
            self.d[1 + i] = -self.z[i]
        for k in range(self.size):
            self.xS[k] = self.x[self.S[k]]
            if self.d[k] < 0.0:
                ratio = self.xS[k] / -self.d[k]
                if ratio < best:
                    best, kb = ratio, k
        if step < best:
            # rg is not updated: the caller prices next, from a fresh gradient.
            for k in range(self.size):
                self.x[self.S[k]] = self.xS[k] + step * self.d[k]
            return 1
        if kb < 0:
            return -1
        step = best
        for k in range(self.size):
            self.xS[k] += step * self.d[k]
        self.xS[kb] = 0.0
        for k in range(self.size):
            if self.xS[k] < 0.0:
                self.xS[k] = 0.0
            self.x[self.S[k]] = self.xS[k]
        for i in range(n):
            self.rg[i] -= step * self.Hz[i]
        return 0 if self.drop() >= 0 else -1

    cdef int drop(self) noexcept nogil:
        """Remove the entries of S where x is 0 (``xS``), keeping H, rg and the order; refactor (its result)."""
        cdef int n = self.size - 1, i, j, k, ii, jj, p = -1
        cdef double hpp = 0.0, rgp = 0.0, largest = -1.0
        for k in range(self.size):
            if self.xS[k] == 0.0:
                self.in_S[self.S[k]] = 0
        if self.xS[0] == 0.0:
            # The reference left: re-reference on the largest remaining entry p (the first of equals),
            # (a_i - a_p).(a_j - a_p) = H_ij - H_ip - H_pj + H_pp.
            for i in range(n):
                if self.xS[1 + i] > 0.0 and self.xS[1 + i] > largest:
                    largest, p = self.xS[1 + i], i
            p = p if p >= 0 else 0  # x sums to 1, so some entry is left; as numpy's argmax would
            for i in range(n):
                self.hp[i] = self.H[i, p]
            hpp, rgp = self.H[p, p], self.rg[p]
            self.S[0] = self.S[1 + p]
            self.xS[1 + p] = 0.0  # now the reference: not a free coordinate
        # Compact in place, in increasing order: an entry moves only to a place already read.
        jj = 0
        for j in range(n):
            if self.xS[1 + j] == 0.0:
                continue
            ii = 0
            for i in range(n):
                if self.xS[1 + i] == 0.0:
                    continue
                if p >= 0:
                    self.H[ii, jj] = self.H[i, j] - self.hp[i] - self.hp[j] + hpp
                else:
                    self.H[ii, jj] = self.H[i, j]
                ii += 1
            self.rg[jj] = self.rg[j] - rgp if p >= 0 else self.rg[j]
            self.S[1 + jj] = self.S[1 + j]
            jj += 1
        self.size = 1 + jj
        return self.factor()


cdef check_inputs(const double[:, :] Q, Py_ssize_t b_size, double[::1] x):
    """Refuse what would be read out of bounds: Q smaller than t x t, b not of t, x without a positive entry."""
    cdef Py_ssize_t t = x.shape[0]
    if Q.shape[0] < t or Q.shape[1] < t or b_size != t:
        raise ValueError(f"need Q of at least {t} x {t} and b of {t}, got {Q.shape[0]} x {Q.shape[1]} and "
                         f"{b_size}")
    if not np.any(np.asarray(x) > 0.0):
        raise ValueError("x must be a point of the simplex: it has no positive entry")


def reduced_hessian(const double[:, :] Q, double[::1] x):
    """The support of `x` (its reference first, as :func:`active_set` takes it) and its reduced Hessian.

    Returns
    -------
    S : ndarray of int, shape (k,)
        The indices where x > 0, the largest entry (the first of equals) first.
    H : ndarray of shape (k - 1, k - 1)
        ``H_ij = Q[S_i, S_j] - Q[S_i, S_0] - Q[S_j, S_0] + Q[S_0, S_0]`` over ``i, j >= 1``.
    """
    check_inputs(Q, x.shape[0], x)
    cdef _ActiveSet state = _ActiveSet(Q, x, 1.0)
    state.set_support()
    n = state.size - 1
    return np.array(state.S[:state.size]), np.array(state.H[:n, :n])


def active_set(const double[:, :] Q, const double[::1] b, double[::1] x, double tol, Py_ssize_t max_iter,
               double pd_floor, double noise, bint first=True):
    """Minimize ``0.5 x^T Q x - b^T x`` over the simplex from `x` (on it), in place.

    Parameters
    ----------
    Q : ndarray of shape (t, t)
        Symmetric positive semidefinite; read by entries (a strided view does).
    b : ndarray of shape (t,)
    x : ndarray of shape (t,)
        The start, on the simplex; the solution on return.
    tol, max_iter : float, int
        As in :func:`prbmrm.regularizers.qp.solve_simplex_qp`.
    pd_floor : float
        A Cholesky pivot whose square is at most this is rounding noise: H is regularised.
    noise : float
        The rounding level of the gradient: optimality is not decided below it.
    first : bool
        Whether this is the first call of the solve: then a start whose reduced Hessian needs
        regularising returns :data:`SINGULAR_START` at once (the caller shrinks its support).

    Returns
    -------
    status : int
        :data:`SOLVED`, :data:`SINGULAR_START` or :data:`NOT_PSD`.
    iterations : int
        Newton steps taken.
    converged : bool
        The duality gap is within the tolerance.
    """
    cdef int t = x.shape[0], k, c, j, status = _SOLVED, factored
    cdef Py_ssize_t iterations = 0
    cdef bint converged = False, priced = False
    cdef double mu, bx, threshold, gmax, gmin, viol, curv, score, best_score
    cdef double[::1] g = np.empty(t)
    cdef _ActiveSet state = _ActiveSet(Q, x, pd_floor)
    cdef int stepped
    check_inputs(Q, b.shape[0], x)
    with nogil:
        state.set_support()
        factored = state.factor()
        if factored < 0:
            status = _NOT_PSD
        elif factored == 0 and first:
            status = _SINGULAR_START
        while status == _SOLVED and iterations < max_iter:
            # A fresh gradient at every pricing keeps rounding from piling up.
            for j in range(t):
                g[j] = 0.0
            for k in range(state.size):
                for j in range(t):
                    g[j] += x[state.S[k]] * Q[state.S[k], j]
            for j in range(t):
                g[j] -= b[j]
            mu, bx = 0.0, 0.0
            gmax, gmin = g[state.S[0]], g[state.S[0]]
            for k in range(state.size):
                mu += x[state.S[k]] * g[state.S[k]]
                bx += b[state.S[k]] * x[state.S[k]]
                gmax = g[state.S[k]] if g[state.S[k]] > gmax else gmax
                gmin = g[state.S[k]] if g[state.S[k]] < gmin else gmin
            threshold = tol * (1.0 + fabs(0.5 * (bx - mu)))
            threshold = threshold if threshold > noise else noise
            state.set_gradient(g)
            # A warm start from the previous solution is already stationary on its support and is priced at
            # once; other starts take Newton steps first.
            if priced or gmax - gmin <= threshold:
                # Enter the index whose step from x to its vertex e_j would decrease f most, viol^2 /
                # curvature (x^T Q x = mu + b^T x): far fewer entries leave again than with the most
                # negative gradient.
                c, best_score = -1, -INFINITY
                for j in range(t):
                    if state.in_S[j]:
                        continue
                    viol = mu - g[j]
                    if viol > threshold:
                        curv = Q[j, j] - 2.0 * (g[j] + b[j]) + (mu + bx)
                        score = viol * viol / (curv if curv > pd_floor else pd_floor)
                        if score != score:  # NaN (overflowed Q or b): numpy's argmax would take the first one
                            c = j
                            break
                        if c < 0 or score > best_score:
                            c, best_score = j, score
                if c >= 0:
                    state.add(c, g[c] - g[state.S[0]])
                elif mu - gmin <= threshold:
                    converged = True  # mu - min(g) bounds f(x) - f*: the duality gap
                    break
            priced = True
            while iterations < max_iter:
                iterations += 1
                stepped = state.newton_step()
                if stepped < 0:
                    status = _NOT_PSD
                if stepped != 0:
                    break
    return status, iterations, converged
