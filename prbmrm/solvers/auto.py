"""The default solver (``--solver auto``): one picked from the problem's measured properties, and a hand-over
to BMRM when it stops making progress.

The pick, made on rank 0 from what every rank count sees alike (the loss, the regularizer, the model's
dimension d, the number of examples m and the density of the first canonical block, which rank 0 holds
on any number of ranks), so that 1, 2 or 3 ranks take the same path:

- a loss with a second derivative (logistic, squared hinge, least squares, Huber, ...):
  :func:`~prbmrm.solvers.tron.minimize_tron`, Newton's method, which needs a handful of data passes
  where the bundle methods need tens to hundreds (a9a, logistic, lam 1e-4: 7 against 58); its
  conjugate gradients' diagonal preconditioner takes columns of any scales (kddcup99's raw counts,
  whose root mean squares spread over 1.8e5: logistic, lam 1e-4, 27 rows and a quarter of the proximal
  method's CPU);
- the hinge loss with the l2 regularizer on at most :data:`DCD_NONZEROS` nonzeros and at least
  :data:`DCD_WEIGHTS` weights, or on indicator features (:func:`indicators`) of at most
  :data:`DCD_BOX_NONZEROS` nonzeros with a small dual box (:func:`box_scale` at most :data:`DCD_BOX`):
  :func:`~prbmrm.solvers.dcd.minimize_dcd`, LIBLINEAR's dual coordinate descent, whose passes cost the
  nonzeros of the examples not at a bound, where each iteration of the bundle methods does dense work of
  length d and solves a subproblem (email-like hashed text, 23,210 columns used of 2^20, a fold of 3,022
  rows, lam 1e-5: 0.09-0.29 CPU s against BMRM's 1.2 s; the 4,534 rows of the refit, 0.19-0.31 s where
  the proximal method took 330 iterations and 2.8 s); on narrow data its passes win where the box is
  small against the rows' scale (absolute gap 1e-4, CPU s: a9a at lam 1e-4, box scale 4.3, 101 passes
  in 0.10 s against the proximal method's 98 iterations in 0.26 s; at 1e-5, scale 43, 0.6 against 0.8;
  w8a at scale 2.3 and 23, 0.05 and 0.12 against 0.37 and 1.1), the proximal method's iterations where
  it is large (a9a at lam 1e-6, scale 426: 1.4 against 4.1; kddcup99's raw counts, scale above 10^5:
  100 passes leave a gap of 0.5) and on features of continuous values, whose margins rarely tie, so that
  the risk is nearly smooth and the proximal method needs few iterations (planted sets, values +-[1, 2]
  or Gaussian: 200,000 x 1,000 at scale 1.2, 20 iterations in 0.18 s against 30 passes in 0.5-0.7 s;
  20,000 x 50 dense at scale 25, 24 iterations in 0.06 s against 0.45 s; 30,000 x 2,000 at scale 16,
  0.46 against 0.57), where a9a's and w8a's 0/1 indicators tie and the proximal method needs 100
  iterations;
- the hinge loss otherwise, and any other loss, on data whose nonzeros outnumber the weights by at least
  :data:`PROXIMAL_RATIO`: the proximal bundle method (fewest iterations, its dense O(d) work per
  iteration small beside the data pass);
- otherwise (millions of weights over few nonzeros, e.g. hashed text): BMRM, whose work follows the
  planes' nonzeros.

The hand-over: the first solver runs under a watch that stops it once its gap has not shrunk by
:data:`STALL_FACTOR` over the last half of its iterations (from :data:`STALL_MIN_ITER` iterations on);
BMRM then goes on from the best point found. Both parts' bounds are certified lower bounds of the same
min J, so the gap of a row is the best objective of the whole run minus the best bound of the whole run.

Imports: numpy; of prbmrm: :mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.tron`; the other solvers
by name through :func:`prbmrm.solvers.get_solver`.
"""

import inspect

import numpy as np

from .base import _MESSAGES, HISTORY_COLUMNS, Progress, Result
from .tron import newton_ready

PROXIMAL_RATIO = 16
"""The proximal bundle method is picked when the data's nonzeros are at least this many times the weights."""

DCD_NONZEROS = 2**24
"""Dual coordinate descent, which gathers the data onto rank 0, is picked on at most this many nonzeros."""

DCD_WEIGHTS = 2**12
"""Dual coordinate descent is picked on at least this many weights."""

DCD_BOX = 50.0
"""Dual coordinate descent is picked on fewer weights where :func:`box_scale` is at most this ..."""

DCD_BOX_NONZEROS = 2**20
"""... on indicator features of at most this many nonzeros."""

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


