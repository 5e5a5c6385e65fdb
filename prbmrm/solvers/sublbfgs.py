"""subLBFGS (paper 003, Alg. 1-2) and OWL-QN / OWL-QN* (paper 003, Sec. 8.4), with a certified gap.

subLBFGS minimizes ``J(w) = lam * Omega(w) + R_emp(w)`` for a nonsmooth R_emp
(hinge, multiclass and multilabel hinge) with the limited-memory BFGS
matrix B and:

- the subgradient quadratic model ``M(p) = p^T B^-1 p / 2 + sup_{g in dJ(w)} <g, p>``,
  minimized approximately by the direction-finding loop of Alg. 2
  (:func:`descent_direction`);
- the *argsup oracle* ``argsup_{g in dJ(w)} <g, p>`` computed on every rank
  (:class:`ArgsupRanks`: one pass over the local data and one reproducible
  Allreduce; an example exactly on a kink of a piecewise-linear loss takes
  the slope of the piece ahead along p, see ``Loss.steepest_gradient``);
- the line search of LS-BMRM (:func:`prbmrm.solvers.linesearch.search_line`):
  exact for piecewise-linear losses with a quadratic Omega (paper 003,
  Alg. 3 and 5), the bracketing secant search otherwise (stopping within
  ``ftol`` of min phi); a minimizer of phi along p satisfies the subgradient
  Wolfe conditions (eq. 23-24) for any 0 < c1 < c2 < 1;
- the curvature safeguards of Sec. 3.4: ``g_{t+1}`` is the argsup along
  ``p_t`` at ``w_{t+1}`` (so ``s^T y > 0``), ``s`` gets the multiple of y
  that makes ``s^T y / y^T y >= h``, and pairs with ``s^T y / s^T s`` below
  ``1 / H`` are not stored.

OWL-QN (Andrew and Gao, 2007) minimizes ``lam ||w||_1 + R_emp(w)`` for a smooth
R_emp (logistic): the orthant-wise pseudo-gradient, the LBFGS direction
projected onto its orthant and a backtracking line search projected onto the
orthant. OWL-QN* takes the direction from :func:`descent_direction` started
at the pseudo-gradient instead (paper 003, Sec. 8.4).

None of these methods has a lower bound of its own: every risk evaluation
(iterates, argsup calls, trial steps of the backtracking) is a plane of
R_emp and feeds a :class:`~prbmrm.solvers.base.CuttingPlaneBound`, whose
bound gives the certified gap the run stops on.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.losses`, :mod:`prbmrm.distributed.oracle`,
:mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.linesearch`.
"""

import math
import time
from collections import deque

import numpy as np

from ..errors import UsageError
from ..losses import ScalarLoss
from ..losses.line import block_sums
from ..distributed.exact import FixedPointSum
from ..distributed.oracle import service
from .base import CuttingPlaneBound, Progress, Recorder, check_finite, snapshot
from .linesearch import open_line, search_line


# --------------------------------------------------------------------------
# The argsup oracle
# --------------------------------------------------------------------------

