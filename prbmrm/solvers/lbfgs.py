"""L-BFGS on the regularized risk through the risk oracle (paper 002, Sec. 4.2), with a certified gap.

scipy's L-BFGS-B (without bounds) minimizes ``J(w) = lam * Omega(w) + R_emp(w)``
from the oracle's ``(R_emp, a)`` and Omega's gradient. L-BFGS has no lower
bound of its own: every evaluated point also feeds a
:class:`~prbmrm.solvers.base.CuttingPlaneBound`, whose bound and the
best J give the same certified gap as BMRM's, and the run stops on it
(``epsilon`` / ``rel_epsilon``) through scipy's callback. On a nonsmooth loss
L-BFGS is a heuristic (it usually stops when its line search fails, status 4);
the gap then still says how far it got.

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.solvers.base`.
"""

import hashlib
import time
from collections import deque

import numpy as np
from scipy.optimize import minimize as scipy_minimize

from ..errors import UsageError
from .base import CuttingPlaneBound, Progress, Recorder, check_finite, snapshot

def regularizer_gradient(regularizer):
    """Return ``grad Omega`` of a regularizer differentiable everywhere; UsageError otherwise.

    A regularizer qualifies by its ``differentiable`` attribute; its
    ``subgradient(w)`` is then the gradient.
    """
    if not regularizer.differentiable:
        raise UsageError(f"the L-BFGS solvers need a regularizer differentiable everywhere "
                         f"(l2, quadratic or lp); {regularizer.name!r} is not (use --solver bmrm)")
    return regularizer.subgradient


def check_lbfgs_options(memory, bound_every, max_planes):
    """Raise UsageError for option values of the L-BFGS solvers no run can use."""
    if memory < 1:
        raise UsageError(f"solver parameter memory must be >= 1, got {memory}")
    if bound_every < 1:
        raise UsageError(f"solver parameter bound_every must be >= 1, got {bound_every}")
    if max_planes < 0 or max_planes == 1:
        raise UsageError(f"solver parameter max_planes must be 0 (no limit) or >= 2, got {max_planes}")


