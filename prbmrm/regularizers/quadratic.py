"""Quadratic regularizers ``Omega(w) = 1/2 w^T M w`` (``l2``: M = I): the bundle subproblem is the simplex QP."""

import math
from functools import partial

import numpy as np

from ..errors import UsageError
from .qp import solve_simplex_pg, solve_simplex_qp, solve_two_plane_qp
from .base import Regularizer


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

    def initial_point(self, dim):
        """Return ``grad Omega^*(0) = B^-1 0``: +0.0 everywhere (``0 / b`` for b > 0), made by ``np.zeros``, whose
        pages cost no memory until written (d in the millions); a matrix B solves as the base class does."""
        return np.zeros(dim) if self._matrix is None else super().initial_point(dim)

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
        return self.primal(bundle.combine(qp.x), lam), qp.value, qp.x

    def solve_loosely(self, bundle, lam, alpha0, tol, floor=None, out=None):
        """Like :meth:`solve_subproblem`, to BMRM 2.1's loose tolerance `tol` (:func:`prbmrm.regularizers.qp.solve_simplex_pg`),
        with the implicit plane ``R_emp >= floor`` if a `floor` is given (the multipliers then sum to at most 1);
        w may be written into `out`, an array of length d that nothing else holds (``Bundle.combine``).

        Projected gradient is slow on ill-conditioned subproblems (least squares): after 100,000 steps (BMRM 2.1
        allows 300,000; a9a's subproblems at lam 1e-6 need up to 10,000) it gives up and returns None.
        """
        qp = solve_simplex_pg(bundle.gram_buffer, bundle.b, alpha0, tol, floor, max_iter=100000,
                              scale=1.0 / (lam * self._scale))
        if not qp.converged:
            return None
        return self.primal(bundle.combine(qp.x, out), lam), qp.value, qp.x

    def radius(self, excess, lam):
        """Return a bound on ``||w||_2`` over every w with ``lam Omega(w) <= excess``, for B = c I (else None).

        ``lam c ||w||^2 / 2 <= excess`` gives ``sqrt(2 excess / (lam c))``, rounded up (by far more than
        its few float64 roundings). With ``excess = J(v) - floor`` for any v and a floor of R_emp, it bounds
        the minimizer of J: ``lam Omega(w*) = J(w*) - R_emp(w*) <= J(v) - floor``.
        """
        if self.metric is not None:
            return None
        return math.sqrt(2.0 * max(excess, 0.0) / (lam * self._scale)) * (1.0 + 2.0 ** -30)

    def primal(self, combined, lam):
        """Return w of the dual multipliers alpha from ``combined = A^T alpha`` (``Bundle.combine``):
        ``B^-1 (-combined / lam)``, overwriting `combined` (bitwise ``-combined / lam`` first).

        Parameters
        ----------
        combined : ndarray of shape (d,)
        lam : float

        Returns
        -------
        ndarray of shape (d,)
            `combined` itself for B = I.
        """
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
