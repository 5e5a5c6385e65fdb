"""L-BFGS on Nesterov-smoothed ROC-area and PRBEP risks (paper 004), reporting the true objective.

The risk oracle's loss must be one of :data:`prbmrm.losses.smoothing.SMOOTHED_LOSSES`
(``roc_area``, ``prbep``). For the run, rank 0's oracle evaluates the smoothed
loss instead (:attr:`prbmrm.distributed.oracle.DistributedRisk.loss` is swapped on rank 0
and restored at the end): the smoothed losses are evaluated on rank 0
alone, from the gathered scores (rank 0's message says so, also to ranks
whose loss, ``roc_area``, is spread over the ranks), while the other ranks
only form ``X w`` and ``X^T c``, so they need not know. One evaluation then gives, from the
same scores and the same messages, the smoothed ``(R_mu, grad R_mu)`` that
L-BFGS steps on and the nonsmooth ``R`` that every row reports as J.

Certified gap: ``R_mu <= R``, so the planes of ``R_mu`` are planes below R
and their :class:`~prbmrm.solvers.base.CuttingPlaneBound` (QP and eq. 15,
which for the smooth ``J_mu`` tends to min J_mu >= min J - mu D) bounds
min J. With ``mu D <= eps / 2`` (paper 004, App. A) the gap can reach eps:
``J(w) - min J_mu <= mu D + (J_mu(w) - min J_mu)``.

Choice of mu: ``mu = eps / (2 D)`` with D the prox-function's bound of the
loss (App. A; the main text's ``eps / D`` only makes the deviation at most
eps, and a certified gap of eps then needs an exact optimum). eps is
``max(epsilon, rel_epsilon * J)``; with ``rel_epsilon`` J is first J(w0),
which over-estimates min J: when L-BFGS has converged on J_mu without
certifying the gap, mu is lowered to match the best J found and L-BFGS
restarts from its last iterate (all planes are kept), until eps / 2 no
longer halves the deviation (status 4). A given ``mu`` is used as is.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.losses.smoothing`,
:mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.lbfgs`.
"""

import math

import numpy as np

from ..errors import UsageError
from ..losses.smoothing import SMOOTHED_LOSSES
from .base import CuttingPlaneBound, Recorder, check_finite
from .lbfgs import LbfgsRun, check_lbfgs_options, regularizer_gradient


def minimize_smooth_lbfgs(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000,
                          idle_age=10, mu=0.0, memory=10, bound_every=1, max_planes=50, callback=None):
    """Minimize ``J(w) = lam * Omega(w) + R(w)`` for R = ROC area or PRBEP by L-BFGS on its smoothing.

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
        The oracle of a loss in :data:`~prbmrm.losses.smoothing.SMOOTHED_LOSSES`
        (its :attr:`loss` is swapped for the smoothed one during the run).
    w0 : ndarray
    lam : float
    regularizer : object
        Differentiable everywhere (see :func:`~prbmrm.solvers.lbfgs.regularizer_gradient`).
    epsilon, rel_epsilon : float
        Stop when the gap of the true J is at most `epsilon`, or at most
        `rel_epsilon` times the best J; they also set mu (module docstring).
    max_iter : int
        Most iterations (rows); the first row is w0.
    idle_age, memory, bound_every, max_planes :
        As for :func:`~prbmrm.solvers.lbfgs.minimize_lbfgs`.
    mu : float
        The prox parameter; 0 (default) chooses it from the target accuracy.
    callback : callable, optional

    Returns
    -------
    Result
        ``fun``, the objectives and the gap are those of the true (nonsmooth) J.
    """
    exact = getattr(risk, "loss", None)
    if getattr(exact, "name", None) not in SMOOTHED_LOSSES:
        shown = getattr(exact, "name", "an oracle without a loss")
        raise UsageError(f"solver 'smooth_lbfgs' smooths the losses {', '.join(SMOOTHED_LOSSES)} "
                         f"(paper 004); got {shown!r}")
    if not (math.isfinite(mu) and mu >= 0):
        raise UsageError(f"solver parameter mu must be a finite number >= 0, got {mu:g}")
    if mu == 0 and epsilon == 0 and rel_epsilon == 0:
        raise UsageError("solver 'smooth_lbfgs' chooses mu from the target accuracy: give --epsilon "
                         "or --rel-epsilon, or mu (--solver-param mu=VALUE)")
    gradient = regularizer_gradient(regularizer)
    check_lbfgs_options(memory, bound_every, max_planes)
    smoothed = SMOOTHED_LOSSES[exact.name](mu=mu)
    w = np.array(w0, dtype=np.float64)
    bound = CuttingPlaneBound(len(w), regularizer, lam, max_planes=max_planes, idle_age=idle_age)

    def evaluate(point):
        r_mu, a = risk(point)
        check_finite(r_mu, a, run.iteration + 1)
        bound.add(point, r_mu, a)
        omega = lam * regularizer.value(point)
        return omega + smoothed.exact_risk, omega + r_mu, lam * gradient(point) + a

    run = LbfgsRun(risk, evaluate, bound, Recorder(epsilon, rel_epsilon, callback), max_iter=max_iter,
                   memory=memory, bound_every=bound_every)
    risk.loss = smoothed
    try:
        # With mu chosen from J, w0 is evaluated unsmoothed (mu = 0 is the nonsmooth loss) to learn J(w0).
        run.record(w)
        deviation = math.inf
        while run.recorder.status == 2 and run.iteration < max_iter:
            if mu == 0:
                wanted = 0.5 * max(epsilon, rel_epsilon * abs(run.best_objective))
                if not wanted < 0.5 * deviation:
                    break
                smoothed.max_deviation = deviation = wanted
                run.forget()
            w = run.minimize(w)
            if mu > 0:
                break
    finally:
        risk.loss = exact
    return run.result(w)
