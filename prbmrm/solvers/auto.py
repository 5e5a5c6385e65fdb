"""The default solver (``--solver auto``): one picked from the problem's measured properties, a probe of dual
coordinate descent's first certificate on narrow data, and a hand-over (to TRON or BMRM) when a solver stops
making progress.

The pick, made on rank 0 from what every rank count sees alike (the loss, the regularizer, the model's
dimension d, the number of examples m and the first canonical block's density and rows, which rank 0
holds on any number of ranks), so that 1, 2 or 3 ranks take the same path:

- a loss with a second derivative (logistic, squared hinge, least squares, Huber, ...):
  :func:`~prbmrm.solvers.tron.minimize_tron`, Newton's method, which needs a handful of data passes
  where the bundle methods need tens to hundreds (a9a, logistic, lam 1e-4: 7 against 58); its
  conjugate gradients' diagonal preconditioner takes columns of any scales (kddcup99's raw counts,
  whose root mean squares spread over 1.8e5: logistic, lam 1e-4, 27 rows and a quarter of the proximal
  method's CPU);
- the hinge loss with the l2 regularizer on at most :data:`DCD_NONZEROS` nonzeros and at least
  :data:`DCD_WEIGHTS` weights: :func:`~prbmrm.solvers.dcd.minimize_dcd`, LIBLINEAR's dual coordinate
  descent, whose passes cost the nonzeros of the examples not at a bound, where each iteration of the
  bundle methods does dense work of length d and solves a subproblem (email-like hashed text, 23,210
  columns used of 2^20, a fold of 3,022 rows, lam 1e-5: 0.09-0.29 CPU s against BMRM's 1.2 s; the 4,534
  rows of the refit, 0.19-0.31 s where the proximal method took 330 iterations and 2.8 s);
- the hinge loss with l2 on fewer weights, at most :data:`DCD_COMMON_NONZEROS` nonzeros, whose rows have
  a large common part (:func:`common_share`, the share of their second moment along their mean, at
  least :data:`DCD_COMMON`): dual coordinate descent, probed (below). The proximal method's iterations
  follow the common part, dual coordinate descent's passes do not (absolute gap 1e-4, iterations or
  passes: planted 0/1 rows, 50,000 x 500, 15 ones a row, columns drawn alike, share 0.03: the proximal
  method 27 and 61 iterations at lam 1e-4 and 1e-5 against dcd's 64 and 470 passes, 0.08 and 0.17 CPU s
  against 0.18 and 0.9; the same rows with the columns drawn with probabilities 1 / j, share 0.21: 81 and
  156 iterations against 62 and 383 passes, 0.29 and 0.59 s against 0.17 and 0.60 s; a9a, share 0.45,
  98 and 230 iterations against 101 and 641 passes, 0.26-0.49 and 0.8-1.0 s against 0.10-0.19 and
  0.6-0.8 s; a9a's values times a random factor in [1, 2], 137 and 301 iterations: the values' being
  0/1 does not matter). The planted sets of values +-[1, 2] or Gaussian, whose rows have mean 0, go to
  the proximal method, which needs few iterations there (200,000 x 1,000: 20-44 iterations in 0.2-0.3
  s at lam 1e-4 to 1e-6 against dcd's 0.8-18 s);
- the hinge loss otherwise, and any other loss, on data whose nonzeros outnumber the weights by at least
  :data:`PROXIMAL_RATIO`: the proximal bundle method (fewest iterations, its dense O(d) work per
  iteration small beside the data pass);
- otherwise (millions of weights over few nonzeros, e.g. hashed text): BMRM, whose work follows the
  planes' nonzeros.

The probe: dual coordinate descent picked on narrow data goes on past its first certificate (one pass from
alpha = 0) only if that certificate's bound is at least ``1 / DCD_BOX`` of its objective; otherwise the
proximal method starts from w0. The first pass's bound measures what LIBLINEAR's box ``C = 1 / (lam m)``
against the rows' squared norms predicts, dcd's passes, where the rows' norms are alike (a9a: the bound
1.2 / (C mean ||x_i||^2) of the objective at lam 1e-4, 1e-5 and 1e-6, 0.28, 0.028 and 0.003, dcd's
passes 101, 641 and 5,889), and also where they are not (w8a, 8% of its rows empty and norms of
coefficient of variation 1: 0.83, 0.61 and 0.56 at lam 1e-4, 1e-5 and 1e-6, whose mean box of 234 times
the rows' scale at 1e-6 would predict thousands of passes, where dcd needs 945 in 1.0 CPU s against the
proximal method's 1,116 iterations in 6.5 s and BMRM's 2.5 s). It costs one pass and one certificate
(a9a at lam 1e-6: 0.04 s of the proximal method's 1.6-2.2). The proximal method starts afresh rather
than from the pass's point, which set it on a longer path (423 iterations against 377).

The hand-over: the first solver runs under a watch that stops it once its gap has not shrunk by
:data:`STALL_FACTOR` over the last half of its iterations (from :data:`STALL_MIN_ITER` iterations on);
the :func:`successor` then goes on from the best point found: TRON with the Hessian as a matrix for the
hinge on at most :data:`~prbmrm.solvers.tron.MATRIX_DIM` weights, else BMRM. The bounds of both parts (and
the probe's) are certified lower bounds of the same min J, so the gap of a row is the best objective of the
whole run minus the best bound of the whole run.

Imports: numpy; of prbmrm: :mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.tron`; the other solvers
by name through :func:`prbmrm.solvers.get_solver`.
"""

