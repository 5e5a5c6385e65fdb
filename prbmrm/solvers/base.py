"""What every solver shares: the cutting-plane model over a :class:`~prbmrm.solvers.bundle.Bundle`, the progress record and the result type.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.solvers.bundle`.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .bundle import Bundle

HISTORY_COLUMNS = ("iteration", "objective", "best_objective", "lower_bound", "gap", "planes",
                   "seconds_risk", "seconds_subproblem", "seconds_comm", "seconds_total")
"""The progress-table columns, also the datasets of a model file's ``/history``."""


class CuttingPlaneModel:
    """BMRM's model ``J_t(w) = lam * Omega(w) + max_i <a_i, w> + b_i``: its planes and their multipliers.

    What every BMRM variant does with a risk evaluation: add its plane,
    minimize J_t through the regularizer's dual subproblem warm-started from
    the previous multipliers, and drop planes that stayed idle. Given a
    tolerance ``gap`` > 0, :meth:`minimize` solves the subproblem only that
    loosely where the regularizer offers ``solve_loosely`` (the quadratic
    ones, :func:`prbmrm.regularizers.qp.solve_simplex_pg`) and the bundle has not yet
    aggregated (within its `bundle_size` or `bundle_memory`);
    then a :attr:`floor` (a lower bound of R_emp, None: none known) is an
    implicit plane ``R_emp >= floor`` with the multiplier ``1 - sum(alpha)``.
    A subproblem projected gradient cannot solve (``solve_loosely`` returns
    None) turns :attr:`loose` off: exact QPs for the rest of the run.

    Parameters
    ----------
    dim : int
        Length of w.
    lam : float
    regularizer : object
        Provides ``solve_subproblem(bundle, lam, alpha0)`` and optionally ``metric``.
    idle_age : int
        Drop planes whose multiplier stayed zero this many consecutive
        iterations; 0 keeps every plane.
    bundle_size : int
        Keep at most this many planes (>= 2), aggregating the oldest
        (:meth:`Bundle.make_room`); 0: no limit.
    bundle_memory : int
        Keep the planes within this many bytes (``Bundle(max_bytes=...)``); 0: no limit.
    """

    def __init__(self, dim, lam, regularizer, idle_age, bundle_size=0, bundle_memory=0):
        self.bundle = Bundle(dim, getattr(regularizer, "metric", None), bundle_size or None,
                             max_bytes=bundle_memory or None)
        self.lam = lam
        self.regularizer = regularizer
        self.idle_age = idle_age
        self.alpha = np.zeros(0)
        self.floor = None
        self.loose = True

    def minimize(self, w, r, a, gap=0.0, out=None, rounding=None):
        """Add the plane ``(a, r - <a, w>)`` of R_emp at `w`; return ``(w_t, lower_bound, seconds)``.

        ``w_t`` minimizes J_t and ``lower_bound``, the dual value, is a
        certified lower bound of min J. With a `gap` > 0 the subproblem may be
        solved only to that tolerance: ``w_t`` is then the primal map of the
        multipliers returned and ``lower_bound`` their dual value, still a
        lower bound of min J (weak duality: they are feasible). ``w_t`` may be
        written into `out`, an array of length d that nothing else holds, or `w`
        itself (the plane is formed before ``w_t`` is written). For `rounding`, see :meth:`add_plane`.
        """
        started = time.perf_counter()
        self.add_plane(w, r, a, rounding)
        alpha0 = np.append(self.alpha, 0.0)
        solved = None
        if gap > 0.0 and self.loose and hasattr(self.regularizer, "solve_loosely"):
            solved = self.regularizer.solve_loosely(self.bundle, self.lam, alpha0, gap, self.floor, out)
            # An ill-conditioned subproblem defeats projected gradient: exact QPs from now on.
            self.loose = solved is not None
        if solved is None:
            solved = self.regularizer.solve_subproblem(self.bundle, self.lam, alpha0)
        w_t, lower_bound, self.alpha = solved
        return w_t, lower_bound, time.perf_counter() - started

    def add_plane(self, w, r, a, rounding=None):
        """Add the plane ``(a, r - <a, w>)`` of R_emp at `w`, aggregating first if the bundle is full.

        The first step of :meth:`minimize`; alone, what a copy of the planes on another rank does
        (:class:`prbmrm.solvers.mirror.PlaneMirror`). With `rounding`, ``(error_r, weighted, norm, radius)``
        (:func:`rounding_margin`'s bounds on the errors of r and a, and on the norm of the minimizer), the offset is lowered by
        :func:`rounding_margin` and the bundle's :attr:`~prbmrm.solvers.bundle.Bundle.radius` and
        :attr:`~prbmrm.solvers.bundle.Bundle.slack` say where its planes hold.
        """
        margin = 0.0
        if rounding is not None:
            error_r, weighted, norm, radius = rounding
            margin = rounding_margin(error_r, weighted, norm, radius)
            self.bundle.radius = min(self.bundle.radius, radius)
            self.bundle.slack = max(self.bundle.slack, norm)
        if self.bundle.room() is not None:
            # Aggregates keep the bound whatever the multipliers, but the method's convergence
            # (paper 000, Sec. 3.1) aggregates optimal ones: exact QPs from the first aggregation on.
            self.loose = False
        self.alpha = self.bundle.make_room(self.alpha)
        self.bundle.add(a, r - float(np.dot(a, w)) - margin)

    def prune(self):
        """Drop the idle planes (their multipliers are zero: J_t's minimum is unchanged)."""
        if self.idle_age > 0:
            self.bundle.update_idle(self.alpha)
            self.alpha = self.bundle.prune(self.idle_age, self.alpha)

    def state(self):
        """Return the planes and multipliers as a dict (for a checkpoint)."""
        return {"bundle": self.bundle.state(), "alpha": self.alpha.copy(), "loose": int(self.loose)}

    def restore(self, state):
        """Continue from :meth:`state`: the next :meth:`minimize` is warm-started as the saved one was."""
        self.bundle.restore(state["bundle"])
        self.alpha = np.asarray(state["alpha"], dtype=np.float64)
        self.loose = bool(state.get("loose", 1))