class LbfgsRun:
    """scipy's L-BFGS-B on a function from `evaluate`, one progress row per iteration.

    Parameters
    ----------
    risk : callable
        The oracle, only for its ``last_seconds`` timings.
    evaluate : callable
        ``evaluate(w) -> (objective, value, gradient)``: the true J(w) to
        report, and the value and gradient L-BFGS steps on (the same J, or a
        smoothed one). It feeds `bound` itself.
    bound : CuttingPlaneBound
    recorder : Recorder
    max_iter : int
        Most rows in all (across calls of :meth:`minimize`).
    memory : int
        L-BFGS's number of correction pairs (scipy's ``maxcor``).
    bound_every : int
        Solve the bound's QP every this many rows; :meth:`minimize` solves it
        at the end for the last row.
    checkpoint : callable, optional
        ``checkpoint(t, snapshot)`` after row t (see
        :func:`~prbmrm.solvers.bmrm.minimize_bmrm`); True stops with status 5.
        scipy keeps L-BFGS's memory and line search to itself, so the state
        also holds every evaluation (its value, gradient and a digest of its
        point): O(evaluations * dim) numbers.
    state : dict, optional
        A state of `checkpoint` to continue from: :meth:`minimize` then runs
        scipy from the first point again, answering its evaluations from the
        state (checking that scipy asks for the same points) without
        evaluating anything or recording rows, until the saved iteration; from
        there on it takes the uninterrupted run's path.

    Attributes
    ----------
    iteration : int
        Rows recorded so far.
    best_objective : float
    best_w : ndarray
    """

    def __init__(self, risk, evaluate, bound, recorder, *, max_iter, memory, bound_every, checkpoint=None,
                 state=None):
        self.risk = risk
        self.evaluate = evaluate
        self.bound = bound
        self.recorder = recorder
        self.max_iter = max_iter
        self.memory = memory
        self.bound_every = bound_every
        self.checkpoint = checkpoint
        self.iteration = 0
        self.best_objective = np.inf
        self.best_w = None
        self._point = None  # (w, objective, value, gradient) of the last evaluation
        self._seconds = {"risk": 0.0, "comm": 0.0}
        # (digest of w, objective, value, gradient) of every evaluation, kept for checkpoints
        self._evaluations = [] if checkpoint is not None or state is not None else None
        self._replay = deque()  # the evaluations of a resumed run still to hand to scipy
        self._skip = 0  # the rows of a resumed run scipy has yet to reach again
        if state is not None:
            self._restore(state)

    def _restore(self, state):
        self.recorder.restore(state)
        self.bound.restore(state)
        self.best_w, self.best_objective = state["best_w"], state["best_objective"]
        self.iteration = state["iteration"]
        saved = state["evaluations"]
        self._evaluations = [(int(digest), objective, value, gradient.copy()) for digest, objective, value, gradient
                             in zip(saved["digest"], saved["objective"], saved["value"], saved["gradient"])]
        self._replay.extend(self._evaluations)
        self._skip = self.iteration - 1  # the first row is not one of scipy's

    def _snapshot(self):
        digest, objective, value, gradient = (np.array(column) for column in zip(*self._evaluations))
        return snapshot(self.recorder, self.bound, best_w=self.best_w, best_objective=self.best_objective,
                        iteration=self.iteration, evaluations={"digest": digest, "objective": objective,
                                                              "value": value, "gradient": gradient})

    def forget(self):
        """Drop the remembered last evaluation (the function changed, e.g. its smoothing)."""
        self._point = None

    def fun(self, w):
        """Return ``(value, gradient)`` at `w` for scipy; the last point is evaluated only once."""
        if self._point is None or not np.array_equal(w, self._point[0]):
            if self._replay:
                saved, objective, value, gradient = self._replay.popleft()
                if saved != _digest(w):
                    raise UsageError("cannot resume: scipy's L-BFGS-B asks for other points than in the "
                                     "checkpointed run (another scipy version?)")
            else:
                objective, value, gradient = self.evaluate(w)
                seconds = getattr(self.risk, "last_seconds", {"risk": 0.0, "comm": 0.0})
                for key in self._seconds:
                    self._seconds[key] += seconds[key]
                if self._evaluations is not None:
                    self._evaluations.append((_digest(w), objective, value, gradient))
            self._point = (np.array(w, dtype=np.float64), objective, value, gradient)
        return self._point[2], self._point[3]

    def row(self, w):
        """:meth:`record` the iterate `w`, then offer the state to the checkpoint; return True to stop."""
        return self.record(w) or self.recorder.offer(self.checkpoint, self.iteration, self._snapshot)

    def record(self, w):
        """Append the row of the iterate `w` (evaluating it if needed); return True to stop."""
        self.fun(w)
        objective = self._point[1]
        self.iteration += 1
        if objective < self.best_objective:
            self.best_objective, self.best_w = objective, self._point[0]
        solved = self.bound.seconds
        # Not forced at max_iter: a checkpoint there must hold the state an uninterrupted run has.
        if self.iteration % self.bound_every == 0:
            lower_bound = self.bound.lower_bound()
        else:
            lower_bound = self.bound.value  # an older bound: still valid, maybe weaker
        row = Progress(self.iteration, objective, self.best_objective, lower_bound,
                       self.best_objective - lower_bound, self.bound.bundle.size, self._seconds["risk"],
                       self.bound.seconds - solved, self._seconds["comm"],
                       time.perf_counter() - self.recorder.started)
        self._seconds = {"risk": 0.0, "comm": 0.0}
        return self.recorder.record(row)

    def minimize(self, w):
        """Run L-BFGS-B from `w` until the recorder stops, max_iter, or no progress; return the last iterate.

        The bound is brought up to date at the end, so that the last row
        carries the bound of every plane seen.
        """
        last = [w]

        def callback(intermediate_result):
            last[0] = np.array(intermediate_result.x)  # scipy reuses its array
            if self._skip:  # a resumed run: the checkpoint holds this row
                self._skip -= 1
            elif self.row(last[0]):
                raise StopIteration

        remaining = self.max_iter - (self.iteration - self._skip)
        if remaining > 0:
            # ftol = gtol = 0: only the certified gap (callback), max_iter or a failed
            # line search end the run; scipy's own tests know nothing of the gap.
            scipy_minimize(self.fun, w, jac=True, method="L-BFGS-B", callback=callback,
                           options={"maxcor": self.memory, "maxiter": remaining, "maxfun": 50 * remaining,
                                    "ftol": 0.0, "gtol": 0.0})
        if self.bound.stale:
            self.recorder.raise_lower_bound(self.bound.lower_bound())
        return last[0]

    def result(self, w_last):
        """Return the Result: the best iterate, status 4 if L-BFGS stopped before any other rule."""
        if self.recorder.status == 2 and self.iteration < self.max_iter:
            self.recorder.status = 4
        return self.recorder.result(self.best_w, self.best_objective, w_last)


