"""BMRM, the bundle method for regularized risk minimization (paper 000, Alg. 2 and 5)."""

import time

import numpy as np

from ..errors import InputError
from ._base import HISTORY_COLUMNS, Bundle, Progress, Result

_MESSAGES = {0: "gap <= epsilon", 1: "gap <= rel_epsilon * objective",
             2: "maximum number of iterations reached", 3: "stopped by the callback"}


def minimize_bmrm(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                  idle_age=10, callback=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with BMRM.

    Each iteration t evaluates ``R_emp`` and a subgradient ``a_t`` at
    ``w_{t-1}``, adds the plane ``(a_t, b_t = R_emp(w_{t-1}) - <a_t, w_{t-1}>)``
    and minimizes the model ``J_t(w) = lam * Omega(w) + max_i <a_i, w> + b_i``
    through its dual, warm-started from the previous multipliers. The gap is
    ``epsilon_t = min_{i<t} J(w_i) - J_t(w_t)`` over the evaluated iterates,
    with ``J_t(w_t)`` the dual value (a certified lower bound of min J).

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
    callback : callable, optional
        Called with a :class:`Progress` after every iteration; raising
        StopIteration stops the solver.

    Returns
    -------
    Result
    """
    w = np.array(w0, dtype=np.float64)
    bundle = Bundle(len(w))
    alpha = np.zeros(0)
    best_objective, best_w = np.inf, w
    history = {name: [] for name in HISTORY_COLUMNS}
    started = time.perf_counter()
    status = 2
    for t in range(1, max_iter + 1):
        r, a = risk(w)
        # |a|^2 enters the Gram matrix: it must be finite too, not only a.
        with np.errstate(over="ignore"):
            norm2 = np.dot(a, a)
        if not (np.isfinite(r) and np.isfinite(norm2)):
            raise InputError(f"the empirical risk or its subgradient is not finite at iteration {t} "
                             "(overflow in the loss? try a larger --lam or scaled features)")
        objective = lam * regularizer.value(w) + r
        if objective < best_objective:
            best_objective, best_w = objective, w
        solve_started = time.perf_counter()
        bundle.add(a, r - float(np.dot(a, w)))
        w_next, lower_bound, alpha = regularizer.solve_subproblem(bundle, lam, np.append(alpha, 0.0))
        seconds = getattr(risk, "last_seconds", {"risk": 0.0, "comm": 0.0})
        row = Progress(t, objective, best_objective, lower_bound, best_objective - lower_bound,
                       bundle.size, seconds["risk"], time.perf_counter() - solve_started,
                       seconds["comm"], time.perf_counter() - started)
        for name in HISTORY_COLUMNS:
            history[name].append(getattr(row, name))
        if row.gap <= epsilon:
            status = 0
        elif row.gap <= rel_epsilon * abs(best_objective):
            status = 1
        if callback is not None:
            try:
                callback(row)
            except StopIteration:
                status = 3 if status == 2 else status
        w = w_next
        if status != 2:
            break
        if idle_age > 0:
            bundle.update_idle(alpha)
            alpha = bundle.prune(idle_age, alpha)
    return Result(w=best_w, fun=best_objective, lower_bound=history["lower_bound"][-1],
                  gap=history["gap"][-1], nit=t, status=status, message=_MESSAGES[status],
                  w_last=w, history={k: np.asarray(v) for k, v in history.items()})
