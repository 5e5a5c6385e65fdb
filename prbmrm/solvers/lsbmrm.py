"""BMRM with line search (paper 000, Alg. 3), the generalization of OCAS (Franc and Sonnenburg, 2008).

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.solvers.base`,
:mod:`prbmrm.solvers.bmrm`, :mod:`prbmrm.solvers.linesearch`.
"""

import functools
import math
import time

import numpy as np

from ..errors import UsageError
from .base import CuttingPlaneModel, Progress, Recorder, check_finite, snapshot
from .bmrm import InexactSchedule
from .linesearch import open_line, search_line


def check_theta(theta):
    """Raise UsageError unless 0 < theta <= 1."""
    if not (math.isfinite(theta) and 0.0 < theta <= 1.0):
        raise UsageError(f"--theta must be in (0, 1], got {theta:g}")


def minimize_lsbmrm(risk, w0, lam, regularizer, *, theta=0.9, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                    idle_age=10, inexact=1, callback=None, state=None, checkpoint=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with BMRM and an exact line search.

    Iteration t evaluates ``R_emp`` and a subgradient at ``w^c_{t-1}``, adds
    the plane, minimizes the model J_t to get ``w_t``, and then searches the
    line from the previous best point ``w^b_{t-1}`` towards ``w_t``::

        eta_t = argmin_{eta >= 0} J(w^b_{t-1} + eta (w_t - w^b_{t-1}))
        w^b_t = w^b_{t-1} + eta_t (w_t - w^b_{t-1})
        w^c_t = (1 - theta) w^b_t + theta w_t

    The search (:mod:`prbmrm.solvers.linesearch`) is exact for
    piecewise-linear losses (hinge, multiclass hinge, ...) with a quadratic
    Omega; on a :class:`prbmrm.distributed.oracle.DistributedRisk` its trial steps cost no
    pass over the data, and for non-decomposable losses each trial is one
    risk evaluation. The gap is ``min J - J_t(w_t)`` over every J evaluated
    (at the ``w^b_t`` and the ``w^c_t``), with ``J_t(w_t)`` the dual value,
    a certified lower bound of min J.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``; a ``line(w, d)`` method, if present,
        gives the cheap line search (see :func:`~prbmrm.solvers.linesearch.open_line`).
    w0 : ndarray
        Starting point, ``w^b_0 = w^c_0``.
    lam : float
        Regularization constant, > 0.
    regularizer : object
        Provides ``value(w)``, ``solve_subproblem(bundle, lam, alpha0)`` and
        ``line(w, d)``.
    theta : float
        In (0, 1]: where on the segment from ``w^b_t`` to ``w_t`` the next
        plane is taken (OCAS's 0.9 by default; 1 takes it at ``w_t``).
    epsilon, rel_epsilon, max_iter, idle_age, inexact, callback, state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`: like BMRM, the
        subproblems are solved loosely while the gap is large (BMRM 2.1's
        schedule, :class:`~prbmrm.solvers.bmrm.InexactSchedule`; the bound
        stays certified), and ``R_emp >= floor`` is a plane (a9a, hinge, gap
        1e-4: 304 / 871 / 2,208 iterations at lam 1e-4 / 1e-5 / 1e-6 against
        591 / 2,249 / 6,283 with exact subproblems).

    Returns
    -------
    Result
        ``w`` is the best point evaluated (normally ``w^b``), ``w_last`` the
        last model minimizer ``w_t``. The history's ``objective`` is
        ``J(w^b_t)``; its risk and comm seconds include the line search.
    """
    check_theta(theta)
    w_b = np.array(w0, dtype=np.float64)
    w_c = w_b
    model = CuttingPlaneModel(len(w_b), lam, regularizer, idle_age)
    model.floor = getattr(regularizer, "risk_floor", None)
    schedule = InexactSchedule()
    best_objective, best_w = np.inf, w_b
    recorder = Recorder(epsilon, rel_epsilon, callback)
    start = 1
    if state is not None:
        model.restore(state)
        recorder.restore(state)
        schedule.restore(state)
        w_b, w_c, w_t, best_w = state["w_b"], state["w_c"], state["w_t"], state["best_w"]
        best_objective, start = state["best_objective"], state["iteration"] + 1
    for t in range(start, max_iter + 1):
        r, a = risk(w_c)
        check_finite(r, a, t)
        objective = lam * regularizer.value(w_c) + r
        if objective < best_objective:
            best_objective, best_w = objective, w_c
        w_t, lower_bound, solve_seconds = model.minimize(w_c, r, a, schedule.next(best_objective) if inexact else 0.0)
        schedule.lower_bound = lower_bound
        seconds = dict(getattr(risk, "last_seconds", {"risk": 0.0, "comm": 0.0}))
        direction = w_t - w_b
        with open_line(risk, w_b, direction) as line:
            point, _ = search_line(line, regularizer, lam, w_b, direction)
        seconds = {key: value + line.seconds[key] for key, value in seconds.items()}
        w_b = w_b + point.eta * direction
        if point.value < best_objective:
            best_objective, best_w = point.value, w_b
        w_c = (1.0 - theta) * w_b + theta * w_t
        row = Progress(t, point.value, best_objective, lower_bound, best_objective - lower_bound,
                       model.bundle.size, seconds["risk"], solve_seconds, seconds["comm"],
                       time.perf_counter() - recorder.started)
        if recorder.record(row):
            break
        model.prune()
        if recorder.offer(checkpoint, t, functools.partial(
                snapshot, recorder, model, **schedule.state(), w_b=w_b, w_c=w_c, w_t=w_t, best_w=best_w,
                best_objective=best_objective, iteration=t)):
            break
    return recorder.result(best_w, best_objective, w_t)
