"""BMRM, the bundle method for regularized risk minimization (paper 000, Alg. 2 and 5).

On several ranks, every rank keeps a copy of the planes (:mod:`prbmrm.solvers.mirror`) where it can: an
iteration then sends the subproblem's multipliers, not w. Where the regularizer bounds the minimizer's norm
(:func:`single_limb`), the risk's exact sums use one integer limb per component, half the bytes, and each
plane's offset is lowered by what that rounding may add (:func:`prbmrm.solvers.base.rounding_margin`): every
plane stays below R_emp at the minimizer, so every lower bound stays valid; on any number of ranks alike.
Planes handed over from another run (a lambda path, a warm start) are lowered further where this problem's
minimizer may lie farther out (:meth:`prbmrm.solvers.bundle.Bundle.widen`).

Imports: numpy; of prbmrm: :mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.mirror`.
"""

import functools
import inspect
import time

import numpy as np

from .base import CuttingPlaneModel, Progress, Recorder, check_finite, snapshot
from .mirror import PlaneMirror


class InexactSchedule:
    """BMRM 2.1's accuracy for the subproblems: loose while the gap is large (``CBMRM::AdjustInnerSolverOptTol``).

    With eps_t the gap of iteration t (the best objective, including the
    newest iterate, minus the last lower bound), the tolerance ``tau`` starts
    at 1 and becomes ``max(min(tau, eps_t), 1e-7)``, times 0.2 whenever the
    gap grew; the subproblem may stop at a duality gap of ``tau / 2``
    (capped at ``eps_t / 2``, below the violation of the new plane, which is
    at least eps_t, so every iteration makes progress). The first subproblem
    gets 1e-6, as in BMRM 2.1.
    """

    def __init__(self):
        self.tau, self.eps, self.gap, self.lower_bound = 1.0, 0.0, 1e-6, None

    def next(self, best_objective):
        """Return the duality gap allowed to the next subproblem, the best objective so far being `best_objective`."""
        if self.lower_bound is not None:
            eps = best_objective - self.lower_bound
            self.tau = max(min(self.tau, eps), 1e-7)
            if self.eps < eps:
                self.tau *= 0.2
            self.eps = eps
            self.gap = min(0.5 * self.tau, 0.5 * eps)
        return self.gap

    def state(self):
        """Return the schedule as a dict of scalars (for a checkpoint)."""
        return {"inexact_" + name: value for name, value in vars(self).items() if value is not None}

    def restore(self, state):
        """Continue from :meth:`state`."""
        for name in vars(self):
            if "inexact_" + name in state:
                setattr(self, name, float(state["inexact_" + name]))


def _takes_out(risk):
    """True if `risk` accepts ``out=``, the array to write its subgradient into."""
    try:
        return "out" in inspect.signature(risk).parameters
    except (TypeError, ValueError):
        return False


def single_limb(risk, regularizer, bundle):
    """Whether BMRM sums the risk with one integer limb per component (:meth:`DistributedRisk.set_limbs`).

    Where it pays and can be accounted for: a risk oracle that sums exactly
    and says its error (:meth:`~prbmrm.distributed.oracle.DistributedRisk.error_bound`; not party mode's
    secure sums), a sparse bundle (d of 2^16 and more, where the bytes count), and a regularizer that
    bounds ``||w*||_2`` (``radius``: ``B = c I``) with a finite floor of R_emp. Never the rank count or a
    resumed state: a run takes the same path on any number of ranks and after a resume.
    """
    floor = getattr(regularizer, "risk_floor", None)
    return (getattr(risk, "service_points", False) and hasattr(risk, "set_limbs") and bundle.sparse
            and getattr(regularizer, "metric", True) is None and hasattr(regularizer, "radius")
            and floor is not None and np.isfinite(floor))