def _digest(w):
    """A 63-bit digest of the bytes of `w` (which point scipy asks for)."""
    return int.from_bytes(hashlib.sha256(np.ascontiguousarray(w, dtype=np.float64).tobytes()).digest()[:8],
                          "little") >> 1


def minimize_lbfgs(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                   idle_age=10, memory=10, bound_every=1, max_planes=50, callback=None, state=None,
                   checkpoint=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with L-BFGS (scipy's L-BFGS-B), certifying the gap.

    Every point L-BFGS evaluates (iterates and line-search trials) adds its
    plane to a :class:`~prbmrm.solvers.base.CuttingPlaneBound`; each row
    reports J at the iterate, the best J, the bound and their gap, and the
    run stops when the gap is at most `epsilon` or `rel_epsilon` times the
    best J. Meant for smooth losses (logistic, least squares, softmax,
    huber, ...); on nonsmooth ones it is a heuristic whose gap stays honest.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``.
    w0 : ndarray
    lam : float
    regularizer : object
        Differentiable everywhere (see :func:`regularizer_gradient`).
    epsilon, rel_epsilon : float
        Stop when the gap is at most `epsilon`, or at most `rel_epsilon`
        times the best objective (0 disables either).
    max_iter : int
        Most iterations (rows); the first row is w0.
    idle_age : int
        The bound's plane pruning (see CuttingPlaneBound).
    memory : int
        L-BFGS correction pairs (10).
    bound_every : int
        Solve the bound's QP every this many iterations and at the end (1);
        in between a row shows the last bound solved (still valid) or the
        eq. 15 bound of a newer plane if larger.
    max_planes : int
        Most planes the bound keeps (50; 0: no limit).
    callback : callable, optional
        Called with each :class:`Progress`; raising StopIteration stops.
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`; the state holds
        the bound's planes, the best point, the history and every evaluation
        (see :class:`LbfgsRun`).

    Returns
    -------
    Result
    """
    gradient = regularizer_gradient(regularizer)
    check_lbfgs_options(memory, bound_every, max_planes)
    w = np.array(w0, dtype=np.float64)
    bound = CuttingPlaneBound(len(w), regularizer, lam, max_planes=max_planes, idle_age=idle_age)

    def evaluate(point):
        r, a = risk(point)
        check_finite(r, a, run.iteration + 1)
        bound.add(point, r, a)
        objective = lam * regularizer.value(point) + r
        return objective, objective, lam * gradient(point) + a

    run = LbfgsRun(risk, evaluate, bound, Recorder(epsilon, rel_epsilon, callback), max_iter=max_iter,
                   memory=memory, bound_every=bound_every, checkpoint=checkpoint, state=state)
    if state is not None or not run.row(w):
        w = run.minimize(w)
    return run.result(w)
