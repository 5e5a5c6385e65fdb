"""Regularizers Omega, their Fenchel duals, and the bundle subproblem each one induces on rank 0.

BMRM's step (paper 000, eq. 7) is ``argmin_w lam * Omega(w) + max_i <a_i, w> + b_i``.
Theorem 2 gives its dual over the simplex of the bundle's t planes (eq. 10)::

    maximize  J_t^*(alpha) = b^T alpha - lam * Omega^*(-A^T alpha / lam),   alpha >= 0, sum(alpha) = 1

with ``w = grad Omega^*(-A^T alpha / lam)``. Any feasible alpha gives a lower
bound of min J_t, hence of min J: the solvers report it as the certified lower
bound, so an inner solver that stops early costs progress, never correctness.
Three inner solvers cover the regularizers: the simplex QP of
:mod:`prbmrm.solvers.qp` for the quadratic ones (``l2``, ``quadratic``), the linear
program of paper 000's App. C for ``l1`` (HiGHS, warm-started), and an
accelerated projected gradient method on the smooth dual for the others.
Found by name in :data:`REGULARIZERS`.

Imports: highspy, numpy, scipy; of prbmrm: :mod:`prbmrm.params`, :mod:`prbmrm.errors`,
:mod:`prbmrm.plugins`, :mod:`prbmrm.solvers.qp`.
"""

import math
import zlib
from functools import partial

import numpy as np

from ..params import Parametrized
from ..errors import InputError, UsageError
from ..solvers.qp import to_simplex, solve_simplex_pg, solve_simplex_qp, solve_two_plane_qp

_EPS = np.finfo(np.float64).eps


class Regularizer(Parametrized):
    """Base class: a convex Omega with its Fenchel dual and its bundle subproblem.

    Parameters
    ----------
    **params
        Values for the names in :attr:`params` (``--reg-param NAME=VALUE``).

    Attributes
    ----------
    name : str
        The registry name (``--reg`` on the command line).
    params : dict
        Parameter names and their defaults.
    metric : callable or None
        ``a -> M a`` for the Gram matrix ``A M A^T`` the bundle keeps (see
        :class:`prbmrm.solvers.Bundle`); None for ``A A^T``.
    """

    kind = "regularizer"
    option = "--reg-param"
    metric = None
    differentiable = False  # on all of R^d, so that gradient methods (L-BFGS) apply
    quadratic = False  # along every line, so that the line search of LS-BMRM may be exact

    def prepare(self, dim, risk_floor=0.0):
        """Set up what depends on the problem; called once before training.

        Parameters
        ----------
        dim : int
            Length of w.
        risk_floor : float
            A lower bound of the risk ``R_emp`` (``loss.risk_floor``); only
            :class:`L1` uses it.
        """

    def value(self, w):
        """Return Omega(w) (inf outside the domain)."""
        raise NotImplementedError

    def subgradient(self, w):
        """Return a subgradient of Omega at `w` (where one exists)."""
        raise NotImplementedError

    def conjugate(self, mu):
        """Return the Fenchel dual ``Omega^*(mu) = sup_w <w, mu> - Omega(w)`` (eq. 8)."""
        raise NotImplementedError

    def conjugate_gradient(self, mu):
        """Return ``grad Omega^*(mu)``: the w attaining the supremum of eq. 8."""
        raise NotImplementedError

    def initial_point(self, dim):
        """Return the starting point of the solvers: ``argmin Omega = grad Omega^*(0)``, in the domain."""
        return self.conjugate_gradient(np.zeros(dim))

    def line(self, w, d):
        """Return ``omega(eta) -> (Omega(w + eta d), <subgradient, d>)``, O(d) per call."""
        def omega(eta):
            point = w + eta * d
            return self.value(point), float(np.dot(self.subgradient(point), d))
        return omega

    def solve_subproblem(self, bundle, lam, alpha0=None):
        """Minimize ``J_t(w) = lam * Omega(w) + max_i <a_i, w> + b_i`` over the bundle's planes.

        Parameters
        ----------
        bundle : prbmrm.solvers.Bundle
        lam : float
        alpha0 : ndarray or None
            Warm start: the previous multipliers, padded for new planes.

        Returns
        -------
        w : ndarray
            The minimizer w_t (to the inner solver's accuracy).
        lower_bound : float
            The dual value ``J_t^*(alpha)`` at the returned multipliers, a
            certified lower bound of min J_t (hence of min J) even if the
            inner solver stopped early.
        alpha : ndarray
            The multipliers, on the simplex (:class:`L1`: sum at most 1).
        """
        raise NotImplementedError