@service("argsup")
class ArgsupRanks:
    """The argsup oracle of R_emp on every rank: ``(R_emp(w), plane value, argsup_{a in dR_emp(w)} <a, p>)``.

    Built on every rank by ``risk.attach(ArgsupRanks)``; rank 0 puts w and p
    in :attr:`buffer` and calls ``risk.request(0)``: every rank receives
    them (one broadcast), sums its blocks' ``Loss.steepest_gradient`` and
    the blocks' sums are added exactly in fixed point (``comm.exact_sum``, as
    the risk's own evaluations are), so any number of ranks gives bitwise the same result.
    """

    def __init__(self, risk):
        self.risk = risk
        self.buffer = np.zeros(2 * risk.dim)
        self._partials = np.empty((len(risk.blocks), risk.dim + 2))
        # Bounds agreed per call: a state kept between calls would have to go into checkpoints.
        self._exact = FixedPointSum(risk.dim + 2, risk.n_parts, remember=False)
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
        # A piecewise-linear scalar loss whose steepest_gradient is the shared one: its
        # per-row work runs per group of blocks (a few numpy calls per group, not per block).
        loss = risk.loss
        self._grouped = (isinstance(loss, ScalarLoss) and loss.piecewise_linear
                         and type(loss).steepest_gradient is ScalarLoss.steepest_gradient)

    def _group_partials(self, w, p):
        """The blocks' partials as ``Loss.steepest_gradient`` forms them, with its per-row work per group.

        A block's sums come from its own rows alone (``block_sums``, ``X^T c``
        per block), so they do not depend on the blocks held with it.
        """
        risk = self.risk
        F0, dF, blocks = risk.scores(w), risk.scores(p), risk.blocks
        for first, end, bounds, y in risk.groups:
            a, b = bounds[0], bounds[-1]
            values, planes, coefficients = risk.loss.steepest_rows(F0[a:b], dF[a:b], y)
            starts = bounds - a
            self._partials[first:end, -2] = block_sums(values, starts)
            self._partials[first:end, -1] = block_sums(planes, starts)
            for partial, (X, _), s, e in zip(self._partials[first:end], blocks[first:end], starts[:-1], starts[1:]):
                partial[:-2] = X.T @ coefficients[s:e]

    def handle(self, code):
        """Answer one request (rank 0's buffer is broadcast first); return ``(R_emp, plane value, a)``.

        ``plane value + <a, v - w> <= R_emp(v)`` for every v (see ``Loss.steepest_gradient``).
        """
        risk = self.risk
        started = time.perf_counter()
        risk.comm.bcast_array(self.buffer)
        received = time.perf_counter()
        w, p = self.buffer[:risk.dim], self.buffer[risk.dim:]
        if self._grouped:
            self._group_partials(w, p)
        else:
            for partial, (X, y) in zip(self._partials, risk.blocks):
                value, plane, gradient = risk.loss.steepest_gradient(w, p, X, y)
                partial[-2:] = value, plane
                partial[:-2] = np.ravel(gradient)
        computed = time.perf_counter()
        sums = risk.comm.exact_sum(self._partials, self._exact) / risk.n_total
        self.last_seconds = {"risk": computed - received,
                             "comm": received - started + time.perf_counter() - computed}
        return sums[-2], sums[-1], sums[:-2]


def risk_argsup(risk):
    """Return ``argsup(w, p) -> (R_emp(w), b, a)`` for `risk`, with ``a`` maximizing ``<a, p>`` over dR_emp(w).

    ``b + <a, v - w>`` is a plane below R_emp (b = R_emp(w) where a is an
    exact subgradient).

    On a :class:`prbmrm.distributed.oracle.DistributedRisk` with a decomposable loss it is
    the distributed :class:`ArgsupRanks`; otherwise ``risk(w)`` (an arbitrary
    subgradient: Alg. 2 then corrects the direction with what it gets).

    Raises
    ------
    UsageError
        For a structured loss, which has no argsup oracle.
    """
    loss = getattr(risk, "loss", None)
    if getattr(loss, "structured", False):
        raise UsageError(f"solver 'sublbfgs' needs the argsup oracle of a loss of the scores X w; the "
                         f"structured loss {loss.name!r} has none (use bmrm, lsbmrm, proximal or lbfgs)")
    if not (hasattr(risk, "attach") and risk.loss.decomposable):
        def plain(w, p):
            r, a = risk(w)
            return r, r, a
        return plain
    ranks = risk.attach(ArgsupRanks)

    def argsup(w, p):
        ranks.buffer[:risk.dim], ranks.buffer[risk.dim:] = w, p
        result = risk.request(0)
        risk.last_seconds = ranks.last_seconds
        return result
    return argsup


def regularizer_argsup(regularizer, w, p):
    """Return ``argsup_{u in dOmega(w)} <u, p>``: the gradient, or for L1 ``sign(p_i)`` where ``w_i = 0``."""
    if regularizer.name == "l1":
        return np.where(w != 0, np.sign(w), np.sign(p))
    return regularizer.subgradient(w)


# --------------------------------------------------------------------------
# Limited-memory BFGS and the direction-finding routine
# --------------------------------------------------------------------------

