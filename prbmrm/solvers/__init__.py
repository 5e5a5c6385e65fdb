"""Solvers: every one drives one risk oracle ``risk(w) -> (R_emp, a)`` and returns a Result.

Dispatch by name, as scipy.optimize.minimize does::

    result = minimize(risk, w0, lam, method="bmrm", reg="l2", rel_epsilon=1e-3)
"""

from ..errors import UsageError
from ..regularizers import get_regularizer
from ._base import HISTORY_COLUMNS, Bundle, Progress, Result
from .bmrm import minimize_bmrm
from .proximal import minimize_proximal

SOLVERS = {"bmrm": minimize_bmrm, "proximal": minimize_proximal}
"""Registry of solvers by name: the values of ``--solver``."""


def minimize(risk, w0, lam, method="bmrm", reg="l2", **options):
    """Minimize ``lam * Omega(w) + R_emp(w)`` with the solver named `method`.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), subgradient)``, e.g. a
        :class:`prbmrm.risk.DistributedRisk` on rank 0.
    w0 : ndarray
        Starting point.
    lam : float
        Regularization constant, > 0.
    method : str
        A key of :data:`SOLVERS`.
    reg : str or prbmrm.regularizers.Regularizer
        A key of :data:`prbmrm.regularizers.REGULARIZERS` (with default
        parameters), or a regularizer object.
    **options
        Passed to the solver (``epsilon``, ``rel_epsilon``, ``max_iter``,
        ``idle_age``, ``bundle_size``, ``callback``, ...).

    Returns
    -------
    Result
    """
    try:
        solver = SOLVERS[method]
    except KeyError:
        raise UsageError(f"unknown solver {method!r}; known solvers: {', '.join(sorted(SOLVERS))}") from None
    regularizer = get_regularizer(reg) if isinstance(reg, str) else reg
    return solver(risk, w0, lam, regularizer, **options)


__all__ = ["HISTORY_COLUMNS", "SOLVERS", "Bundle", "Progress", "Result", "minimize"]
