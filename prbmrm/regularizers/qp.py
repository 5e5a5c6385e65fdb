"""The BMRM dual subproblem for the L2 regularizer: a QP over the simplex.

With the bundle ``A = [a_1, ..., a_t]`` (d x t), offsets ``b`` and
``Q = A^T A / lam``, Corollary 3 of Teo et al. (JMLR 2010) reads

    maximize_x  b^T x - 0.5 x^T Q x   subject to  x >= 0,  sum(x) = 1.

Rank 0 solves it once per BMRM iteration while every other rank waits, so
it must cost far less than a pass over the data. ``Q`` is positive
semidefinite and usually singular (rank <= d, and planes become nearly
identical as BMRM converges), ``t`` is a few hundred at most and the
solution is sparse. :func:`solve_simplex_qp` is a primal active-set method
built for exactly this: warm-started from the previous iteration's solution
padded with a zero, it usually needs only a handful of pivots, each a
Cholesky border or refactorisation of the small reduced Hessian on the
support. General QP solvers pay for generality here: on a9a bundles of
200 planes at lam 1e-4 (``scripts/bench_qp.py``) DAQP, Clarabel and OSQP
take 8-14, about 35 and about 30 ms per solve, this solver (its pivots
compiled, :mod:`prbmrm.kernels.activeset`) 0.07 ms warm and 0.3 ms cold.

Imports: numpy; of prbmrm: :mod:`prbmrm.kernels.simplex`, :mod:`prbmrm.kernels.activeset` (at the first
solve: it imports scipy.linalg).
"""

import functools
import sys
from dataclasses import dataclass

import numpy as np

from ..kernels.simplex import pg_steps

__all__ = ["SimplexQPResult", "solve_simplex_pg", "solve_simplex_qp", "solve_two_plane_qp"]

_EPS = np.finfo(np.float64).eps
# A Cholesky pivot below this fraction of max(diag Q) is rounding noise
# (entries of the reduced Hessian are differences of entries of Q): treat
# the reduced Hessian as singular there and regularise it instead.
_PD_REL = 1e-12
# Gradients g = Qx - b are only known to about eps * (max|Q| + max|b|);
# optimality cannot be decided below a small multiple of that.
_NOISE_MULT = 64.0

@functools.cache
def _kernel():
    """The compiled active-set method, imported at the first solve: it imports scipy.linalg (LAPACK), 50-100 ms
    of start-up that runs which never call :func:`solve_simplex_qp` need not pay."""
    from ..kernels import activeset

    return activeset


@dataclass
class SimplexQPResult:
    """Solution of the simplex QP.

    Attributes
    ----------
    x : ndarray of shape (t,)
        The solution: ``x >= 0`` and ``sum(x) == 1`` (up to one rounding).
    value : float
        The dual objective ``b @ x - 0.5 * x @ Q @ x`` at `x` (to maximize).
    iterations : int
        Number of Newton steps on the support; each one follows the entry
        of an index or ends in the removal of one.
    converged : bool
        True if the optimality conditions hold to the tolerance; False if
        the iteration limit stopped the method (`x` is still feasible).
    """

    x: np.ndarray
    value: float
    iterations: int
    converged: bool


