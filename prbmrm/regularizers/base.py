"""The regularizer interface: Omega, its subgradient, its Fenchel dual and the bundle subproblem it induces."""

import numpy as np

from ..params import Parametrized


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