import inspect

import numpy as np

from .base import _MESSAGES, HISTORY_COLUMNS, Progress, Result
from .tron import MATRIX_DIM, SMOOTHED, matrix_fits, newton_ready

PROXIMAL_RATIO = 16
"""The proximal bundle method is picked when the data's nonzeros are at least this many times the weights."""

DCD_NONZEROS = 2**24
"""Dual coordinate descent, which gathers the data onto rank 0, is picked on at most this many nonzeros."""

DCD_WEIGHTS = 2**12
"""Dual coordinate descent is picked on at least this many weights."""

DCD_COMMON = 0.06
"""Dual coordinate descent is picked on fewer weights where :func:`common_share` is at least this (between
planted 0/1 rows of columns drawn alike, 0.03, and w8a, 0.12) ..."""

DCD_COMMON_NONZEROS = 2**20
"""... on at most this many nonzeros ..."""

DCD_BOX = 50.0
"""... and goes on past its first certificate where that certificate's bound is at least ``1 / DCD_BOX`` of its
objective (the box at most DCD_BOX times the rows' scale, measured); the proximal bundle method takes over
otherwise."""

STALL_MIN_ITER = 200
"""The watch lets a solver run at least this many iterations before it may hand over."""

STALL_FACTOR = 0.5
"""A solver stalls when its gap at iteration t is above this fraction of its gap at iteration t / 2."""


def _first_block(risk):
    """The matrix of the first canonical block of `risk`'s data (rank 0 holds it on any number of ranks), or
    None."""
    X = risk.blocks[0][0] if len(risk.blocks) else None
    return X if hasattr(X, "shape") else None


def density(risk):
    """Nonzeros per row of the first canonical block of `risk`'s data."""
    X = _first_block(risk)
    if X is None or X.shape[0] == 0:
        return 0.0
    nonzeros = X.nnz if hasattr(X, "nnz") else np.count_nonzero(X)
    return nonzeros / X.shape[0]


def common_share(risk):
    """The share of the rows' second moment along their mean: ``||mean_i x_i||^2 / mean_i ||x_i||^2`` over the
    first canonical block's rows.

    0 for rows of zero mean (the planted sets of values +-[1, 2] or Gaussian), ``k / d`` for 0/1 rows of k
    ones in d columns drawn alike (planted 0/1 rows: 0.03), more where some columns are in most rows (w8a:
    0.12; a9a, whose categories one-hot encoded have a common value each: 0.45).

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk

    Returns
    -------
    float
        0 for an empty block or rows of zeros.
    """
    X = _first_block(risk)
    if X is None or X.shape[0] == 0:
        return 0.0
    squares = float(X.multiply(X).sum()) if hasattr(X, "multiply") else float(np.sum(np.square(X)))
    mean = np.asarray(X.sum(axis=0)).ravel() / X.shape[0]
    return float(mean @ mean) / (squares / X.shape[0]) if squares > 0.0 else 0.0