def solve_simplex_qp(Q, b, x0=None, tol=1e-10, max_iter=None):
    """Maximize ``b @ x - 0.5 * x @ Q @ x`` over the probability simplex.

    Equivalently minimize ``f(x) = 0.5 x^T Q x - b^T x`` subject to
    ``x >= 0, sum(x) = 1``: the dual of the BMRM subproblem with an L2
    regularizer (Corollary 3 of Teo et al., JMLR 2010).

    A primal active-set method. On the support ``S`` the sum constraint is
    eliminated against a reference index ``r`` of ``S``; the reduced Hessian
    ``H = Z^T Q_SS Z`` is kept with its Cholesky factor, bordered when an
    index enters and refactorised when one leaves. Newton steps on ``S``
    (an exact line search capped at the first bound that blocks, whose
    index then leaves ``S``) alternate with pricing: once ``x`` minimizes
    ``f`` on ``S``, the gradient ``g = Qx - b`` is recomputed and the index
    outside ``S`` with ``g_j < x @ g`` whose move to its vertex promises
    the largest decrease enters. A reduced Hessian that is singular to
    rounding (duplicate or affinely dependent planes) is regularised by a
    tiny diagonal term, so its Newton step runs along the (near)
    zero-curvature direction to a bound; the line search uses the
    unregularised ``H``, so no step increases ``f``. A start whose support
    is already affinely dependent is first shrunk along the null space of
    ``H``, where ``f`` is linear.

    Parameters
    ----------
    Q : array_like of shape (t, t)
        Symmetric positive semidefinite matrix, e.g. ``A.T @ A / lam``.
    b : array_like of shape (t,)
        Linear term.
    x0 : array_like of shape (t,), optional
        Starting point, typically the previous BMRM solution padded with a
        zero for the new plane. A point that is not exactly on the simplex
        is projected onto it. By default start at the vertex ``e_i`` with
        the largest ``b_i - 0.5 Q_ii``.
    tol : float, default 1e-10
        Relative accuracy of the dual objective: on return the duality gap
        ``x @ g - min(g)`` with ``g = Q @ x - b`` is at most
        ``tol * (1 + |value|)`` (or the rounding level of ``g``, if larger),
        which bounds ``value* - value``.
    max_iter : int, optional
        Maximum number of Newton steps; default ``10 * t + 100``.

    Returns
    -------
    SimplexQPResult
        The solution, the dual objective at it, the pivot count and whether
        the optimality conditions were met.

    Raises
    ------
    ValueError
        If the shapes of `Q`, `b` and `x0` do not agree, `t` is zero, or
        `b`, the diagonal of `Q` or `x0` is not finite.
    numpy.linalg.LinAlgError
        If a reduced Hessian cannot be factorised even when regularised
        (`Q` far from positive semidefinite, or not finite).
    """
    # No contiguous copy: BMRM passes a view into a preallocated Gram
    # buffer, and only rows and single entries of Q are ever read.
    Q = np.asarray(Q, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).ravel()
    t = b.size
    if t == 0 or Q.shape != (t, t):
        raise ValueError(f"need Q of shape (t, t) and b of shape (t,), got {Q.shape} and {b.shape}")
    diag = Q.diagonal()
    if not (np.isfinite(b).all() and np.isfinite(diag).all()):
        raise ValueError("b and the diagonal of Q must be finite")
    max_iter = 10 * t + 100 if max_iter is None else int(min(max_iter, sys.maxsize))  # inf: no limit

    if x0 is None:
        x = np.zeros(t)
        x[np.argmax(b - 0.5 * diag)] = 1.0
    else:
        x0 = np.asarray(x0, dtype=np.float64).ravel()
        if x0.size != t or not np.isfinite(x0).all():
            raise ValueError(f"x0 must be {t} finite numbers")
        x = to_simplex(x0)
    if t == 1:
        return _result(Q, b, x, 0, True)

    qscale = max(float(diag.max()), 0.0)
    pd_floor = _PD_REL * qscale if qscale > 0.0 else _EPS
    noise = _NOISE_MULT * _EPS * (qscale + float(np.abs(b).max()))

    kernel = _kernel()
    status, iterations, converged = kernel.active_set(Q, b, x, tol, max_iter, pd_floor, noise)
    if status == kernel.SINGULAR_START:
        # A previous solution's support never gets here, an arbitrary start's may (many planes, few dimensions).
        _shrink_support(Q, b, x, pd_floor)
        status, iterations, converged = kernel.active_set(Q, b, x, tol, max_iter, pd_floor, noise, first=False)
    if status == kernel.NOT_PSD:
        raise np.linalg.LinAlgError("reduced Hessian not positive semidefinite: is Q?")
    return _result(Q, b, x, iterations, converged)


def _shrink_support(Q, b, x, pd_floor):
    """Shrink a support whose reduced Hessian is singular without increasing f; `x` in place.

    Along a direction u with ``sum(u) = 0`` and ``Q_SS u = 0`` the
    gradient does not change and ``f`` is linear, so moving the downhill
    way until an entry of x reaches 0 drops that index for free (as in
    Caratheodory's theorem). One eigendecomposition gives all such
    directions; each drop removes one of them by elimination, instead
    of one refactorisation per drop in the Newton steps.
    """
    S, H = _kernel().reduced_hessian(Q, x)  # the reference first, as the active-set method takes it
    QSS = Q.take(S, 0).take(S, 1)
    w, V = np.linalg.eigh(H)
    N = V[:, w <= pd_floor]
    # Null directions in the coordinates of S: x_r moves by -sum(x_o).
    D = np.vstack((-N.sum(axis=0), N))
    xS = x[S]
    gS = QSS @ xS - b[S]
    while D.shape[1]:
        u = D[:, 0]
        slope = gS @ u
        if slope > 0.0:
            u, slope = -u, -slope
        neg = (u < 0.0).nonzero()[0]
        if neg.size == 0:
            break
        ratios = xS[neg] / -u[neg]
        step = ratios.min()
        if slope * step + 0.5 * step * step * (u @ QSS @ u) > 0.0:
            # Not flat enough after all: leave it to the Newton steps,
            # whose line search uses the true curvature.
            break
        xS += step * u
        xS[neg[ratios.argmin()]] = 0.0
        xS[xS < 0.0] = 0.0
        for p in neg[xS[neg] == 0.0]:
            # Keep only the null directions that vanish at p.
            c = np.abs(D[p]).argmax()
            if D[p, c] != 0.0:
                D = D - np.outer(D[:, c], D[p] / D[p, c])
                D = np.delete(D, c, axis=1)
            D[p] = 0.0
    x[S] = xS