# --------------------------------------------------------------------------
# Quadratic forms: the simplex QP of Corollary 3
# --------------------------------------------------------------------------

class Quadratic(Regularizer):
    """``Omega(w) = w^T B w / 2`` for a positive definite B; ``Omega^*(mu) = mu^T B^-1 mu / 2``.

    ``B`` (``--reg-param B=...``) is a number c (``c I``), a text file of d
    numbers (a diagonal) or of a d x d symmetric positive definite matrix,
    factored once (Cholesky); from Python also a float or an array. The dual
    is the simplex QP of Corollary 3 with the Gram matrix ``A B^-1 A^T``,
    which the bundle keeps through :attr:`metric`; ``w = -B^-1 A^T alpha / lam``.
    """

    name = "quadratic"
    quadratic = True
    differentiable = True
    params = {"B": None}
    risk_floor = None  # a lower bound of R_emp once prepared: the plane (0, floor) BMRM may add

    def check_params(self):
        B = 1.0 if self.B is None else self.B
        if isinstance(B, str):
            try:
                B = float(B)
            except ValueError:
                B = self._read_numbers("B")
        B = np.asarray(B, dtype=np.float64)
        if B.ndim == 2 and 1 in B.shape:
            B = B.ravel()
        where = self._where("B")
        if not np.isfinite(B).all():
            raise UsageError(f"{where}: B has a non-finite entry")
        self._diagonal = self._matrix = self._solve = None
        if B.ndim == 2:
            if B.shape[0] != B.shape[1]:
                raise UsageError(f"{where}: expected d numbers or a d x d matrix, got {B.shape[0]} x {B.shape[1]}")
            if np.abs(B - B.T).max() > 1e-10 * np.abs(B).max():
                raise UsageError(f"{where}: the matrix is not symmetric")
            self._matrix = 0.5 * (B + B.T)
            from scipy.linalg import LinAlgError, cho_factor, cho_solve  # here alone: 50-100 ms to import
            try:
                self._solve = partial(cho_solve, cho_factor(self._matrix))
            except LinAlgError:
                raise UsageError(f"{where}: the matrix is not positive definite") from None
        elif (B > 0).all():
            self._diagonal = B
        else:
            raise UsageError(f"{where}: the diagonal of B must be > 0, got {float(B.min()):g}")
        # c I only scales the Gram matrix A A^T; other B need A B^-1 A^T.
        self._scale = float(B) if B.ndim == 0 else 1.0
        self.metric = None if B.ndim == 0 else self.conjugate_gradient
        self._size = None if B.ndim == 0 else B.shape[0]
        self._identity = B.ndim == 0 and float(B) == 1.0  # B = I: w * 1.0 and w / 1.0 are w; no copies of d

    def prepare(self, dim, risk_floor=0.0):
        """Check that B has one row (or diagonal entry) per weight; record `risk_floor` (BMRM's floor plane)."""
        self.risk_floor = float(risk_floor)
        if self._size is not None and self._size != dim:
            raise UsageError(f"{self._where('B')}: the model has {dim} weights, B has {self._size} "
                             f"(expected {dim} numbers or a {dim} x {dim} matrix)")

    def value(self, w):
        Bw = w if self._identity else w * self._diagonal if self._matrix is None else self._matrix @ w
        return 0.5 * float(np.dot(w, Bw))

    def subgradient(self, w):
        return w * self._diagonal if self._matrix is None else self._matrix @ w

    def conjugate(self, mu):
        return 0.5 * float(np.dot(mu, self.conjugate_gradient(mu)))

    def line(self, w, d):
        """Return ``omega(eta) -> (Omega(w + eta d), its derivative in eta)``, O(1) per call."""
        Bw, Bd = self.subgradient(w), self.subgradient(d)
        ww, wd, dd = float(np.dot(w, Bw)), float(np.dot(w, Bd)), float(np.dot(d, Bd))
        return lambda eta: (0.5 * ww + eta * (wd + 0.5 * eta * dd), wd + eta * dd)

    def conjugate_gradient(self, mu):
        return mu / self._diagonal if self._matrix is None else self._solve(mu)

    def solve_subproblem(self, bundle, lam, alpha0=None):
        Q = bundle.gram / (lam * self._scale)  # two planes: a closed form (paper 000, Alg. 4, eq. 14)
        qp = solve_two_plane_qp(Q, bundle.b) if bundle.size == 2 else solve_simplex_qp(Q, bundle.b, x0=alpha0)
        return self._primal(bundle.combine(qp.x), lam), qp.value, qp.x

    def solve_loosely(self, bundle, lam, alpha0, tol, floor=None, out=None):
        """Like :meth:`solve_subproblem`, to BMRM 2.1's loose tolerance `tol` (:func:`prbmrm.solvers.qp.solve_simplex_pg`),
        with the implicit plane ``R_emp >= floor`` if a `floor` is given (the multipliers then sum to at most 1);
        w may be written into `out`, an array of length d that nothing else holds (``Bundle.combine``).

        Projected gradient is slow on ill-conditioned subproblems (least squares): after 100,000 steps (BMRM 2.1
        allows 300,000; a9a's subproblems at lam 1e-6 need up to 10,000) it gives up and returns None.
        """
        qp = solve_simplex_pg(bundle.gram_buffer, bundle.b, alpha0, tol, floor, max_iter=100000,
                              scale=1.0 / (lam * self._scale))
        if not qp.converged:
            return None
        return self._primal(bundle.combine(qp.x, out), lam), qp.value, qp.x

    def _primal(self, combined, lam):
        """``B^-1 (-combined / lam)``, overwriting `combined` (bitwise ``-combined / lam`` first)."""
        mu = np.divide(combined, -lam, out=combined)
        return mu if self._identity else self.conjugate_gradient(mu)