def minimize_bmrm(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                  idle_age=10, bundle_size=0, bundle_memory=0, inexact=1, callback=None, state=None, checkpoint=None,
                  bundle=None, alpha=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with BMRM.

    Each iteration t evaluates ``R_emp`` and a subgradient ``a_t`` at
    ``w_{t-1}``, adds the plane ``(a_t, b_t = R_emp(w_{t-1}) - <a_t, w_{t-1}>)``
    and minimizes the model ``J_t(w) = lam * Omega(w) + max_i <a_i, w> + b_i``
    through its dual, warm-started from the previous multipliers. The gap is
    ``epsilon_t = min_{i<t} J(w_i) - J_t(w_t)`` over the evaluated iterates,
    with ``J_t(w_t)`` the dual value (a certified lower bound of min J).
    With a `bundle_size` k the bundle keeps at most k planes (paper 000,
    Sec. 3.1): before a new plane joins a full bundle, all but the newest
    k - 2 are replaced by their aggregate, which leaves the subproblem's
    optimum unchanged; k = 2 is Alg. 4, whose subproblem has a closed form.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``; may carry ``last_seconds`` with
        ``"risk"`` and ``"comm"`` timings of the last call. If it takes
        ``out=`` (:class:`~prbmrm.distributed.oracle.DistributedRisk` does), every call
        gets the same array to write ``a`` into.
    w0 : ndarray
        Starting point.
    lam : float
        Regularization constant, > 0.
    regularizer : object
        Provides ``value(w)`` and ``solve_subproblem(bundle, lam, alpha0)``.
    epsilon : float
        Stop when the gap is at most this (0 disables).
    rel_epsilon : float
        Stop when the gap is at most this times the best objective (0 disables).
    max_iter : int
        Stop after this many iterations.
    idle_age : int
        Drop planes whose multiplier stayed zero this many consecutive
        iterations (the paper's 10); 0 keeps every plane.
    bundle_size : int
        Keep at most this many planes (>= 2), aggregating the oldest; 0: no limit.
    bundle_memory : int
        Keep the planes within this many bytes, aggregating the oldest (a
        sparse bundle counts the bytes its planes hold,
        :class:`~prbmrm.solvers.bundle.Bundle`); 0: no limit.
    inexact : int
        1 (default): BMRM 2.1's rule. The subproblem is solved by projected
        gradient (:func:`prbmrm.regularizers.qp.solve_simplex_pg`, a compiled kernel)
        warm-started from the previous multipliers, only to the tolerance of
        :class:`InexactSchedule` (loose while the gap is large), and a
        regularizer's ``risk_floor`` (set by ``prepare``, e.g. 0 for the
        hinge loss) is an implicit plane ``R_emp >= floor``. The early
        iterates then move less, which on a9a cuts the iterations 2.5-4x
        (BMRM 2.1's counts). The lower bound stays certified: it is the dual
        value of the returned multipliers, which are feasible, and w their
        primal map. Applies to quadratic regularizers, and within a
        `bundle_size` or `bundle_memory` until the first aggregation
        (exact QPs from then on). 0: the exact active-set QP every iteration (results then do
        not depend on how loosely rounding lets a subproblem stop).
    callback : callable, optional
        Called with a :class:`Progress` after every iteration; raising
        StopIteration stops the solver.
    state : dict, optional
        A state from `checkpoint` (:func:`prbmrm.checkpoint.load_checkpoint`):
        continue from it instead of `w0`, along the path the uninterrupted
        run would have taken.
    checkpoint : callable, optional
        ``checkpoint(t, snapshot)`` after iteration t, ``snapshot()``
        returning the state as a dict of arrays and scalars (planes, Gram
        matrix, idle counts, multipliers, best and next iterate, history);
        returning True stops the solver with status 5 (see
        :class:`prbmrm.checkpoint.Checkpointer`).
    bundle : Bundle, optional
        Planes of ``R_emp`` to start from, e.g. ``result.bundle`` of a run
        with another `lam`: the planes bound ``R_emp``, not J, so they stay
        valid for any `lam` (the lambda path reuses them). Updated in place;
        `bundle_size` and `bundle_memory` then do not apply (the bundle keeps its own).
    alpha : ndarray, optional
        The multipliers of `bundle`'s planes (``result.alpha``), a warm start
        of the first subproblem; zeros by default.

    Returns
    -------
    Result
        With ``bundle`` and ``alpha``, the final planes and their multipliers.
    """
    # w0 is the caller's: read, never written (the iterates below get arrays of their own).
    w = initial = np.asarray(w0, dtype=np.float64)
    model = CuttingPlaneModel(len(w), lam, regularizer, idle_age, bundle_size, bundle_memory)
    # R_emp >= floor is a plane too (BMRM 2.1's xi >= 0): it keeps the first
    # iterates near w0, where one plane alone would send them far.
    model.floor = getattr(regularizer, "risk_floor", None)
    single = single_limb(risk, regularizer, model.bundle if bundle is None else bundle)
    if bundle is not None and bundle.slack > 0.0 and not single:
        bundle = None  # planes of rounded sums hold within a radius that this run cannot bound: not reused
    widen = bundle is not None  # given planes may be of another problem: widened to this one's radius
    if bundle is not None:
        model.bundle = bundle
        model.alpha = np.zeros(bundle.size) if alpha is None else np.array(alpha, dtype=np.float64)
    best_objective, best_w = np.inf, w
    recorder = Recorder(epsilon, rel_epsilon, callback)
    start = 1
    schedule = InexactSchedule()
    if state is not None:
        model.restore(state)
        recorder.restore(state)
        schedule.restore(state)
        w, best_w = state["w"], state["best_w"]
        best_objective, start = state["best_objective"], state["iteration"] + 1
    # Arrays of length d made once, not per iteration (at d in the millions a fresh one costs page faults),
    # and no more of them than the method needs: the subgradient, if the risk writes it into an `out` (the
    # bundle keeps a copy of each plane), and two iterates, best_w and w. The next w_t is written into w
    # itself once w's plane is in the bundle, unless w is best_w; then into `spare`, the best iterate
    # before it (never w0, the caller's).
    gradient = getattr(risk, "subgradient_out", None)  # the oracle's own array, scaled in place
    if gradient is None and _takes_out(risk):
        gradient = np.empty(len(w))
    spare = None
    # The other ranks' copy of the planes (None: w travels whole); `alpha` the multipliers of w (None: w0).
    # After an error it stays: the stop message travels short (a JointError left no rank to detach).
    if single:
        risk.set_limbs(1)
    mirror = PlaneMirror.start(risk, model, regularizer) if state is None and bundle is None else None
    alpha = None
    for t in range(start, max_iter + 1):
        if alpha is not None and mirror is not None:
            r, a = mirror.evaluate(w, alpha, out=gradient)
        else:
            r, a = risk(w) if gradient is None else risk(w, out=gradient)
        check_finite(r, a, t)
        objective = lam * regularizer.value(w) + r
        if objective < best_objective:
            previous, best_objective, best_w = best_w, objective, w
            spare = None if previous is w or previous is initial else previous
        rounding = None
        if single:
            # ||w*|| <= radius: lam Omega(w*) <= J(w) - floor, J(w) at most objective + the risk's error.
            error_r, weighted, norm = risk.error_bound(w)
            radius = regularizer.radius((objective + error_r - regularizer.risk_floor) * 1.0001, lam)
            if widen:
                model.bundle.widen(radius)
                widen = False
            rounding = (error_r, weighted, norm, radius)
        target = spare if w is best_w else w
        w_next, lower_bound, solve_seconds = model.minimize(w, r, a, schedule.next(best_objective) if inexact else 0.0,
                                                            out=None if target is initial else target,
                                                            rounding=rounding)
        alpha = model.alpha  # w_next's multipliers, before pruning (which the copies repeat)
        if w_next is spare:
            spare = None
        seconds = getattr(risk, "last_seconds", {"risk": 0.0, "comm": 0.0})
        row = Progress(t, objective, best_objective, lower_bound, best_objective - lower_bound,
                       model.bundle.size, seconds["risk"], solve_seconds, seconds["comm"],
                       time.perf_counter() - recorder.started)
        w = w_next
        schedule.lower_bound = lower_bound
        if recorder.record(row):
            break
        model.prune()
        if recorder.offer(checkpoint, t, functools.partial(
                snapshot, recorder, model, **schedule.state(), w=w, best_w=best_w, best_objective=best_objective,
            iteration=t)):
            break
    if mirror is not None:
        mirror.close()
    if single:
        risk.set_limbs(2)
    result = recorder.result(best_w, best_objective, w)
    result.bundle, result.alpha = model.bundle, model.alpha
    return result