def rounding_margin(error_r, weighted, norm, radius):
    """How far to lower the offset of a plane of R_emp formed from a rounded risk and subgradient, so that it
    stays below R_emp at every point within `radius` of the origin.

    With ``|r - R| <= error_r`` and ``|a_j - g_j| <= e_j`` for the exact risk R and subgradient g at
    `w`, the plane ``r + <a, v - w>`` exceeds the exact one by ``(r - R) + <a - g, v - w>``, at most
    ``error_r + sum_j e_j |w_j| + ||e||_2 ||v||_2``: this, for ``||v||_2 <= radius``, rounded
    up by 0.01% (more than the float64 roundings of sums of d terms, at most d 2^-53 relative).

    Parameters
    ----------
    error_r : float
    weighted : float
        ``sum_j e_j |w_j|``.
    norm : float
        ``||e||_2``.
    radius : float

    Returns
    -------
    float
    """
    return (error_r + weighted + norm * radius) * 1.0001


def snapshot(recorder, model, **values):
    """A checkpoint's state: the history, the planes of `model` (its ``state()``) and the solver's `values`.

    `model` is a :class:`CuttingPlaneModel` (BMRM variants) or a
    :class:`CuttingPlaneBound` (solvers that only bound the gap with planes).
    Arrays among `values` are copied: a solver may write into its iterates' storage later.
    """
    values = {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in values.items()}
    return dict(recorder.state(), **model.state(), **values)


MAX_ITER_STATUS = 2
"""A Result's status when the run stopped at its iteration limit before its gap test held."""

_MESSAGES = {0: "gap <= epsilon", 1: "gap <= rel_epsilon * objective",
             2: "maximum number of iterations reached", 3: "stopped by the callback",
             4: "no further progress (the line search failed)", 5: "interrupted by a signal"}


