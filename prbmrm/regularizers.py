"""Regularizers Omega and the bundle subproblem each one induces on rank 0.

BMRM's step (paper 000, eq. 7) is ``argmin_w lam * Omega(w) + max_i <a_i, w> + b_i``,
solved through its dual (Theorem 2, eq. 10) over the simplex of bundle size t.
Found by name in :data:`REGULARIZERS`.
"""

import numpy as np

from .errors import UsageError
from .qp import solve_simplex_qp, solve_two_plane_qp


class L2:
    """Omega(w) = ||w||^2 / 2, whose bundle subproblem is the QP of Corollary 3.

    The dual ``max_alpha b^T alpha - alpha^T A A^T alpha / (2 lam)`` over the
    simplex needs only the Gram matrix of the planes, which the bundle keeps
    up to date; ``w = -A^T alpha / lam`` by the dual connection.
    """

    name = "l2"

    def value(self, w):
        """Return Omega(w)."""
        return 0.5 * float(np.dot(w, w))

    def subgradient(self, w):
        """Return a subgradient of Omega at w: its gradient, w itself."""
        return w

    def solve_subproblem(self, bundle, lam, alpha0=None):
        """Minimize ``lam * Omega(w) + max_i <a_i, w> + b_i`` over the bundle's planes.

        Parameters
        ----------
        bundle : prbmrm.solvers.Bundle
        lam : float
        alpha0 : ndarray or None
            Warm start: the previous multipliers, padded for new planes.

        Returns
        -------
        w : ndarray
            The minimizer w_t.
        lower_bound : float
            The dual value J_t^*(alpha) at the returned multipliers. It equals
            min J_t at the QP optimum and, being a dual value at a feasible
            alpha, is a certified lower bound of min J even if the QP stops early.
        alpha : ndarray
            The multipliers, on the simplex.
        """
        if bundle.size == 2:  # paper 000, Alg. 4 (eq. 14): a closed form, no QP
            qp = solve_two_plane_qp(bundle.gram / lam, bundle.b)
        else:
            qp = solve_simplex_qp(bundle.gram / lam, bundle.b, x0=alpha0)
        w = -(qp.x @ bundle.A) / lam
        return w, qp.value, qp.x


REGULARIZERS = {cls.name: cls for cls in (L2,)}
"""Registry of regularizers by name: the values of ``--reg``."""


def get_regularizer(name):
    """Return a new instance of the regularizer registered as `name`."""
    try:
        return REGULARIZERS[name]()
    except KeyError:
        raise UsageError(f"unknown regularizer {name!r}; known: {', '.join(sorted(REGULARIZERS))}") from None