def pick_solver(risk, regularizer):
    """Return ``(name, why)``: the solver :func:`minimize_auto` starts with for `risk` and a quadratic `regularizer`.

    Parameters
    ----------
    risk : callable
        The risk oracle; a :class:`prbmrm.distributed.oracle.DistributedRisk` is
        measured (its loss, dimension, examples and first block's density and rows).
    regularizer : object

    Returns
    -------
    name : str
        ``"tron"``, ``"proximal"``, ``"dcd"`` or ``"bmrm"``.
    why : str
        The reason, for the run's report.
    """
    if not hasattr(risk, "blocks"):
        return "proximal", "fewest iterations on a risk of unknown data"
    if getattr(risk.loss, "structured", False):
        return "proximal", "fewest iterations on structured examples (no matrix of features to measure)"
    if newton_ready(risk, regularizer) is None and getattr(risk.loss, "twice_differentiable", False):
        return "tron", f"the loss {risk.loss.name!r} is twice differentiable: Newton's method"
    nonzeros = density(risk) * risk.n_total
    if risk.loss.name == "hinge" and getattr(regularizer, "name", None) == "l2" and nonzeros <= DCD_NONZEROS:
        if risk.dim >= DCD_WEIGHTS:
            return "dcd", (f"the hinge loss with l2, {risk.dim} weights and about {nonzeros:.3g} nonzeros: dual "
                           "coordinate descent's passes need no dense work of length d and no subproblem")
        common = common_share(risk)
        if common >= DCD_COMMON and nonzeros <= DCD_COMMON_NONZEROS:
            return "dcd", (f"the hinge loss with l2, about {nonzeros:.3g} nonzeros of rows {common:.2g} of whose "
                           "second moment lies along their mean: dual coordinate descent, the proximal method "
                           "if its first certificate shows a large box")
    if nonzeros >= PROXIMAL_RATIO * risk.dim:
        return "proximal", (f"about {nonzeros:.3g} nonzeros for {risk.dim} weights: the proximal bundle "
                            "method's fewer iterations pay for its dense work")
    return "bmrm", (f"about {nonzeros:.3g} nonzeros for {risk.dim} weights: BMRM's work follows the planes' "
                    "nonzeros")


def successor(risk, regularizer):
    """The solver that goes on after a stall: TRON on the hinge's smoothing where it forms the Hessian as a matrix
    (d at most :data:`~prbmrm.solvers.tron.MATRIX_DIM`: kddcup99's raw counts, lam 1e-6, where the proximal
    method stalls at iteration 200 and BMRM after it is at a gap of 0.0176 at iteration 10,000, TRON from the
    stalled point certifies 1e-4), else BMRM."""
    loss = getattr(risk, "loss", None)
    if (getattr(loss, "name", None) in SMOOTHED and newton_ready(risk, regularizer) is None
            and matrix_fits(risk, MATRIX_DIM)):
        return "tron"
    return "bmrm"


def large_box(lower_bound, objective):
    """Whether dual coordinate descent's first certificate (its `lower_bound` and `objective`) shows a box too
    large for its passes: the bound below ``1 / DCD_BOX`` of the objective."""
    return lower_bound < objective / DCD_BOX