class L2(Quadratic):
    """``Omega(w) = ||w||^2 / 2`` (``Omega^* = Omega``): :class:`Quadratic` with B = I."""

    name = "l2"
    params = {}
    B = None


# --------------------------------------------------------------------------
# L1: the linear program of App. C
# --------------------------------------------------------------------------

class L1(Regularizer):
    """``Omega(w) = ||w||_1``; Omega^* is the indicator of ``||mu||_inf <= 1``.

    The subproblem is the LP of paper 000, App. C, over ``w = u - v``::

        minimize  xi + lam 1^T (u + v)   s.t.  <a_i, u - v> + b_i <= xi,  u, v >= 0,  xi >= floor

    solved by HiGHS' dual simplex. One model lives across iterations: new
    planes become new rows and planes the bundle dropped are deleted, so each
    solve starts from the previous basis. ``floor`` is a lower bound of
    ``R_emp`` (0 for nonnegative losses, see :meth:`prepare`): without it
    the LP is unbounded until some convex combination of planes has
    ``||A^T alpha||_inf <= lam``, which takes many iterations for small lam
    (the plane ``R_emp >= floor`` is what BMRM 2.1 adds as ``xi >= 0``). Its
    dual is ``max b^T alpha + floor (1 - sum alpha)`` over ``alpha >= 0``,
    ``sum alpha <= 1``, ``||A^T alpha||_inf <= lam``: the row duals, scaled
    into that set, give the certified lower bound. w is sparse: only basic
    columns are nonzero.
    """

    name = "l1"

    def __init__(self, **params):
        super().__init__(**params)
        self.risk_floor = 0.0
        self._lp = None

    def prepare(self, dim, risk_floor=0.0):
        """Record `risk_floor`, the lower bound of R_emp the LP's ``xi`` is held above."""
        self.risk_floor = float(risk_floor)
        self._lp = None

    def value(self, w):
        return float(np.abs(w).sum())

    def subgradient(self, w):
        return np.sign(w)

    def conjugate(self, mu):
        return 0.0 if np.abs(mu).max(initial=0.0) <= 1.0 else math.inf

    def conjugate_gradient(self, mu):
        """Return 0, the w attaining eq. 8 inside the box ``||mu||_inf <= 1`` (NaN outside: none does)."""
        inside = np.abs(mu).max(initial=0.0) <= 1.0
        return np.zeros_like(mu) if inside else np.full_like(mu, np.nan)

    def solve_subproblem(self, bundle, lam, alpha0=None):
        A, b = bundle.A, bundle.b
        dim = A.shape[1]
        if self._lp is None or self._lp.shape != (dim, lam, self.risk_floor):
            self._lp = _PlaneLP(dim, lam, self.risk_floor)
        x, duals = self._lp.solve(A, b)
        w = x[1:dim + 1] - x[dim + 1:]
        # The row duals are -alpha; rounding may leave them a hair outside the
        # dual feasible set, and only a feasible alpha gives a valid bound.
        alpha = np.maximum(-duals, 0.0)
        total, norm = alpha.sum(), np.abs(alpha @ A).max(initial=0.0)
        alpha *= min(1.0, 1.0 / total if total > 0 else 1.0, lam / norm if norm > 0 else 1.0)
        lower_bound = float(b @ alpha) + self.risk_floor * max(0.0, 1.0 - alpha.sum())
        return w, lower_bound, alpha