def solve_two_plane_qp(Q, b):
    """Maximize ``b @ x - 0.5 * x @ Q @ x`` over the simplex of dimension 2, in closed form.

    With ``x = (1 - eta, eta)`` the objective is a concave quadratic in eta:
    its stationary point clipped to [0, 1] is the optimum. This is eq. 14 of
    paper 000 (Alg. 4, BMRM with bundle size 2) written with the Gram matrix:
    ``Q = A A^T / lam``, plane 0 the aggregate and plane 1 the new plane.

    Parameters
    ----------
    Q : ndarray of shape (2, 2)
        Symmetric positive semidefinite.
    b : ndarray of shape (2,)

    Returns
    -------
    SimplexQPResult
        ``iterations`` is 0; ``converged`` is True.
    """
    slope = b[1] - b[0] + Q[0, 0] - Q[0, 1]  # derivative at eta = 0
    curvature = Q[0, 0] - 2.0 * Q[0, 1] + Q[1, 1]  # |a_1 - a_0|^2 / lam
    if curvature > 0.0:
        eta = min(max(slope / curvature, 0.0), 1.0)
    else:  # identical subgradients: the objective is linear in eta
        eta = 1.0 if slope > 0.0 else 0.0
    return _result(Q, b, np.array([1.0 - eta, eta]), 0, True)


def solve_simplex_pg(Q, b, x0, tol, floor=None, max_iter=10000, scale=1.0):
    """Maximize ``b @ x - 0.5 * x @ Q @ x`` over the simplex to a loose tolerance, by projected gradient.

    With a `floor`, over ``x >= 0, sum(x) <= 1`` instead, the objective
    being ``b @ x + floor (1 - sum(x)) - 0.5 x @ Q @ x``: the plane
    ``R_emp >= floor`` (BMRM 2.1's ``xi >= 0``) joins the bundle implicitly,
    with the multiplier ``1 - sum(x)``.

    The projected-gradient method BMRM 2.1 solves its subproblems with
    (``CL2N2_DaiFletcherPGM::SolveQP``: Dai and Fletcher's nonmonotone
    Barzilai-Borwein steps), with its stopping test: once a step is shorter
    than ``10 tol |x|``, stop if the gradient ``g = Qx - b`` is within `tol`
    of its mean on the support of x and no smaller than that mean minus `tol`
    elsewhere. Warm-started from the previous solution and stopped at the
    loose tolerance BMRM 2.1's schedule sets, it moves the multipliers only
    part of the way to the optimum, which steadies the iterates (paper 000's
    proximal and trust-region bundle methods do it explicitly). Every
    iterate is projected onto the simplex, so the dual value returned is a
    valid lower bound however early the method stops. The projection is
    exact (sort-based) where BMRM 2.1 searches its multiplier by secants.
    The steps run compiled (:func:`prbmrm.kernels.simplex.pg_steps`): in
    numpy each step would be ~30 calls of a microsecond or two on vectors of
    a few hundred entries, 3-7x the C++ original's QP time.

    Parameters
    ----------
    Q, b : ndarray
        As in :func:`solve_simplex_qp`, except that `Q` may be larger than
        t x t: its leading t x t block is the matrix (BMRM's Gram buffer,
        read in place; a C-contiguous array lets the kernel vectorize).
    x0 : ndarray of shape (t,)
        The start, projected onto the simplex first.
    tol : float
        BMRM 2.1's KKT tolerance (> 0); the duality gap on return is at most
        about ``2 tol``.
    floor : float, optional
        A lower bound of the risk, the offset of the implicit plane.
    max_iter : int
        Maximum number of projected-gradient steps.
    scale : float
        The QP's matrix is ``scale * Q`` (BMRM passes its Gram matrix as it is
        with ``1 / lam``: no scaled copy per iteration).

    Returns
    -------
    SimplexQPResult
        ``iterations`` counts the steps; ``converged`` is False if `max_iter` stopped them.
    """
    Q = np.ascontiguousarray(Q, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64) if floor is None else b - floor
    below = floor is not None
    x = np.empty(b.size)
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    steps, converged = pg_steps(Q, float(scale), b, x0, x, float(tol), below, int(max_iter))
    qp = _result(Q, b, x, steps, converged, below=below, scale=scale)
    if below:
        qp.value += floor
    return qp


def to_simplex(v):
    """Return `v` if it is on the simplex to rounding, else its projection."""
    s = v.sum()
    if v.min() >= 0.0 and abs(s - 1.0) <= 1e-12 and s > 0.0:
        return v / s
    # Euclidean projection onto the simplex (sort-based; Held et al. 1974).
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.flatnonzero(u * np.arange(1, v.size + 1) > css)[-1]
    x = np.maximum(v - css[k] / (k + 1), 0.0)
    return x / x.sum()


def _result(Q, b, x, iterations, converged, below=False, scale=1.0):
    """Clip and renormalise `x` onto the simplex (`below`: into ``sum(x) <= 1``) and evaluate the dual there
    (of ``scale * Q``)."""
    x = np.maximum(x, 0.0)
    total = x.sum()
    if not below or total > 1.0:
        x /= total
    S = x.nonzero()[0]
    xs = x[S]
    value = float(b[S] @ xs - 0.5 * xs @ Q.take(S, 0).take(S, 1) @ xs * scale)
    return SimplexQPResult(x=x, value=value, iterations=iterations, converged=converged)