class _Watch:
    """The callback that stops a solver which has stalled, or dual coordinate descent whose first certificate
    shows a large box (with `probe`), and passes each row on.

    After a stop, ``handover`` names the solver to go on with (`successor` after a stall, "proximal" after the
    probe); None otherwise.
    """

    def __init__(self, callback, max_iter, probe=False, successor="bmrm"):
        self.callback = callback
        self.gaps = []
        self.max_iter = max_iter
        self.probe = probe
        self.successor = successor
        self.handover = None

    def __call__(self, row):
        if self.callback is not None:
            self.callback(row)
        self.gaps.append(row.gap)
        t = len(self.gaps)
        if self.probe and t == 1 and t < self.max_iter and large_box(row.lower_bound, row.best_objective):
            self.handover = "proximal"
            raise StopIteration
        if t >= STALL_MIN_ITER and t < self.max_iter and row.gap > STALL_FACTOR * self.gaps[t // 2 - 1]:
            self.handover = self.successor
            raise StopIteration


def _interruptible(callback, checkpoint):
    """`callback`, then a stop (StopIteration) when `checkpoint`, which writes nothing, says the run must end."""
    def interruptible(row):
        if callback is not None:
            callback(row)
        if checkpoint(row.iteration, dict):
            interruptible.interrupted = True
            raise StopIteration
    interruptible.interrupted = False
    return interruptible


def runs_alone(state, checkpoint):
    """Whether :func:`minimize_auto` with these keywords runs its pick alone, without hand-over: when it
    resumes or writes checkpoints (the checkpoint then holds that one solver's state)."""
    return state is not None or getattr(checkpoint, "path", None) is not None


class _Continuation:
    """The callback of the second solver: its rows renumbered after the first's, bounds and objectives the
    run's best, and its stop when the run's gap is reached."""

    def __init__(self, first, epsilon, rel_epsilon, callback):
        self.offset = first.nit
        self.seconds = first.history["seconds_total"][-1] if first.nit else 0.0
        self.best = first.fun
        self.bound = first.lower_bound
        self.epsilon, self.rel_epsilon = epsilon, rel_epsilon
        self.callback = callback
        self.rows = []
        self.reached = None

    def __call__(self, row):
        self.best = min(self.best, row.best_objective)
        self.bound = max(self.bound, row.lower_bound)
        gap = self.best - self.bound
        joined = Progress(self.offset + row.iteration, row.objective, self.best, self.bound, gap, row.planes,
                          row.seconds_risk, row.seconds_subproblem, row.seconds_comm,
                          self.seconds + row.seconds_total)
        self.rows.append(joined)
        if self.callback is not None:
            self.callback(joined)
        if gap <= self.epsilon:
            self.reached = 0
        elif gap <= self.rel_epsilon * abs(self.best):
            self.reached = 1
        if self.reached is not None:
            raise StopIteration


def minimize_auto(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000, idle_age=10,
                  bundle_size=0, bundle_memory=0, callback=None, first="", handover=1, state=None, checkpoint=None,
                  dual=None):
    """Minimize ``J(w) = lam * Omega(w) + R_emp(w)`` with the solver :func:`pick_solver` names, handing over
    to the :func:`successor` (TRON or BMRM) if it stalls.

    Parameters
    ----------
    risk : callable
        The risk oracle (a :class:`prbmrm.distributed.oracle.DistributedRisk` for TRON and the measured pick).
    w0 : ndarray
    lam : float
    regularizer : object
    epsilon, rel_epsilon, max_iter, idle_age, callback
        As for every solver; `max_iter` counts the iterations of both parts.
    bundle_size, bundle_memory
        The limits of the planes kept, for the solvers that keep them (as
        for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`; TRON keeps none).
    first : str
        The solver to start with ("" : :func:`pick_solver`'s choice).
    handover : int
        1: watch the first solver and hand over to the :func:`successor` when it stalls or
        stops making progress (status 4); 0: never.
    dual : ndarray, optional
        A start for dual coordinate descent (:func:`~prbmrm.solvers.dcd.minimize_dcd`'s `dual`), used
        if that is the pick.
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm`: a run that writes
        checkpoints (or resumes) runs its pick alone, without hand-over, so
        that the checkpoint holds that one solver's state and a resumed run
        continues it (every solver :func:`pick_solver` names keeps
        checkpoints; a `first` that keeps none gives way to the proximal
        bundle method). Dual coordinate descent picked on narrow data is
        probed first, by a run of one certificate, as the hand-over would
        (on resuming too, so that the solver is the checkpoint's). A
        `checkpoint` that writes nothing only stops the run (status 5) when
        it says so.

    Returns
    -------
    Result
        Its ``message`` names the solvers that ran (and where the second took over).
    """
    from . import get_solver

    name, why = (first, "named by the caller") if first else pick_solver(risk, regularizer)
    # Dual coordinate descent picked on narrow data is probed: its first certificate says how large the box is.
    probe = name == "dcd" and not first and risk.dim < DCD_WEIGHTS
    if probe and runs_alone(state, checkpoint) and max_iter > 1:
        # A run that checkpoints (or resumes) runs one solver alone: the probe, one certificate of its own,
        # picks it (alike when the run resumes, so the checkpoint's solver is the one picked).
        probed = get_solver("dcd")(risk, w0, lam, regularizer, epsilon=epsilon, rel_epsilon=rel_epsilon, max_iter=1)
        if large_box(probed.lower_bound, probed.fun):
            name, why = "proximal", f"{why}; its first certificate's bound below 1 / DCD_BOX of its objective"
    options, keeps = {}, "checkpoint" in inspect.signature(get_solver(name)).parameters
    if runs_alone(state, checkpoint):
        if not keeps:
            name, why = "proximal", f"{name} keeps no checkpoints"
        options, handover = {"state": state, "checkpoint": checkpoint}, 0
    elif checkpoint is not None:
        options = {"checkpoint": checkpoint} if keeps else {}
        callback = callback if keeps else _interruptible(callback, checkpoint)
    limits = {"bundle_size": bundle_size, "bundle_memory": bundle_memory}
    if "bundle_size" in inspect.signature(get_solver(name)).parameters:
        options.update(limits)
    if dual is not None and "dual" in inspect.signature(get_solver(name)).parameters:
        options["dual"] = dual
    after = successor(risk, regularizer)
    watch = _Watch(callback, max_iter, probe, after) if handover and name not in ("bmrm", after) else None
    result = get_solver(name)(risk, w0, lam, regularizer, epsilon=epsilon, rel_epsilon=rel_epsilon,
                              max_iter=max_iter, idle_age=idle_age, callback=watch or callback, **options)
    if getattr(callback, "interrupted", False):
        result.status, result.message = 5, _MESSAGES[5]
    if watch is not None and watch.handover is None and result.status == 4:
        watch.handover = after
    if watch is None or watch.handover is None:
        result.message = f"{result.message} ({name}: {why})"
        return result
    stalled_at = result.nit
    continuation = _Continuation(result, epsilon, rel_epsilon, callback)
    # BMRM goes on from the stalled solver's best point; the proximal method starts afresh from w0, as the probe's
    # one pass leaves a point far from the optimum (a9a, lam 1e-6: 423 iterations from it against 377 from 0).
    start = w0 if watch.handover == "proximal" else result.w
    then = get_solver(watch.handover)
    limits = {key: value for key, value in limits.items() if key in inspect.signature(then).parameters}
    second = then(risk, start, lam, regularizer, epsilon=0.0, rel_epsilon=0.0, max_iter=max_iter - stalled_at,
                  idle_age=idle_age, callback=continuation, checkpoint=options.get("checkpoint"), **limits)
    history = {column: np.concatenate([result.history[column],
                                       [getattr(row, column) for row in continuation.rows]])
               for column in HISTORY_COLUMNS}
    best_w = second.w if second.fun < result.fun else result.w
    status = continuation.reached if continuation.reached is not None else second.status
    joined = Result(w=best_w, fun=continuation.best, lower_bound=continuation.bound,
                    gap=continuation.best - continuation.bound, nit=len(history["iteration"]), status=status,
                    message="", w_last=second.w_last, history=history)
    said = ("its first certificate's bound below 1 / DCD_BOX of its objective" if watch.handover == "proximal"
            else f"it stalled at iteration {stalled_at}")
    joined.message = f"{_MESSAGES[status]} ({name}: {why}; {said}, then {watch.handover})"
    return joined