class _PlaneLP:
    """The HiGHS model of :class:`L1`, kept in step with a bundle that appends and drops planes.

    Columns: ``xi, u (d), v (d)``; one row ``-xi + <a_i, u> - <a_i, v> <= -b_i``
    per plane. Planes are recognised by their offset and a CRC of their
    subgradient's bytes, so rows survive whatever reordering or removal the
    bundle does.
    """

    # HiGHS refuses matrix entries above its large_matrix_value and takes
    # bounds from its infinite_bound on as infinite.
    LARGEST = 1e15

    def __init__(self, dim, lam, floor):
        from highspy import Highs, kHighsInf

        self.shape = (dim, lam, floor)
        self.dim = dim
        self.inf = kHighsInf
        # highspy.Highs() prints a banner before any option can be set; the
        # compiled class it extends (its module varies between versions) does not.
        self.model = Highs.__bases__[0]()
        self.model.setOptionValue("output_flag", False)
        n = 2 * dim + 1
        self._call("addVars", n, np.r_[floor, np.zeros(2 * dim)], np.full(n, kHighsInf))
        self._call("changeColsCost", n, np.arange(n, dtype=np.int32), np.r_[1.0, np.full(2 * dim, lam)])
        self.keys = []

    def _call(self, method, *args):
        from highspy import HighsStatus

        status = getattr(self.model, method)(*args)
        if status not in (HighsStatus.kOk, HighsStatus.kWarning):
            raise RuntimeError(f"HiGHS {method} failed in the L1 subproblem: {status}")

    def solve(self, A, b):
        """Solve with the planes ``(A, b)``; return the columns and the row duals in bundle order."""
        from highspy import HighsModelStatus

        order = self._sync(A, b)
        self._call("run")
        status = self.model.getModelStatus()
        if status != HighsModelStatus.kOptimal:
            raise RuntimeError(f"HiGHS did not solve the L1 subproblem: {self.model.modelStatusToString(status)}")
        solution = self.model.getSolution()
        return np.asarray(solution.col_value), np.asarray(solution.row_dual)[order]

    def _sync(self, A, b):
        """Delete the rows of planes no longer in the bundle, add the new ones; return row per plane."""
        keys = [(float(offset), zlib.crc32(row)) for row, offset in zip(A, b)]
        held = {}
        for row, key in enumerate(self.keys):
            held.setdefault(key, []).append(row)
        order = np.empty(len(keys), dtype=np.int64)
        new = []
        for j, key in enumerate(keys):
            rows = held.get(key)
            if rows:
                order[j] = rows.pop(0)
            else:
                new.append(j)
        stale = sorted(row for rows in held.values() for row in rows)
        if stale:
            self._call("deleteRows", len(stale), np.array(stale, dtype=np.int32))
            kept = np.ones(len(self.keys), dtype=bool)
            kept[stale] = False
            # Rows after a deleted one move up: renumber the survivors.
            renumber = np.cumsum(kept) - 1
            old = np.setdiff1d(np.arange(len(keys)), new)
            order[old] = renumber[order[old]]
            self.keys = [key for key, keep in zip(self.keys, kept) if keep]
        if new:
            order[new] = len(self.keys) + np.arange(len(new))
            self._add_rows(A[new], b[new])
            self.keys.extend(keys[j] for j in new)
        return order

    def _add_rows(self, A, b):
        if max(np.abs(A).max(), np.abs(b).max()) > self.LARGEST:
            raise InputError(f"the l1 subproblem got a cutting plane with entries beyond {self.LARGEST:g} "
                             "(the iterates diverge: try a larger --lam or scaled features)")
        starts, index, values = [], [], []
        for a in A:
            nz = np.flatnonzero(a)
            starts.append(sum(len(i) for i in index))
            index.append(np.r_[0, 1 + nz, 1 + self.dim + nz])
            values.append(np.r_[-1.0, a[nz], -a[nz]])
        index, values = np.concatenate(index).astype(np.int32), np.concatenate(values)
        self._call("addRows", len(b), np.full(len(b), -self.inf), -b, len(index),
                   np.array(starts, dtype=np.int32), index, values)


