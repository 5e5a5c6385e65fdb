"""The L1 regularizer: the bundle subproblem as a linear program (paper 000, App. C), solved by HiGHS."""

import math
import zlib

import numpy as np

from ..errors import InputError
from .base import Regularizer


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
