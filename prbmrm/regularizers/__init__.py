"""Regularizers Omega, their Fenchel duals, and the bundle subproblem each one induces on rank 0.

BMRM's step (paper 000, eq. 7) is ``argmin_w lam * Omega(w) + max_i <a_i, w> + b_i``.
Theorem 2 gives its dual over the simplex of the bundle's t planes (eq. 10)::

    maximize  J_t^*(alpha) = b^T alpha - lam * Omega^*(-A^T alpha / lam),   alpha >= 0, sum(alpha) = 1

with ``w = grad Omega^*(-A^T alpha / lam)``. Any feasible alpha gives a lower
bound of min J_t, hence of min J: the solvers report it as the certified lower
bound, so an inner solver that stops early costs progress, never correctness.
Three inner solvers cover the regularizers: the simplex QP of
:mod:`prbmrm.regularizers.qp` for the quadratic ones (``l2``, ``quadratic``), the linear
program of paper 000's App. C for ``l1`` (HiGHS, warm-started), and an
accelerated projected gradient method on the smooth dual for the others.
Found by name in :data:`REGULARIZERS`; one module per family: :mod:`~prbmrm.regularizers.base`
(the interface), :mod:`~prbmrm.regularizers.quadratic`, :mod:`~prbmrm.regularizers.l1`,
:mod:`~prbmrm.regularizers.smooth`.

Imports: highspy, numpy, scipy; of prbmrm: :mod:`prbmrm.params`, :mod:`prbmrm.errors`,
:mod:`prbmrm.plugins`, :mod:`prbmrm.regularizers.qp`.
"""

from .base import Regularizer
from .l1 import L1
from .quadratic import L2, Quadratic
from .smooth import ElasticNet, Entropy, Lp, NormalizedEntropy, SmoothDual, maximize_smooth_dual

__all__ = ["REGULARIZERS", "get_regularizer", "Regularizer", "Quadratic", "L2", "L1", "SmoothDual", "Lp", "Entropy",
           "NormalizedEntropy", "ElasticNet", "maximize_smooth_dual"]



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