# --------------------------------------------------------------------------
# Smooth duals: Newton's method on eq. 10, each step a simplex QP
# --------------------------------------------------------------------------

class SmoothDual(Regularizer):
    """A regularizer whose Omega^* is twice differentiable: eq. 10 is a smooth concave program.

    Subclasses add :meth:`conjugate_hessian`; the subproblem is solved by
    :func:`maximize_smooth_dual`, warm-started from the previous multipliers,
    to a relative duality gap of :attr:`tol`.
    """

    tol = 1e-10
    max_iter = 200

    def conjugate_hessian(self, mu):
        """Return ``(h, c, u)`` with ``Hessian Omega^*(mu) = diag(h) + c u u^T`` (u None: no rank-one term)."""
        raise NotImplementedError

    def solve_subproblem(self, bundle, lam, alpha0=None):
        alpha, value, w = maximize_smooth_dual(self, bundle.A, bundle.b, lam, alpha0, self.tol,
                                               self.max_iter)
        return w, value, alpha


def maximize_smooth_dual(regularizer, A, b, lam, alpha0=None, tol=1e-10, max_iter=200):
    """Maximize ``J_t^*(alpha) = b^T alpha - lam Omega^*(-A^T alpha / lam)`` over the simplex.

    Newton's method with the simplex kept as a constraint (a projected, or
    sequential quadratic, Newton method): each step maximizes the quadratic
    model ``g^T s - s^T H s / 2`` of J_t^* over the simplex, with the gradient
    ``g = b + A w`` (``w = grad Omega^*(mu)``, ``mu = -A^T alpha / lam``) and
    the Hessian ``H = A Hess Omega^*(mu) A^T / lam``, by the active-set QP
    solver of :mod:`prbmrm.solvers.qp` warm-started at alpha; a backtracking (Armijo)
    search along the step keeps J_t^* increasing. The t x t Hessian costs
    ``O(t^2 d)``, far less than the many ``O(t d)`` steps a first-order
    method needs on these ill-conditioned duals (an accelerated projected
    gradient method took thousands of steps for a gap of 1e-7 on bundles of
    20 planes). The primal value ``lam Omega(w) + max_i (A w + b)_i`` at the
    current iterate comes with the gradient (``A w + b = g``): the method
    stops when it exceeds the dual value by at most `tol` relative, or when
    no step increases the dual any more (rounding).

    Parameters
    ----------
    regularizer : SmoothDual
    A : ndarray of shape (t, d)
    b : ndarray of shape (t,)
    lam : float
    alpha0 : ndarray of shape (t,), optional
        Starting point (projected onto the simplex); default: the vertex of
        the largest ``b_i``.
    tol : float
        Relative duality gap at which to stop.
    max_iter : int
        Maximum number of Newton steps.

    Returns
    -------
    alpha : ndarray
        On the simplex.
    value : float
        ``J_t^*(alpha)``, a lower bound of min J_t.
    w : ndarray
        ``w(alpha)``.

    Raises
    ------
    InputError
        If the dual is not finite at the start (the weights overflow, e.g.
        ``exp`` in the entropy for a tiny lam).
    """
    def evaluate(alpha):
        mu = -(alpha @ A) / lam
        with np.errstate(over="ignore", invalid="ignore"):
            w = regularizer.conjugate_gradient(mu)
            return float(b @ alpha) - lam * regularizer.conjugate(mu), b + A @ w, w, mu

    if alpha0 is None:
        x = np.zeros(len(b))
        x[np.argmax(b)] = 1.0
    else:
        x = to_simplex(np.asarray(alpha0, dtype=np.float64))
    f, g, w, mu = evaluate(x)
    if not (math.isfinite(f) and np.isfinite(g).all()):
        raise InputError(f"the {regularizer.name} subproblem overflows: its weights exceed the float "
                         "range (try a larger --lam or scaled features)")
    last_gap, gain = math.inf, math.inf
    for _ in range(max_iter):
        gap = lam * regularizer.value(w) + float(g.max()) - f
        # J_t^* is known to about eps times its two terms; steps below that are noise.
        noise = 64.0 * _EPS * (abs(float(b @ x)) + abs(f - float(b @ x)))
        if gap <= max(tol * abs(f), noise) or (gain <= noise and gap >= last_gap):
            break
        last_gap = gap
        h, c, u = regularizer.conjugate_hessian(mu)
        H = (A * h) @ A.T
        if u is not None:
            Au = A @ u
            H += c * np.outer(Au, Au)
        H /= lam
        target = solve_simplex_qp(H, g + H @ x, x0=x).x
        # Near the optimum the slope drowns in rounding; the full step is still taken.
        slope = max(float(g @ (target - x)), 0.0)
        eta = 1.0
        while True:
            # A convex combination of two points of the simplex stays on it.
            xn = (1.0 - eta) * x + eta * target
            fn, gn, wn, mun = evaluate(xn)
            if fn >= f + 1e-4 * eta * slope - noise:
                break
            eta *= 0.5
            if eta < 1e-10:
                return x, f, w  # no ascent left at this precision
        gain = fn - f
        x, f, g, w, mu = xn, fn, gn, wn, mun
    return x, f, w