class LbfgsMatrix:
    """The LBFGS inverse-Hessian approximation B (Nocedal and Wright, Alg. 9.1) with Sec. 3.4's safeguards.

    Parameters
    ----------
    memory : int
        Pairs (s, y) kept (the buffer size m).
    h : float
        Lower bound on ``s^T y / y^T y`` (paper 003, Alg. 1 line 14).
    H : float
        Pairs with ``s^T y / s^T s < 1 / H`` are skipped (eq. 29).
    """

    def __init__(self, memory, h=1e-8, H=1e8):
        self.pairs = deque(maxlen=memory)
        self.h, self.H = h, H

    def state(self):
        """Return the stored pairs as a dict of arrays (for a checkpoint), oldest first."""
        if not self.pairs:
            return {"s": np.empty((0, 0)), "y": np.empty((0, 0)), "rho": np.empty(0)}
        s, y, rho = zip(*self.pairs)
        return {"s": np.array(s), "y": np.array(y), "rho": np.array(rho)}

    def restore(self, state):
        """Replace the pairs by those of :meth:`state`."""
        self.pairs.clear()
        # Rows copied: separate arrays, aligned as the saved ones were, so dot products round alike.
        self.pairs.extend((s.copy(), y.copy(), float(rho)) for s, y, rho in
                          zip(state["s"], state["y"], state["rho"]))

    def update(self, s, y):
        """Store the pair (s, y) after the safeguards; return False if it was skipped."""
        yy = float(y @ y)
        if yy == 0.0:
            return False
        s = s + max(0.0, self.h - float(s @ y) / yy) * y
        sy = float(s @ y)
        if not (sy > 0 and sy >= float(s @ s) / self.H):
            return False
        self.pairs.append((s, y, 1.0 / sy))
        return True

    def dot(self, v):
        """Return ``B v`` by the two-loop recursion (B_0 = gamma I, gamma = s^T y / y^T y of the newest pair)."""
        q = np.array(v, dtype=np.float64)
        alphas = []
        for s, y, rho in reversed(self.pairs):
            alpha = rho * float(s @ q)
            q -= alpha * y
            alphas.append(alpha)
        if self.pairs:
            s, y, rho = self.pairs[-1]
            q *= 1.0 / (rho * float(y @ y))
        for (s, y, rho), alpha in zip(self.pairs, reversed(alphas)):
            q += (alpha - rho * float(y @ q)) * s
        return q


def descent_direction(g1, argsup, B, tolerance=1e-5, k_max=100):
    """Paper 003, Alg. 2: approximately minimize ``M(p) = p^T B^-1 p / 2 + sup_{g in dJ(w)} <g, p>``.

    Parameters
    ----------
    g1 : ndarray
        A subgradient of J at w.
    argsup : callable
        ``argsup(p) -> g``, the subgradient of J at w maximizing ``<g, p>``.
    B : LbfgsMatrix
    tolerance : float
        Stop when the bound eps^(i) on ``M(p) - min M`` (eq. 79) is at most this.
    k_max : int
        Most iterations of the loop.

    Returns
    -------
    p : ndarray or None
        The p^(j) of least M, None if it is no descent direction
        (``sup <g, p> >= 0``: w is optimal up to the tolerance).
    iterations : int
    """
    g_bar = np.array(g1, dtype=np.float64)
    p = -B.dot(g_bar)
    g_next = argsup(p)
    # M(p^(j)) = -p^(j)T g_bar^(j) / 2 + p^(j)T g^(j+1), since p^(j) = -B g_bar^(j).
    best_p, best_m, best_sup = p, float(p @ g_next) - 0.5 * float(p @ g_bar), float(p @ g_next)
    history = [(float(p @ g_next), float(p @ g_bar))]  # (p^(j)T g^(j+1), p^(j)T g_bar^(j))
    eps = history[0][0] - history[0][1]
    i = 1
    while (float(g_next @ p) > 0 or eps > tolerance) and eps > 0 and i < k_max:
        diff = g_bar - g_next
        B_diff = B.dot(diff)
        curvature = float(diff @ B_diff)
        mu = 1.0 if curvature <= 0 else min(1.0, max(0.0, float(B_diff @ g_bar) / curvature))  # eq. 73
        g_bar = (1.0 - mu) * g_bar + mu * g_next
        p = (1.0 - mu) * p - mu * B.dot(g_next)
        g_next = argsup(p)
        sup, pg = float(p @ g_next), float(p @ g_bar)
        history.append((sup, pg))
        if sup - 0.5 * pg < best_m:
            best_p, best_m, best_sup = p, sup - 0.5 * pg, sup
        eps = min(s - 0.5 * (q + pg) for s, q in history)
        i += 1
    return (best_p if best_sup < 0 else None), i


