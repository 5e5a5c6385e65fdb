"""Solvers: every one drives one risk oracle ``risk(w) -> (R_emp, a)`` and returns a Result.

Dispatch by name, as scipy.optimize.minimize does::

    result = minimize(risk, w0, lam, method="bmrm", reg="l2", rel_epsilon=1e-3)

Solvers that work in the dual (``pragam``, ``pragam_b``) need the examples, not only
``risk(w)``: they take the :class:`prbmrm.risk.DistributedRisk` itself as `risk` and run
their per-rank steps through its :meth:`~prbmrm.risk.DistributedRisk.attach` service.
"""

from ..errors import UsageError
from ..regularizers import get_regularizer
from ._base import HISTORY_COLUMNS, Bundle, Progress, Result
from .bmrm import minimize_bmrm
from .pragam import minimize_pragam, minimize_pragam_b

SOLVERS = {"bmrm": minimize_bmrm, "pragam": minimize_pragam, "pragam_b": minimize_pragam_b}
"""Registry of solvers by name: the values of ``--solver``."""


def minimize(risk, w0, lam, method="bmrm", reg="l2", **options):
    """Minimize ``lam * Omega(w) + R_emp(w)`` with the solver named `method`.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), subgradient)``, e.g. a
        :class:`prbmrm.risk.DistributedRisk` on rank 0 (``pragam`` and
        ``pragam_b`` need the latter: they use its data).
    w0 : ndarray
        Starting point.
    lam : float
        Regularization constant, > 0.
    method : str
        A key of :data:`SOLVERS`.
    reg : str
        A key of :data:`prbmrm.regularizers.REGULARIZERS`.
    **options
        Passed to the solver (``epsilon``, ``rel_epsilon``, ``max_iter``,
        ``idle_age``, ``callback``, ...).

    Returns
    -------
    Result
    """
    try:
        solver = SOLVERS[method]
    except KeyError:
        raise UsageError(f"unknown solver {method!r}; known solvers: {', '.join(sorted(SOLVERS))}") from None
    return solver(risk, w0, lam, get_regularizer(reg), **options)


__all__ = ["HISTORY_COLUMNS", "SOLVERS", "Bundle", "Progress", "Result", "minimize"]