def _scaled_norm(v, r):
    """Return ``(m, u, n)`` with ``m = max|v|``, ``u = |v| / m`` and ``n = ||u||_r`` (``||v||_r = m n``).

    Working on ``v / max|v|`` keeps large exponents r from overflowing or underflowing to 0/0.
    """
    top = float(np.abs(v).max(initial=0.0))
    u = np.abs(v) / top if top > 0.0 else np.zeros_like(v)
    return top, u, float(np.sum(u ** r)) ** (1.0 / r)


def _half_norm_gradient(v, r):
    """Return the gradient of ``||v||_r^2 / 2``: ``||v||_r^(2-r) sign(v) |v|^(r-1)``."""
    top, u, norm = _scaled_norm(v, r)
    return top * norm ** (2.0 - r) * np.sign(v) * u ** (r - 1.0) if top > 0.0 else u


class Lp(SmoothDual):
    """``Omega(w) = ||w||_p^2 / 2`` for ``1 < p <= 2``; ``Omega^*(mu) = ||mu||_q^2 / 2``, ``1/p + 1/q = 1``.

    Strongly convex with modulus p - 1 with respect to ``||.||_p``; p = 2 is
    ``l2``, p close to 1 approaches the (squared) L1 norm.
    """

    name = "lp"
    differentiable = True  # 1 < p: the gradient |w|_p^(2-p) sign(w) |w|^(p-1) is continuous
    params = {"p": 1.5}

    def check_params(self):
        self._require("p", math.isfinite(self.p) and 1.0 < self.p <= 2.0, "in (1, 2]")
        self.q = self.p / (self.p - 1.0)

    def value(self, w):
        top, _, norm = _scaled_norm(w, self.p)
        return 0.5 * (top * norm) ** 2

    def subgradient(self, w):
        return _half_norm_gradient(w, self.p)

    def conjugate(self, mu):
        top, _, norm = _scaled_norm(mu, self.q)
        return 0.5 * (top * norm) ** 2

    def conjugate_gradient(self, mu):
        return _half_norm_gradient(mu, self.q)

    def conjugate_hessian(self, mu):
        """``(q-1) ||mu||_q^(2-q) diag|mu|^(q-2) + (2-q) ||mu||_q^(2-2q) s s^T``, ``s = sign(mu) |mu|^(q-1)``.

        Both terms are invariant to the scale of mu, so they are formed from
        ``mu / max|mu|``; at mu = 0 (q > 2) the Hessian is 0.
        """
        q = self.q
        top, u, norm = _scaled_norm(mu, q)
        if top == 0.0:
            return np.full_like(mu, 1.0 if q == 2.0 else 0.0), 0.0, None
        s = np.sign(mu) * u ** (q - 1.0)
        return (q - 1.0) * norm ** (2.0 - q) * u ** (q - 2.0), (2.0 - q) * norm ** (2.0 - 2.0 * q), s