def _check_options(memory, tolerance, k_max, max_planes):
    if memory < 1:
        raise UsageError(f"solver parameter memory must be >= 1, got {memory}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise UsageError(f"solver parameter tolerance must be >= 0, got {tolerance:g}")
    if k_max < 1:
        raise UsageError(f"solver parameter k_max must be >= 1, got {k_max}")
    if max_planes < 0 or max_planes == 1:
        raise UsageError(f"solver parameter max_planes must be 0 (no limit) or >= 2, got {max_planes}")


class _Run:
    """What the quasi-Newton solvers share: evaluations that feed the bound, rows, the best point."""

    def __init__(self, risk, lam, regularizer, bound, recorder):
        self.risk, self.lam, self.regularizer = risk, lam, regularizer
        self.bound, self.recorder = bound, recorder
        self.best_objective, self.best_w = np.inf, None
        self.seconds = {"risk": 0.0, "comm": 0.0}
        self.iteration = 0

    def account(self, seconds):
        for key in self.seconds:
            self.seconds[key] += seconds.get(key, 0.0)

    def evaluated(self, w, r, a, plane=None):
        """Take the evaluation ``(w, R_emp(w), a)``: check it, add its plane; return J(w).

        `plane` (default `r`) is the plane's value at w, at most R_emp(w).
        """
        check_finite(r, a, self.iteration + 1)
        self.account(getattr(self.risk, "last_seconds", {}))
        self.bound.add(w, r if plane is None else plane, a)
        objective = self.lam * self.regularizer.value(w) + r
        if objective < self.best_objective:
            self.best_objective, self.best_w = objective, w
        return objective

    def record(self, objective):
        """Append the row of the iterate with J = `objective`; return True to stop."""
        self.iteration += 1
        solved = self.bound.seconds
        lower_bound = self.bound.lower_bound()
        row = Progress(self.iteration, objective, self.best_objective, lower_bound,
                       self.best_objective - lower_bound, self.bound.bundle.size, self.seconds["risk"],
                       self.bound.seconds - solved, self.seconds["comm"],
                       time.perf_counter() - self.recorder.started)
        self.seconds = {"risk": 0.0, "comm": 0.0}
        return self.recorder.record(row)

    def checkpointed(self, checkpoint, B, **values):
        """Offer the state after the last row to `checkpoint`; return True (status 5) if it says stop.

        The state is the history, the bound's planes, the LBFGS pairs of `B`,
        the best point, and the solver's `values` (iterate, its subgradient
        and objective): all the next iteration depends on, so a resumed run
        takes the uninterrupted run's path bitwise.
        """
        return self.recorder.offer(checkpoint, self.iteration, lambda: snapshot(
            self.recorder, self.bound, lbfgs=B.state(), best_w=self.best_w,
            best_objective=self.best_objective, iteration=self.iteration, **values))

    def restore(self, state, B, *names):
        """Continue from a state of :meth:`checkpointed`; return its values `names`."""
        self.recorder.restore(state)
        self.bound.restore(state)
        B.restore(state["lbfgs"])
        self.best_w, self.best_objective = state["best_w"], state["best_objective"]
        self.iteration = state["iteration"]
        return [state[name] for name in names]

    def result(self, w_last, stalled):
        if stalled and self.recorder.status == 2:
            self.recorder.status = 4
        return self.recorder.result(self.best_w, self.best_objective, w_last)


def minimize_sublbfgs(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                      idle_age=10, memory=15, tolerance=1e-5, k_max=100, max_planes=50, callback=None,
                      state=None, checkpoint=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with subLBFGS (paper 003, Alg. 1-2), certifying the gap.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``; a :class:`prbmrm.distributed.oracle.DistributedRisk`
        gives the distributed argsup oracle and the cheap line search.
    w0 : ndarray
    lam : float
    regularizer : object
        Differentiable (l2, quadratic, ...): its gradient is its part of every subgradient.
    epsilon, rel_epsilon, max_iter, idle_age, callback
        As for :func:`~prbmrm.solvers.lbfgs.minimize_lbfgs`.
    memory : int
        LBFGS buffer size m (15).
    tolerance : float
        Direction-finding tolerance (1e-5).
    k_max : int
        Most direction-finding iterations per step (100).
    max_planes : int
        Most planes the bound keeps (50; 0: no limit).
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`; the state holds
        the iterate, its subgradient and objective, the LBFGS pairs, the
        bound's planes and multipliers, the best point and the history.

    Returns
    -------
    Result
        Status 4 when no descent direction or no decrease was found before
        the gap test was met.
    """
    if not regularizer.differentiable:
        raise UsageError(f"subLBFGS needs a differentiable regularizer (l2, quadratic, ...), "
                         f"{regularizer.name!r} is not (use --solver owlqn_star for l1)")
    _check_options(memory, tolerance, k_max, max_planes)
    run = _Run(risk, lam, regularizer, CuttingPlaneBound(len(w0), regularizer, lam, max_planes=max_planes,
                                                         idle_age=idle_age), Recorder(epsilon, rel_epsilon, callback))
    risk_sup = risk_argsup(risk)

    def argsup(w, p):
        r, plane, a = risk_sup(w, p)
        return run.evaluated(w, r, a, plane), lam * regularizer.subgradient(w) + a

    B = LbfgsMatrix(memory)
    if state is None:
        w = np.array(w0, dtype=np.float64)
        objective, g = argsup(w, -regularizer.subgradient(w))
        stalled = run.record(objective) or run.checkpointed(checkpoint, B, w=w, g=g, objective=objective)
    else:
        w, g, objective = run.restore(state, B, "w", "g", "objective")
        stalled = False
    while not stalled and run.iteration < max_iter:
        p, _ = descent_direction(g, lambda q: argsup(w, q)[1], B, tolerance, k_max)
        if p is None:
            stalled = True
            break
        with open_line(risk, w, p) as line:
            point, _ = search_line(line, regularizer, lam, w, p)
        run.account(line.seconds)
        if point.eta <= 0 or not point.value < objective:
            stalled = True
            break
        w_next = w + point.eta * p
        objective, g_next = argsup(w_next, p)  # the argsup along p: s^T y > 0 (Sec. 3.3)
        B.update(w_next - w, g_next - g)
        w, g = w_next, g_next
        if run.record(objective) or run.checkpointed(checkpoint, B, w=w, g=g, objective=objective):
            break
    if run.bound.stale:
        run.recorder.raise_lower_bound(run.bound.lower_bound())
    return run.result(w, stalled)


# --------------------------------------------------------------------------
# OWL-QN and OWL-QN*
# --------------------------------------------------------------------------

def pseudo_gradient(a, w, lam):
    """Andrew and Gao's pseudo-gradient of ``lam ||w||_1 + R_emp`` from the risk gradient `a` (their eq. 4)."""
    at_zero = np.where(a + lam < 0, a + lam, np.where(a - lam > 0, a - lam, 0.0))
    return np.where(w != 0, a + lam * np.sign(w), at_zero)


def _minimize_owlqn(risk, w0, lam, regularizer, star, epsilon, rel_epsilon, max_iter, idle_age, memory,
                    tolerance, k_max, max_planes, callback, state, checkpoint, c1=1e-4, max_backtracks=50):
    if regularizer.name != "l1":
        raise UsageError(f"OWL-QN minimizes L1-regularized risks: it needs --reg l1, not {regularizer.name!r}")
    _check_options(memory, tolerance, k_max, max_planes)
    run = _Run(risk, lam, regularizer, CuttingPlaneBound(len(w0), regularizer, lam, max_planes=max_planes,
                                                         idle_age=idle_age), Recorder(epsilon, rel_epsilon, callback))
    B = LbfgsMatrix(memory)
    if state is None:
        w = np.array(w0, dtype=np.float64)
        r, a = risk(w)
        objective = run.evaluated(w, r, a)
        stalled = run.record(objective) or run.checkpointed(checkpoint, B, w=w, a=a, objective=objective)
    else:
        w, a, objective = run.restore(state, B, "w", "a", "objective")
        stalled = False
    while not stalled and run.iteration < max_iter:
        pg = pseudo_gradient(a, w, lam)
        if star:  # R_emp is smooth: the argsup of J is a plus the L1 part's (no risk evaluation)
            p, _ = descent_direction(pg, lambda q: a + lam * regularizer_argsup(regularizer, w, q), B,
                                     tolerance, k_max)
        else:
            p = -B.dot(pg)
            p = np.where(p * pg < 0, p, 0.0)  # keep the components that descend along -pg
        slope = float(p @ (a + lam * regularizer_argsup(regularizer, w, p))) if p is not None else 0.0
        if p is None or not slope < 0:
            stalled = True
            break
        orthant = np.where(w != 0, np.sign(w), np.sign(p))
        step, accepted = 1.0 / max(1.0, float(np.linalg.norm(p))) if not B.pairs else 1.0, False
        for _ in range(max_backtracks):
            w_next = w + step * p
            w_next = np.where(np.sign(w_next) == orthant, w_next, 0.0)  # stay in the orthant
            r_next, a_next = risk(w_next)
            objective_next = run.evaluated(w_next, r_next, a_next)
            if objective_next <= objective + c1 * step * slope:
                accepted = True
                break
            step *= 0.5
        if not accepted:
            stalled = True
            break
        B.update(w_next - w, a_next - a)  # the smooth part's curvature
        w, a, objective = w_next, a_next, objective_next
        if run.record(objective) or run.checkpointed(checkpoint, B, w=w, a=a, objective=objective):
            break
    if run.bound.stale:
        run.recorder.raise_lower_bound(run.bound.lower_bound())
    return run.result(w, stalled)


def minimize_owlqn(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000, idle_age=10,
                   memory=15, max_planes=50, callback=None, state=None, checkpoint=None):
    """Minimize ``lam ||w||_1 + R_emp(w)`` (smooth R_emp) with OWL-QN (Andrew and Gao, 2007), certifying the gap.

    Each iteration takes the pseudo-gradient, the LBFGS direction ``-B pg``
    with the components that disagree in sign with ``-pg`` set to 0, and
    backtracks (halving, Armijo with c1 = 1e-4 on the directional
    derivative) along it, each trial point projected onto the orthant of
    w (zero coordinates: the sign of the direction). The bound is the L1
    LP of :class:`prbmrm.regularizers.L1` over the planes of every
    evaluation.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), gradient)``.
    w0 : ndarray
    lam : float
    regularizer : prbmrm.regularizers.L1
    epsilon, rel_epsilon, max_iter, idle_age, callback, state, checkpoint
        As for :func:`minimize_sublbfgs`.
    memory : int
        LBFGS buffer size (15).
    max_planes : int
        Most planes the bound keeps (50; 0: no limit).

    Returns
    -------
    Result
    """
    return _minimize_owlqn(risk, w0, lam, regularizer, False, epsilon, rel_epsilon, max_iter, idle_age, memory,
                           1e-5, 1, max_planes, callback, state, checkpoint)


def minimize_owlqn_star(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                        idle_age=10, memory=15, tolerance=1e-5, k_max=100, max_planes=50, callback=None,
                        state=None, checkpoint=None):
    """OWL-QN* (paper 003, Sec. 8.4): OWL-QN with the direction of :func:`descent_direction`.

    The direction-finding loop starts at the pseudo-gradient and asks the
    argsup oracle of J, here ``a + lam u`` with ``u_i = sign(w_i)``, or
    ``sign(p_i)`` where ``w_i = 0`` (R_emp smooth, so no extra pass);
    the line search is OWL-QN's. Parameters as for :func:`minimize_owlqn`
    and ``tolerance``, ``k_max`` as for :func:`minimize_sublbfgs`.

    Returns
    -------
    Result
    """
    return _minimize_owlqn(risk, w0, lam, regularizer, True, epsilon, rel_epsilon, max_iter, idle_age, memory,
                           tolerance, k_max, max_planes, callback, state, checkpoint)
