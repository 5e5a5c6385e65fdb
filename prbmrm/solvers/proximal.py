"""The proximal bundle method (paper 000, Alg. 1) with Kiwiel's (1990) proximity control.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.regularizers.qp`, :mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.bundle`.
"""

import math
import time

import numpy as np

from ..errors import UsageError
from ..regularizers.qp import solve_simplex_qp
from .base import Progress, Recorder, check_finite, snapshot
from .bundle import Bundle


def minimize_proximal(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                      idle_age=10, bundle_size=0, bundle_memory=0, zeta=1.0, rho=0.1, null_steps=5, callback=None, state=None,
                      checkpoint=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with the proximal bundle method.

    Unlike BMRM, the model is built of planes of J itself: iteration t
    evaluates J and ``s_t = lam * grad Omega(w_{t-1}) + a_t`` at ``w_{t-1}``
    and adds the plane ``J(w) >= <s_t, w> + c_t``. The next iterate
    minimizes the model ``J_cp`` stabilized around the prox-center ``w_hat``::

        w_t = argmin_w  J_cp(w) + zeta_t / 2 * |w - w_hat|^2,

    through its dual, a QP over the simplex: maximize ``v^T alpha -
    alpha^T S S^T alpha / (2 zeta)`` with S the rows s_i and ``v_i = c_i +
    <s_i, w_hat>`` the planes' values at the center; then ``w_t = w_hat -
    S^T alpha / zeta``. Without a line search (eta = 1, as Alg. 1 allows) the
    step is serious, w_t becoming the center, if ``J(w_hat) - J(w_t) >= rho
    * eps_t`` with ``eps_t = J(w_hat) - [J_cp(w_t) + zeta/2 |w_t - w_hat|^2]``
    (Alg. 1, lines 7 and 11-15), and null otherwise. zeta follows Kiwiel's
    (1990) safeguarded rule (:class:`ProximityControl`): lowered after
    serious steps that agree well with the model, raised after null steps
    that show it poor, by at most a factor 10 per step.

    eps_t bounds ``J(w_hat) - J(w)`` only up to ``zeta/2 |w - w_hat|^2``
    (Sec. 2.1), not the distance to min J, and is not what the solver
    reports. The lower bound is BMRM's: the solver also keeps the planes
    ``(a_t, b_t)`` of R_emp and reports the best dual value so far of
    ``min_w lam * Omega(w) + max_i <a_i, w> + b_i`` (paper 000, eq. 10), a
    certified lower bound of min J, so the gap ``min_i J(w_i)`` minus it
    bounds the suboptimality of the returned w, as in BMRM. That
    subproblem is solved to optimality over the planes of every point
    evaluated (each bundle aggregates the oldest planes by its own
    subproblem's multipliers, which keeps its value; a plane is dropped
    when idle in both subproblems, so the two bundles stay row for row
    alike). This doubles rank 0's memory: two bundles of at most
    `bundle_size` planes each.

    Where the model stays poor near the center, Kiwiel's rule may keep
    zeta small and the steps null for hundreds of iterations (multiclass
    hinge on dna at lam 1e-5: 3,000 iterations, 105 serious, stuck at a
    3% gap). Hence the one rule beyond Alg. 1: after `null_steps` null
    steps in a row the next point evaluated is BMRM's, the minimizer of
    the R_emp model just solved for the bound (it becomes the center if
    J decreased there; zeta stays). Each such point adds the plane BMRM
    would add, and BMRM's convergence argument (paper 000, Thms. 4-5)
    needs only those planes, more planes only raising its dual: the gap
    then shrinks at least at BMRM's rate in those iterations.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``; may carry ``last_seconds``.
    w0 : ndarray
        Starting point, the first prox-center.
    lam : float
        Regularization constant, > 0.
    regularizer : object
        Provides ``value(w)``, ``subgradient(w)`` and
        ``solve_subproblem(bundle, lam, alpha0)`` (for the lower bound).
    epsilon, rel_epsilon : float
        Stop when the gap is at most `epsilon` or `rel_epsilon` times the
        best objective (0 disables either).
    max_iter : int
        Stop after this many iterations (risk evaluations).
    idle_age : int
        Drop planes whose multiplier in the stabilized subproblem stayed zero
        this many consecutive iterations; 0 keeps every plane.
    bundle_size : int
        Keep at most this many planes (>= 2) per bundle, aggregating the
        oldest with the stabilized subproblem's multipliers; 0: no limit.
    bundle_memory : int
        Keep the planes of both bundles within this many bytes, half each
        (:class:`~prbmrm.solvers.bundle.Bundle`'s `max_bytes`), aggregating
        as for `bundle_size`; 0: no limit.
    zeta : float
        The first proximal weight, > 0. Kiwiel's rule changes it at most
        tenfold per step, and lowers it quickly after good serious steps, so
        a large start costs little; a small one makes many null steps.
    rho : float
        The serious-step fraction in (0, 1).
    null_steps : int
        After this many null steps in a row, evaluate BMRM's point next
        (0: never, plain Alg. 1).
    callback : callable, optional
        Called with a :class:`Progress` after every iteration; raising
        StopIteration stops the solver.
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`; the state holds
        both bundles and their multipliers, the proximity control, the
        prox-center, the last step's prediction, the null-step count, the
        best point and the history.

    Returns
    -------
    Result
        ``w`` is the best evaluated iterate, ``w_last`` the last trial point.
    """
    if not (zeta > 0 and 0 < rho < 1 and null_steps >= 0):
        raise UsageError(f"the proximal method needs zeta > 0, 0 < rho < 1 and null_steps >= 0, got {zeta:g}, "
                         f"{rho:g} and {null_steps:g}")
    w = np.array(w0, dtype=np.float64)
    max_size, max_bytes = bundle_size or None, bundle_memory // 2 or None
    model = Bundle(len(w), None, max_size, max_bytes=max_bytes)  # planes (s_i, c_i) of J
    lower = Bundle(len(w), getattr(regularizer, "metric", None), max_size, max_bytes=max_bytes)  # of R_emp
    control = ProximityControl(zeta)
    alpha, lower_alpha = np.zeros(0), np.zeros(0)
    best_objective, best_w = np.inf, w
    lower_bound = -np.inf
    step = None  # what the last stabilized step predicted
    nulls, cutting_plane = 0, False  # null steps in a row; whether w is BMRM's point
    recorder = Recorder(epsilon, rel_epsilon, callback)
    start = 1
    if state is not None:
        recorder.restore(state)
        control.restore(state)
        model.restore(state["planes"])
        lower.restore(state["lower"])
        alpha, lower_alpha, w, best_w = state["alpha"], state["lower_alpha"], state["w"], state["best_w"]
        best_objective, lower_bound, center = state["best_objective"], state["lower_bound"], state["center"]
        center_objective, step, start = state["center_objective"], tuple(state["step"]), state["iteration"] + 1
        nulls, cutting_plane = int(state["nulls"]), bool(state["cutting_plane"])
    for t in range(start, max_iter + 1):
        r, a = risk(w)
        check_finite(r, a, t)
        objective = lam * regularizer.value(w) + r
        if objective < best_objective:
            best_objective, best_w = objective, w
        solve_started = time.perf_counter()
        s = np.multiply(regularizer.subgradient(w), lam)
        s += a  # in place: one temporary of d less, bitwise lam * grad + a
        if step is None:
            center, center_objective = w, objective
        elif cutting_plane:
            # BMRM's point promises no decrease: it moves the center if J fell; zeta stays.
            if objective < center_objective:
                center, center_objective = w, objective
        else:
            proximal_gap, predicted, aggregate_error, p_norm = step
            decrease = center_objective - objective
            serious = decrease >= rho * proximal_gap
            # The new plane's linearization error at the center (>= 0 by convexity).
            error = center_objective - objective - float(np.dot(s, center - w))
            control.update(serious, decrease, predicted, aggregate_error, p_norm, error)
            nulls = 0 if serious else nulls + 1
            if serious:
                center, center_objective = w, objective
        alpha, lower_alpha = (np.append(m, 0.0) for m in make_room_alike(model, lower, alpha, lower_alpha))
        # The center's record of the planes' values (Bundle.add) spares stabilized_step a pass over them.
        model.add(s, objective - float(np.dot(s, w)), point=center)
        lower.add(a, r - float(np.dot(a, w)))
        w_cutting, bound, lower_alpha = regularizer.solve_subproblem(lower, lam, lower_alpha)
        lower_bound = max(lower_bound, bound)
        zeta_t = control.zeta
        w_next, value, alpha, p = stabilized_step(model, center, zeta_t, alpha)
        p_norm = math.sqrt(float(np.dot(p, p)))
        # eps_t of Alg. 1, the predicted decrease eps_t + |p|^2 / (2 zeta) and
        # the aggregate plane's linearization error at the center.
        proximal_gap = center_objective - value
        half = 0.5 * p_norm ** 2 / zeta_t
        step = (proximal_gap, proximal_gap + half, proximal_gap - half, p_norm)
        seconds = getattr(risk, "last_seconds", {"risk": 0.0, "comm": 0.0})
        row = Progress(t, objective, best_objective, lower_bound, best_objective - lower_bound,
                       model.size, seconds["risk"], time.perf_counter() - solve_started,
                       seconds["comm"], time.perf_counter() - recorder.started)
        cutting_plane = 0 < null_steps <= nulls
        if cutting_plane:
            nulls = 0
        w = w_cutting if cutting_plane else w_next
        if recorder.record(row):
            break
        if idle_age > 0:
            # A plane goes when idle in both subproblems: the bundles stay row for row alike.
            active = alpha + lower_alpha
            model.update_idle(active)
            lower.update_idle(active)
            lower_alpha = lower.prune(idle_age, lower_alpha)
            alpha = model.prune(idle_age, alpha)
        if recorder.offer(checkpoint, t, lambda: snapshot(
                recorder, control, planes=model.state(), lower=lower.state(), alpha=alpha, lower_alpha=lower_alpha,
                w=w, best_w=best_w, best_objective=best_objective, lower_bound=lower_bound, center=center,
                center_objective=center_objective, step=np.array(step), nulls=nulls,
                cutting_plane=int(cutting_plane), iteration=t)):
            break
    return recorder.result(best_w, best_objective, w)


def make_room_alike(model, lower, alpha, lower_alpha):
    """Make room for one more plane in both bundles, keeping them row for row alike; return both multipliers.

    Where either bundle is full (:meth:`Bundle.room`), each aggregates the
    same oldest planes (those the fuller one needs aggregated) by its own
    multipliers (:meth:`Bundle.aggregate_oldest`), which keeps its subproblem's
    value; where its own multipliers are all 0 there, by the other's (an
    aggregate with multiplier 0, which keeps the value too), so that one
    bundle never drops planes the other aggregates. Both drop them where
    both multipliers are 0.
    """
    rooms = [keep for keep in (model.room(), lower.room()) if keep is not None]
    if not rooms:
        return alpha, lower_alpha
    keep = min(rooms)
    old = model.size - keep
    own = (alpha, lower_alpha)
    result = []
    for bundle, mine, other in zip((model, lower), own, own[::-1]):
        if np.sum(mine[:old]) > 0.0 or np.sum(other[:old]) <= 0.0:
            result.append(bundle.aggregate_oldest(mine, keep))
        else:
            bundle.aggregate_oldest(other, keep)
            result.append(np.concatenate(([0.0], mine[old:])))
    return tuple(result)


def stabilized_step(bundle, center, zeta, alpha0=None):
    """Minimize ``max_i <s_i, w> + c_i + zeta / 2 * |w - center|^2`` over w, through its dual.

    With ``v_i = <s_i, center> + c_i`` the planes' values at the center, the
    inner minimum over w of the Lagrangian is reached at ``w = center - S^T
    alpha / zeta``, which leaves the simplex QP ``max_alpha v^T alpha -
    alpha^T S S^T alpha / (2 zeta)``; its value is the stabilized model's
    minimum.

    Parameters
    ----------
    bundle : Bundle
        The planes (s_i, c_i) as its rows A and offsets b.
    center : ndarray
    zeta : float
        The proximal weight, > 0.
    alpha0 : ndarray, optional
        Warm start for the multipliers.

    Returns
    -------
    w : ndarray
        The minimizer.
    value : float
        The dual value at `alpha` (the minimum at the QP optimum).
    alpha : ndarray
        The multipliers, on the simplex.
    p : ndarray
        The aggregate subgradient ``S^T alpha = zeta * (center - w)``.
    """
    qp = solve_simplex_qp(bundle.gram / zeta, bundle.products(center) + bundle.b, x0=alpha0)
    p = bundle.combine(qp.x)
    w = np.divide(p, zeta)
    return np.subtract(center, w, out=w), qp.value, qp.x, p


class ProximityControl:
    """Kiwiel's (1990) update of the proximal weight zeta (his u).

    K. C. Kiwiel, "Proximity control in bundle methods for convex
    nondifferentiable minimization", Math. Programming 46 (1990) 105-122,
    the weight-updating procedure of Sec. 2. With the predicted decrease
    ``P = J(w_hat) - J_cp(w_t) = |p|^2 / zeta + alpha_p`` (p the aggregate
    subgradient, alpha_p its linearization error at the center) and the
    actual decrease ``D = J(w_hat) - J(w_t)``, the interpolated weight
    ``2 zeta (1 - D / P)`` is the one whose step would have ended at the
    minimum of the quadratic that interpolates J(w_hat), the slope -P and
    J(w_t) along the step. After a serious step it is taken if ``D >= m_R P`` and the
    last step was serious too, otherwise zeta halves after 4 serious steps
    in a row; it never falls below zeta / 10 nor `zeta_min`. After a null
    step it is taken if the new plane's linearization error at the center
    exceeds ``max(eps_v, 10 P)`` (the model is poor where it was trusted)
    after 4 null steps in a row, never above 10 zeta. ``eps_v`` estimates
    the variation of J near the center.

    Parameters
    ----------
    zeta : float
        The first weight, > 0.
    zeta_min : float, optional
        Lower safeguard; default ``1e-9 * zeta``.
    m_r : float
        Kiwiel's m_R, the agreement that allows a decrease of zeta.
    """

    def __init__(self, zeta, zeta_min=None, m_r=0.5):
        self.zeta = float(zeta)
        self.zeta_min = 1e-9 * self.zeta if zeta_min is None else zeta_min
        self.m_r = m_r
        self.streak = 0  # > 0: serious steps in a row since zeta changed; < 0: null steps
        self.variation = np.inf  # eps_v

    def state(self):
        """Return the weight, its safeguard, the streak and eps_v as a dict (for a checkpoint)."""
        return {"zeta": self.zeta, "zeta_min": self.zeta_min, "streak": self.streak, "variation": self.variation}

    def restore(self, state):
        """Continue from :meth:`state`."""
        self.zeta, self.zeta_min = state["zeta"], state["zeta_min"]
        self.streak, self.variation = state["streak"], state["variation"]

    def update(self, serious, decrease, predicted, aggregate_error, p_norm, error):
        """Update :attr:`zeta` after a step.

        Parameters
        ----------
        serious : bool
            Whether the step was serious.
        decrease : float
            ``J(w_hat) - J(w_t)``, the actual decrease.
        predicted : float
            ``J(w_hat) - J_cp(w_t)`` of the subproblem that chose w_t, >= 0.
        aggregate_error : float
            The aggregate plane's linearization error at the center.
        p_norm : float
            The aggregate subgradient's norm.
        error : float
            The linearization error at the center of the plane at w_t.
        """
        zeta = self.zeta
        # Without a predicted decrease there is nothing to interpolate.
        interpolated = 2.0 * zeta * (1.0 - decrease / predicted) if predicted > 0.0 else zeta
        new = zeta
        if serious:
            if self.streak > 0 and decrease >= self.m_r * predicted:
                new = interpolated
            elif self.streak > 3:
                new = zeta / 2.0
            new = max(new, zeta / 10.0, self.zeta_min)
            self.variation = max(self.variation, 2.0 * predicted)
            self.streak = 1 if new != zeta else max(self.streak + 1, 1)
        else:
            self.variation = min(self.variation, p_norm + aggregate_error)
            if error > max(self.variation, 10.0 * predicted) and self.streak < -3:
                new = interpolated
            new = min(new, 10.0 * zeta)
            self.streak = -1 if new != zeta else min(self.streak - 1, -1)
        self.zeta = new