class Entropy(SmoothDual):
    """Unnormalized negative entropy ``Omega(w) = sum_i w_i log w_i`` on ``w >= 0`` (0 log 0 = 0).

    ``Omega^*(mu) = sum_i exp(mu_i - 1)``, ``w = exp(mu - 1)``. (Paper 000
    pairs ``sum exp(mu_i)`` with ``sum w_i log w_i``; that dual belongs to
    ``sum w_i (log w_i - 1)``, which differs by ``sum w_i``.) The start is
    ``argmin Omega = 1/e`` in every coordinate, interior, where Omega is
    differentiable. The weights grow like ``exp(|a| / lam)``: a small lam
    overflows (the solver then says so).
    """

    name = "entropy"

    def value(self, w):
        from scipy.special import xlogy  # here (and below): scipy.special costs the l2 runs ~0.05 s to import

        return math.inf if (w < 0).any() else float(xlogy(w, w).sum())

    def subgradient(self, w):
        """Return ``log w + 1``, the gradient (-inf where w_i = 0: no subgradient there)."""
        with np.errstate(divide="ignore"):
            return np.log(w) + 1.0

    def conjugate(self, mu):
        return float(np.exp(mu - 1.0).sum())

    def conjugate_gradient(self, mu):
        return np.exp(mu - 1.0)

    def conjugate_hessian(self, mu):
        return np.exp(mu - 1.0), 0.0, None


