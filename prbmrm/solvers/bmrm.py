"""BMRM, the bundle method for regularized risk minimization (paper 000, Alg. 2 and 5)."""

import time

import numpy as np

from ._base import Bundle, Progress, Recorder, check_finite


def minimize_bmrm(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                  idle_age=10, bundle_size=0, callback=None, bundle=None, alpha=None):
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
        ``"risk"`` and ``"comm"`` timings of the last call.
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
    callback : callable, optional
        Called with a :class:`Progress` after every iteration; raising
        StopIteration stops the solver.
    bundle : Bundle, optional
        Planes of ``R_emp`` to start from, e.g. ``result.bundle`` of a run
        with another `lam`: the planes bound ``R_emp``, not J, so they stay
        valid for any `lam` (the lambda path reuses them). Updated in place;
        `bundle_size` then does not apply (the bundle keeps its own).
    alpha : ndarray, optional
        The multipliers of `bundle`'s planes (``result.alpha``), a warm start
        of the first subproblem; zeros by default.

    Returns
    -------
    Result
        With ``bundle`` and ``alpha``, the final planes and their multipliers.
    """
    w = np.array(w0, dtype=np.float64)
    if bundle is None:
        bundle = Bundle(len(w), getattr(regularizer, "metric", None), bundle_size or None)
    alpha = np.zeros(bundle.size) if alpha is None else np.array(alpha, dtype=np.float64)
    best_objective, best_w = np.inf, w
    recorder = Recorder(epsilon, rel_epsilon, callback)
    for t in range(1, max_iter + 1):
        r, a = risk(w)
        check_finite(r, a, t)
        objective = lam * regularizer.value(w) + r
        if objective < best_objective:
            best_objective, best_w = objective, w
        solve_started = time.perf_counter()
        alpha = bundle.make_room(alpha)
        bundle.add(a, r - float(np.dot(a, w)))
        w_next, lower_bound, alpha = regularizer.solve_subproblem(bundle, lam, np.append(alpha, 0.0))
        seconds = getattr(risk, "last_seconds", {"risk": 0.0, "comm": 0.0})
        row = Progress(t, objective, best_objective, lower_bound, best_objective - lower_bound,
                       bundle.size, seconds["risk"], time.perf_counter() - solve_started,
                       seconds["comm"], time.perf_counter() - recorder.started)
        w = w_next
        if recorder.record(row):
            break
        if idle_age > 0:
            bundle.update_idle(alpha)
            alpha = bundle.prune(idle_age, alpha)
    result = recorder.result(best_w, best_objective, w)
    result.bundle, result.alpha = bundle, alpha
    return result