class Recorder:
    """The bookkeeping every solver shares: history, stopping tests, callback and result.

    Parameters
    ----------
    epsilon : float
        Stop when the gap is at most this (0 disables).
    rel_epsilon : float
        Stop when the gap is at most this times the best objective (0 disables).
    callback : callable, optional
        Called with each :class:`Progress`; raising StopIteration stops the solver.
    """

    def __init__(self, epsilon=0.0, rel_epsilon=1e-3, callback=None):
        self.epsilon = epsilon
        self.rel_epsilon = rel_epsilon
        self.callback = callback
        self.history = {name: [] for name in HISTORY_COLUMNS}
        self.started = time.perf_counter()
        self.status = 2

    def _test_gap(self, gap, best_objective):
        if gap <= self.epsilon:
            self.status = 0
        elif gap <= self.rel_epsilon * abs(best_objective):
            self.status = 1

    def record(self, row):
        """Append one :class:`Progress` row and return True if the solver must stop."""
        for name in HISTORY_COLUMNS:
            self.history[name].append(getattr(row, name))
        self._test_gap(row.gap, row.best_objective)
        if self.callback is not None:
            try:
                self.callback(row)
            except StopIteration:
                self.status = 3 if self.status == 2 else self.status
        return self.status != 2

    def interrupt(self):
        """Mark the run as stopped by a signal (status 5)."""
        self.status = 5

    def offer(self, checkpoint, iteration, state):
        """Offer ``checkpoint(iteration, state)`` the run after `iteration`; return True if it says stop.

        `checkpoint` may be None (no checkpoints); `state` makes the
        checkpoint's dict only when one is written. A stop marks the run
        interrupted (status 5).
        """
        if checkpoint is None or not checkpoint(iteration, state):
            return False
        self.interrupt()
        return True

    def state(self):
        """Return the history so far as a dict of arrays (for a checkpoint)."""
        return {"history": {name: np.asarray(values) for name, values in self.history.items()}}

    def restore(self, state):
        """Continue the history of :meth:`state`; elapsed seconds continue from its last row."""
        self.history = {name: list(np.atleast_1d(state["history"][name])) for name in HISTORY_COLUMNS}
        if self.history["seconds_total"]:
            self.started -= self.history["seconds_total"][-1]

    def raise_lower_bound(self, lower_bound):
        """Give the last row a better `lower_bound`, computed later for the same iterates, and
        re-test the gap (a solver that computes its bound only every few iterations
        calls this when it ends)."""
        if lower_bound > self.history["lower_bound"][-1]:
            gap = self.history["best_objective"][-1] - lower_bound
            self.history["lower_bound"][-1] = lower_bound
            self.history["gap"][-1] = gap
            if self.status in (2, 4):
                self._test_gap(gap, self.history["best_objective"][-1])

    def result(self, w, fun, w_last):
        """Return the :class:`Result` with the best iterate `w`, its objective `fun` and `w_last`."""
        history = {k: np.asarray(v) for k, v in self.history.items()}
        return Result(w=w, fun=fun, lower_bound=history["lower_bound"][-1], gap=history["gap"][-1],
                      nit=len(history["iteration"]), status=self.status,
                      message=_MESSAGES[self.status], w_last=w_last, history=history)


def check_finite(r, a, t):
    """Raise InputError unless the risk `r` and ``|a|^2`` of iteration `t` are finite."""
    # |a|^2 enters the Gram matrix: it must be finite too, not only a.
    with np.errstate(over="ignore"):
        norm2 = np.dot(a, a)
    if not (np.isfinite(r) and np.isfinite(norm2)):
        raise InputError(f"the empirical risk or its subgradient is not finite at iteration {t} "
                         "(overflow in the loss? try a larger --lam or scaled features)")


@dataclass
class Result:
    """The outcome of a solver, in the manner of scipy's ``OptimizeResult``.

    Attributes
    ----------
    w : ndarray
        The best iterate: argmin of J over the evaluated iterates.
    fun : float
        J(w), the best objective.
    lower_bound : float
        A certified lower bound of min J.
    gap : float
        ``fun - lower_bound``, the paper's epsilon_t.
    nit : int
        Iterations, i.e. risk evaluations.
    status : int
        0: gap <= epsilon; 1: gap <= rel_epsilon * fun; 2: max_iter reached;
        3: stopped by the callback; 4: no further progress (L-BFGS's line search failed);
        5: interrupted by a signal (see :mod:`prbmrm.checkpoint`).
    message : str
    w_last : ndarray
        The last iterate (BMRM: the minimizer of the last model J_t).
    history : dict of str to ndarray
        One array per column of :data:`HISTORY_COLUMNS`.
    bundle : Bundle or None
        The final planes of ``R_emp``, for solvers that keep a bundle (BMRM):
        ``minimize_bmrm(..., bundle=result.bundle, alpha=result.alpha)`` goes
        on from them.
    alpha : ndarray or None
        The multipliers of `bundle`'s planes.
    dual : ndarray or None
        Dual coordinate descent's point: each example's ``alpha_i`` in
        ``[0, 1 / (lam n)]``, in canonical order;
        ``minimize_dcd(..., dual=result.dual)`` starts from it at any lam,
        clipped to that lam's box.
    solver : str or None
        The key of ``prbmrm.solvers.SOLVERS`` that ran, set by
        :func:`prbmrm.training.fit` (which may pick it by the data's dimension).
    """

    w: np.ndarray
    fun: float
    lower_bound: float
    gap: float
    nit: int
    status: int
    message: str
    w_last: np.ndarray
    history: dict = field(default_factory=dict)
    bundle: object = None
    alpha: np.ndarray = None
    dual: np.ndarray = None
    solver: str = None

    @property
    def success(self):
        """bool: True if the solver stopped on its gap criterion."""
        return self.status in (0, 1)


@dataclass
class Progress:
    """One row of the progress table, handed to ``callback`` after every iteration."""

    iteration: int
    objective: float
    best_objective: float
    lower_bound: float
    gap: float
    planes: int
    seconds_risk: float
    seconds_subproblem: float
    seconds_comm: float
    seconds_total: float