class NormalizedEntropy(SmoothDual):
    """Negative entropy on the probability simplex: ``Omega(w) = sum_i w_i log w_i``, ``w >= 0``, ``sum w = 1``.

    ``Omega^*(mu) = log sum_i exp(mu_i)`` (computed as a shifted logsumexp),
    ``w = softmax(mu)``; the start is the uniform ``1/d``. Omega is infinite
    off the simplex (``|sum w - 1| > 1e-8`` or a negative entry).
    """

    name = "normalized_entropy"

    def value(self, w):
        if (w < 0).any() or abs(float(w.sum()) - 1.0) > 1e-8:
            return math.inf
        from scipy.special import xlogy

        return float(xlogy(w, w).sum())

    def subgradient(self, w):
        """Return ``log w + 1`` (any shift by a multiple of ones is another subgradient)."""
        with np.errstate(divide="ignore"):
            return np.log(w) + 1.0

    def conjugate(self, mu):
        from scipy.special import logsumexp

        return float(logsumexp(mu))

    def conjugate_gradient(self, mu):
        from scipy.special import softmax

        return softmax(mu)

    def conjugate_hessian(self, mu):
        """``diag(p) - p p^T`` with ``p = softmax(mu)``."""
        from scipy.special import softmax

        p = softmax(mu)
        return p, -1.0, p


def _soft_threshold(mu, r):
    return np.sign(mu) * np.maximum(np.abs(mu) - r, 0.0)


class ElasticNet(SmoothDual):
    """``Omega(w) = r ||w||_1 + (1 - r) ||w||^2 / 2`` with ``r = l1_ratio`` in (0, 1).

    ``Omega^*(mu) = ||S_r(mu)||^2 / (2 (1 - r))`` with the soft threshold
    ``S_r(mu) = sign(mu) max(|mu| - r, 0)``, differentiable with
    ``w = S_r(mu) / (1 - r)``: exactly sparse w from a smooth dual.
    """

    name = "elastic_net"
    params = {"l1_ratio": 0.5}

    def check_params(self):
        self._require("l1_ratio", math.isfinite(self.l1_ratio) and 0.0 < self.l1_ratio < 1.0, "in (0, 1)")

    def value(self, w):
        r = self.l1_ratio
        return r * float(np.abs(w).sum()) + 0.5 * (1.0 - r) * float(np.dot(w, w))

    def subgradient(self, w):
        return self.l1_ratio * np.sign(w) + (1.0 - self.l1_ratio) * w

    def conjugate(self, mu):
        s = _soft_threshold(mu, self.l1_ratio)
        return float(np.dot(s, s)) / (2.0 * (1.0 - self.l1_ratio))

    def conjugate_gradient(self, mu):
        return _soft_threshold(mu, self.l1_ratio) / (1.0 - self.l1_ratio)

    def conjugate_hessian(self, mu):
        """``diag(|mu| > r) / (1 - r)``, the Hessian wherever no ``|mu_i| = r`` (a generalized one there)."""
        return (np.abs(mu) > self.l1_ratio) / (1.0 - self.l1_ratio), 0.0, None


REGULARIZERS = {cls.name: cls for cls in (L2, L1, Lp, Quadratic, Entropy, NormalizedEntropy, ElasticNet)}
"""Registry of regularizers by name: the values of ``--reg``."""


def get_regularizer(name, **params):
    """Return a new instance of the regularizer registered as `name`, with its parameters.

    Raises
    ------
    UsageError
        If no regularizer has that name (the message lists the known names)
        or a parameter is unknown, of the wrong type or out of range.
    """
    from ..plugins import check_plugin, lookup

    cls = lookup(REGULARIZERS, "regularizer", name)
    check_plugin("regularizer", name, cls, isinstance(cls, type) and issubclass(cls, Regularizer),
                 "a subclass of prbmrm.regularizers.Regularizer")
    return cls(**params)
