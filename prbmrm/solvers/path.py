"""Regularization paths: one solver run per lambda, from the largest to the smallest.

Each run starts from the previous run's best w. BMRM also starts from the
previous run's bundle: its planes ``R_emp(w) >= <a_i, w> + b_i`` bound the
empirical risk, whatever lambda, so they stay valid lower models of every
``J = lam * Omega + R_emp`` and the next run's first lower bound is already
informed by all earlier evaluations. Solvers whose function takes no
``bundle`` argument only warm-start.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.regularizers`, :mod:`prbmrm.solvers`,
:mod:`prbmrm.solvers.base`.
"""

import inspect
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, UsageError
from ..regularizers import get_regularizer
from . import get_solver
from .base import Progress


@dataclass
class PathProgress(Progress):
    """A :class:`Progress` row of a path run: also the lambda and its index on the path.

    Attributes
    ----------
    step : int
        The index of the lambda on the path (0: the largest).
    lam : float
    """

    step: int
    lam: float


@dataclass
class PathResult:
    """The outcome of :func:`minimize_path`.

    Attributes
    ----------
    lams : ndarray of shape (n,)
        The lambdas trained, decreasing.
    results : list of Result
        One per lambda, in the same order; the last is the smallest lambda's.
    """

    lams: np.ndarray
    results: list = field(default_factory=list)

    @property
    def last(self):
        """Result: the smallest lambda's."""
        return self.results[-1]


@dataclass
class LamPath:
    """A geometric grid of `n` lambdas from `largest` down to `smallest` (``--lam-path N``).

    Parameters
    ----------
    n : int
        Number of lambdas, >= 2.
    smallest : float
        The last lambda, > 0.
    largest : float or None
        The first lambda, > `smallest`. None: the smallest lambda at which
        ``w0 = argmin Omega`` is optimal, when there is one (``l1``,
        ``elastic_net``: ``||R_emp'(w0)||_inf`` over the weight of the L1
        term, found from one risk evaluation), else :attr:`DEFAULT_LARGEST`.
    """

    n: int
    smallest: float
    largest: float = None

    DEFAULT_LARGEST = 1.0

    def __post_init__(self):
        if self.n < 2:
            raise UsageError(f"--lam-path must be >= 2 lambdas, got {self.n}")
        if self.largest is not None and not (math.isfinite(self.largest) and self.largest > self.smallest):
            raise UsageError(f"--lam-max must be a number above --lam {self.smallest:g}, got {self.largest:g}")

    def values(self, risk, w0, regularizer):
        """Return the lambdas, decreasing; evaluates `risk` at `w0` once if :attr:`largest` is None."""
        largest = self.largest
        if largest is None:
            _, a = risk(w0)
            found = optimal_from(regularizer, w0, a)
            largest = self.DEFAULT_LARGEST if found is None else found
            if largest <= self.smallest:
                raise InputError(
                    f"--lam {self.smallest:g} is not below the default --lam-max {largest:g}: give --lam-max"
                    if found is None else
                    f"w = argmin Omega is optimal for every lam >= {largest:.6g}, so also at --lam "
                    f"{self.smallest:g}: give a smaller --lam for the path")
        return np.geomspace(largest, self.smallest, self.n)


def optimal_from(regularizer, w0, a):
    """The smallest lam at which `w0` = argmin Omega minimizes ``lam * Omega + R_emp``, or None.

    With `a` a subgradient of R_emp at `w0`, `w0` is optimal as soon as
    ``-a / lam`` lies in ``dOmega(w0)``, i.e. ``grad Omega^*(-a / lam) = w0``.
    That set is convex and holds 0, so the condition holds for every lam
    above a threshold, which bisection finds (to 1e-12 relative, rounded up
    so that the returned lam satisfies it). None when no finite lam does
    (``Omega`` differentiable at `w0`, as L2, unless ``a = 0``) or every
    lam does (``a = 0``).
    """
    def optimal(lam):
        return np.array_equal(regularizer.conjugate_gradient(-a / lam), w0)

    if not np.any(a) or not optimal(1e300):
        return None
    high = 1.0
    while not optimal(high):
        high *= 2.0
    low = high / 2.0
    while optimal(low):
        if low < 1e-300:
            return None
        high, low = low, low / 2.0
    while high - low > 1e-12 * high:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if optimal(middle) else (middle, high)
    return high


def minimize_path(risk, w0, lams, method="bmrm", reg="l2", callback=None, **options):
    """Minimize ``lam * Omega(w) + R_emp(w)`` for each lam of a path, from the largest down.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), subgradient)``.
    w0 : ndarray
        Starting point of the first (largest) lambda; each later one starts
        from the previous best w.
    lams : sequence of float or LamPath
        The lambdas, in any order (they are trained decreasing, duplicates
        refused).
    method : str
        A key of :data:`prbmrm.solvers.SOLVERS`; if the solver takes a
        ``bundle`` (BMRM), each run continues from the previous run's planes
        and multipliers.
    reg : str or prbmrm.regularizers.Regularizer
    callback : callable, optional
        Called with a :class:`PathProgress` after every iteration; raising
        StopIteration stops the run and the path.
    **options
        Passed to every run (``epsilon``, ``rel_epsilon``, ``max_iter``, ...).

    Returns
    -------
    PathResult
    """
    regularizer = get_regularizer(reg) if isinstance(reg, str) else reg
    if isinstance(lams, LamPath):
        lams = lams.values(risk, w0, regularizer)
    lams = np.sort(np.asarray(lams, dtype=np.float64))[::-1]
    if len(np.unique(lams)) != len(lams):
        raise UsageError("the lambdas of a path must differ")
    solver = get_solver(method)
    keeps_bundle = "bundle" in inspect.signature(solver).parameters
    path, state, w = PathResult(lams), {}, w0
    for step, lam in enumerate(lams):
        report = None if callback is None else _reporter(callback, step, float(lam))
        result = solver(risk, w, lam, regularizer, callback=report, **options, **state)
        path.results.append(result)
        w = result.w
        if keeps_bundle:
            state = {"bundle": result.bundle, "alpha": result.alpha}
        if result.status == 3:
            path.lams = lams[:step + 1]
            break
    return path


def _reporter(callback, step, lam):
    return lambda row: callback(PathProgress(**vars(row), step=step, lam=lam))
