"""Solvers: every one drives one risk oracle ``risk(w) -> (R_emp, a)`` and returns a Result.

Dispatch by name, as scipy.optimize.minimize does::

    result = minimize(risk, w0, lam, method="bmrm", reg="l2", rel_epsilon=1e-3)

Solvers that work in the dual (``pragam``, ``pragam_b``) or with Hessian products (``tron``) need the examples, not only
``risk(w)``: they take the :class:`prbmrm.distributed.oracle.DistributedRisk` itself as `risk` and run
their per-rank steps through its :meth:`~prbmrm.distributed.oracle.DistributedRisk.attach` service.

Imports: of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.plugins`, :mod:`prbmrm.regularizers`,
:mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.bundle`; the modules of the solvers (bmrm, lbfgs,
lsbmrm, pragam, proximal, smooth_lbfgs, sublbfgs, tron, dcd, auto) by name, when :data:`SOLVERS` first looks one up.
"""

import inspect
import numbers
from collections.abc import Mapping
from importlib import import_module

from ..errors import UsageError
from ..plugins import check_plugin, lookup
from ..regularizers import get_regularizer
from .base import HISTORY_COLUMNS, MAX_ITER_STATUS, CuttingPlaneBound, Progress, Result
from .bundle import Bundle


class _Registry(Mapping):
    """Solver functions by name, each module imported when its solver is first looked up.

    A run imports only the solver it uses: those based on L-BFGS import
    scipy.optimize (~0.2 s of a run's start-up), pragam the dual.
    """

    def __init__(self, places):
        self._places = places  # name -> (module of prbmrm.solvers, function)

    def __getitem__(self, name):
        module, function = self._places[name]
        return getattr(import_module(f"{__name__}.{module}"), function)

    def __iter__(self):
        return iter(self._places)

    def __len__(self):
        return len(self._places)


SOLVERS = _Registry({"bmrm": ("bmrm", "minimize_bmrm"), "lsbmrm": ("lsbmrm", "minimize_lsbmrm"),
                     "proximal": ("proximal", "minimize_proximal"), "lbfgs": ("lbfgs", "minimize_lbfgs"),
                     "smooth_lbfgs": ("smooth_lbfgs", "minimize_smooth_lbfgs"),
                     "pragam": ("pragam", "minimize_pragam"), "pragam_b": ("pragam", "minimize_pragam_b"),
                     "sublbfgs": ("sublbfgs", "minimize_sublbfgs"), "owlqn": ("sublbfgs", "minimize_owlqn"),
                     "owlqn_star": ("sublbfgs", "minimize_owlqn_star"), "tron": ("tron", "minimize_tron"),
                     "dcd": ("dcd", "minimize_dcd"), "auto": ("auto", "minimize_auto")})
"""Registry of solvers by name: the values of ``--solver`` (a read-only mapping to the solver functions)."""

COMMON_OPTIONS = ("epsilon", "rel_epsilon", "max_iter", "idle_age", "callback")
"""Options every solver takes; the others are its own (``--solver-param NAME=VALUE``)."""


def get_solver(method):
    """Return the solver function named `method`: a key of :data:`SOLVERS` or a ``prbmrm.solvers`` plug-in.

    Raises
    ------
    UsageError
        For an unknown name (the message lists the known ones) or a broken plug-in.
    """
    solver = lookup(SOLVERS, "solver", method)
    check_plugin("solver", method, solver, callable(solver), "a function")
    return solver


def default_solver(lam, reg="l2", reuse_planes=False, party=False):
    """Return the solver a run gets when it names none: ``"auto"``, ``"proximal"`` or ``"bmrm"``.

    The rule (the same for ``prbmrm.cli.train``, :func:`prbmrm.fit` and the
    estimators): for one lam with a quadratic regularizer (``l2``,
    ``quadratic``), ``auto`` (:func:`prbmrm.solvers.auto.minimize_auto`),
    which picks TRON, the proximal bundle method or BMRM from the loss and
    the data's measured properties and hands over to BMRM if its pick stalls;
    BMRM where planes carry over from other lambdas (a lambda path, a warm
    start: BMRM's planes of R_emp hold for every lam) and for the other
    regularizers. In party mode, where every sum must be a secure aggregation
    of the risk (which TRON's Hessian products are not), ``proximal`` in
    place of ``auto``.

    Parameters
    ----------
    lam : float or sequence of float
        One lam, or the lambdas of a path.
    reg : str or prbmrm.regularizers.Regularizer
        The regularizer or its name.
    reuse_planes : bool
        Whether the run starts from another run's planes.
    party : bool
        Whether the run is in party mode.

    Returns
    -------
    str
        A key of :data:`SOLVERS`.
    """
    quadratic = getattr(get_regularizer(reg) if isinstance(reg, str) else reg, "quadratic", False)
    if not quadratic or not isinstance(lam, numbers.Real) or reuse_planes:
        return "bmrm"
    return "proximal" if party else "auto"


def solver_options(method, params):
    """Convert a solver's own parameters (``--solver-param`` strings) to the types of their defaults.

    Parameters
    ----------
    method : str
        A key of :data:`SOLVERS`.
    params : dict of str to str or number

    Returns
    -------
    dict

    Raises
    ------
    UsageError
        For an unknown solver, a parameter the solver does not have (the
        message lists the ones it has) or a value of the wrong type.
    """
    parameters = inspect.signature(get_solver(method)).parameters.items()
    own = {name: parameter.default for name, parameter in parameters
           if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in COMMON_OPTIONS}
    options = {}
    for name, value in params.items():
        if name not in own:
            raise UsageError(f"solver {method!r} has no parameter {name!r} "
                             f"(its parameters: {', '.join(own) or 'none'})")
        kind = type(own[name])
        try:
            options[name] = kind(value)
        except ValueError:
            raise UsageError(f"solver parameter {name}={value!r}: expected "
                             f"{'an integer' if kind is int else 'a number'}") from None
    return options


def minimize(risk, w0, lam, method="bmrm", reg="l2", **options):
    """Minimize ``lam * Omega(w) + R_emp(w)`` with the solver named `method`.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), subgradient)``, e.g. a
        :class:`prbmrm.distributed.oracle.DistributedRisk` on rank 0 (``pragam`` and
        ``pragam_b`` need the latter: they use its data).
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
        ``idle_age``, ``callback``, and its own such as ``bundle_size`` or ``theta``, see
        :func:`solver_options`).

    Returns
    -------
    Result
    """
    regularizer = get_regularizer(reg) if isinstance(reg, str) else reg
    return get_solver(method)(risk, w0, lam, regularizer, **options)


__all__ = ["COMMON_OPTIONS", "HISTORY_COLUMNS", "MAX_ITER_STATUS", "SOLVERS", "Bundle", "CuttingPlaneBound", "Progress",
           "Result", "default_solver", "get_solver", "minimize", "solver_options"]