def box_scale(risk, lam):
    """The dual box's size against the rows' scale: LIBLINEAR's ``C = 1 / (lam m)`` times the mean of
    ``||x_i||^2`` over the first canonical block's rows.

    Dual coordinate descent needs few passes where this is small, many where it is large (a9a: 101 passes
    at 4.3, 5,889 at 426).

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
    lam : float

    Returns
    -------
    float
        0 for an empty block.
    """
    X = _first_block(risk)
    if X is None or X.shape[0] == 0:
        return 0.0
    squares = float(X.multiply(X).sum()) if hasattr(X, "multiply") else float(np.sum(np.square(X)))
    return squares / X.shape[0] / (lam * risk.n_total)


def indicators(risk):
    """Whether every nonzero of the first canonical block is 1 (0/1 features; True for an empty block)."""
    X = _first_block(risk)
    if X is None:
        return True
    values = X.data if hasattr(X, "nnz") else np.asarray(X).ravel()
    return bool(np.all(values[values != 0] == 1.0))


def pick_solver(risk, regularizer, lam):
    """Return ``(name, why)``: the solver :func:`minimize_auto` starts with for `risk` and a quadratic `regularizer`.

    Parameters
    ----------
    risk : callable
        The risk oracle; a :class:`prbmrm.distributed.oracle.DistributedRisk` is
        measured (its loss, dimension, examples and first block's density and row norms).
    regularizer : object
    lam : float

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
        scale = box_scale(risk, lam)
        if scale <= DCD_BOX and nonzeros <= DCD_BOX_NONZEROS and indicators(risk):
            return "dcd", (f"the hinge loss with l2, about {nonzeros:.3g} nonzeros of 0/1 features and a dual box "
                           f"{scale:.3g} times the rows' scale: dual coordinate descent needs few passes")
    if nonzeros >= PROXIMAL_RATIO * risk.dim:
        return "proximal", (f"about {nonzeros:.3g} nonzeros for {risk.dim} weights: the proximal bundle "
                            "method's fewer iterations pay for its dense work")
    return "bmrm", (f"about {nonzeros:.3g} nonzeros for {risk.dim} weights: BMRM's work follows the planes' "
                    "nonzeros")


class _Watch:
    """The callback that stops a solver which has stalled (and passes each row on)."""

    def __init__(self, callback, max_iter):
        self.callback = callback
        self.gaps = []
        self.max_iter = max_iter
        self.stalled = False

    def __call__(self, row):
        if self.callback is not None:
            self.callback(row)
        self.gaps.append(row.gap)
        t = len(self.gaps)
        if t >= STALL_MIN_ITER and t < self.max_iter and row.gap > STALL_FACTOR * self.gaps[t // 2 - 1]:
            self.stalled = True
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
    to BMRM if it stalls.

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
        1: watch the first solver and hand over to BMRM when it stalls or
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
        bundle method). A `checkpoint` that writes nothing only stops the run
        (status 5) when it says so.

    Returns
    -------
    Result
        Its ``message`` names the solvers that ran (and where the second took over).
    """
    from . import get_solver

    name, why = (first, "named by the caller") if first else pick_solver(risk, regularizer, lam)
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
    watch = _Watch(callback, max_iter) if handover and name != "bmrm" else None
    result = get_solver(name)(risk, w0, lam, regularizer, epsilon=epsilon, rel_epsilon=rel_epsilon,
                              max_iter=max_iter, idle_age=idle_age, callback=watch or callback, **options)
    if getattr(callback, "interrupted", False):
        result.status, result.message = 5, _MESSAGES[5]
    if watch is None or not (watch.stalled or result.status == 4):
        result.message = f"{result.message} ({name}: {why})"
        return result
    stalled_at = result.nit
    continuation = _Continuation(result, epsilon, rel_epsilon, callback)
    second = get_solver("bmrm")(risk, result.w, lam, regularizer, epsilon=0.0, rel_epsilon=0.0,
                                max_iter=max_iter - stalled_at, idle_age=idle_age, callback=continuation,
                                checkpoint=options.get("checkpoint"), **limits)
    history = {column: np.concatenate([result.history[column],
                                       [getattr(row, column) for row in continuation.rows]])
               for column in HISTORY_COLUMNS}
    best_w = second.w if second.fun < result.fun else result.w
    status = continuation.reached if continuation.reached is not None else second.status
    joined = Result(w=best_w, fun=continuation.best, lower_bound=continuation.bound,
                    gap=continuation.best - continuation.bound, nit=len(history["iteration"]), status=status,
                    message="", w_last=second.w_last, history=history)
    joined.message = f"{_MESSAGES[status]} ({name}: {why}; it stalled at iteration {stalled_at}, then bmrm)"
    return joined