class CuttingPlaneBound:
    """A certified lower bound of min J from every point a solver evaluates.

    Each evaluation ``(w, R_emp(w), a)`` gives the plane ``R_emp >= <a, .> + b``
    with ``b = R_emp(w) - <a, w>``; the dual value of the BMRM subproblem over
    the planes kept (``regularizer.solve_subproblem``, warm-started) is a
    lower bound of min J for any set of planes below R_emp, whatever solver
    produced them. With ``Omega = ||w||^2 / 2`` the one-plane bound
    ``b - ||a||^2 / (2 lam)``, which equals paper 002's eq. 15
    ``J_-(w) = J(w) - ||a + lam w||^2 / (2 lam)``, is also taken at every
    plane: Lemma 5's proof needs only the subgradient inequality, so it holds
    for any subgradient, and it is tight near the optimum where J is
    differentiable (there the gradient vanishes), which is why L-BFGS on a
    smooth loss gets a small certified gap without solving the QP.

    Planes of any function below R_emp (a smoothed risk ``R_mu <= R_emp``)
    are planes below R_emp too.

    Parameters
    ----------
    dim : int
        Length of w.
    regularizer : object
        Provides ``solve_subproblem(bundle, lam, alpha0)``.
    lam : float
    max_planes : int
        Keep at most this many planes (0: no limit, >= 2 otherwise). A plane
        arriving at a full bundle first makes the QP be solved; the planes
        whose multiplier is 0 are dropped, and if every plane is active they
        are replaced by their aggregate ``sum_i alpha_i (a_i, b_i)`` (paper
        000, Sec. 3.1), which keeps the dual value.
    idle_age : int
        After each solve drop the planes whose multiplier has been 0 at this
        many consecutive solves, as BMRM does (0: never).

    Attributes
    ----------
    value : float
        The best lower bound found so far (-inf before any plane).
    bundle : Bundle
    seconds : float
        Seconds spent in the QP so far.
    """

    def __init__(self, dim, regularizer, lam, *, max_planes=0, idle_age=10):
        if max_planes == 1 or max_planes < 0:
            raise ValueError(f"max_planes must be 0 (no limit) or >= 2, got {max_planes}")
        self.regularizer = regularizer
        self.lam = lam
        self.max_planes = max_planes
        self.idle_age = idle_age
        self._metric = getattr(regularizer, "metric", None)
        self.bundle = Bundle(dim, self._metric)
        self._alpha = np.zeros(0)
        self._stale = False
        self._one_plane = getattr(regularizer, "name", None) == "l2"
        self.value = -np.inf
        self.seconds = 0.0

    @property
    def stale(self):
        """bool: planes were added since the QP was last solved."""
        return self._stale

    def state(self):
        """Return the planes, multipliers and best bound as a dict (for a checkpoint)."""
        return {"bundle": self.bundle.state(), "alpha": self._alpha.copy(), "stale": self._stale,
                "value": self.value, "seconds": self.seconds}

    def restore(self, state):
        """Continue from :meth:`state`: the next QP is warm-started as the saved one would have been."""
        self.bundle.restore(state["bundle"])
        self._alpha = np.asarray(state["alpha"], dtype=np.float64)
        self._stale, self.value, self.seconds = bool(state["stale"]), state["value"], state["seconds"]

    def add(self, w, risk, a):
        """Add the plane of the evaluation ``(w, R_emp(w) = risk, a)``."""
        b = risk - float(np.dot(a, w))
        if self._one_plane:
            self.value = max(self.value, b - float(np.dot(a, a)) / (2.0 * self.lam))
        if self.max_planes and self.bundle.size >= self.max_planes:
            self._make_room()
        self.bundle.add(a, b)
        self._alpha = np.append(self._alpha, 0.0)
        self._stale = True

    def lower_bound(self):
        """Return the best bound, solving the QP first if planes arrived since the last solve."""
        if self._stale:
            self._solve()
        return self.value

    def _solve(self):
        started = time.perf_counter()
        _, value, alpha = self.regularizer.solve_subproblem(self.bundle, self.lam, self._alpha)
        self.value = max(self.value, value)
        self._stale = False
        if self.idle_age > 0:
            self.bundle.update_idle(alpha)
            alpha = self.bundle.prune(self.idle_age, alpha)
        self._alpha = alpha
        self.seconds += time.perf_counter() - started

    def _make_room(self):
        if self._stale:
            self._solve()
        # update_idle marked the planes whose multiplier is 0 now: they do not
        # contribute to the optimum, so dropping them keeps the bound.
        self.bundle.update_idle(self._alpha)
        self._alpha = self.bundle.prune(1, self._alpha)
        if self.bundle.size >= self.max_planes:
            a = self.bundle.combine(self._alpha)
            b = float(self._alpha @ self.bundle.b)
            self.bundle = Bundle(len(a), self._metric)
            self.bundle.add(a, b)
            self._alpha = np.ones(1)
