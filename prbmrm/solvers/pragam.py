"""Pragam, the primal-adjoint gap minimizer for the binary hinge SVM (paper 001, Alg. 1).

Nesterov's excessive gap technique applied to ``J(w) = lam ||w||^2 / 2 + R_emp(w)`` with the
hinge loss and to its adjoint D (:mod:`prbmrm.solvers.dual`), which has an L-Lipschitz gradient. With
``tau_k = 2 / (k + 3)``, ``mu_0 = 2 L`` and ``alpha_{-1} = 0``, iteration k is

    alpha_mu(w_k) = Proj((1 - y * X w_k) / mu_k)                   (eq. 23)
    beta_k        = (1 - tau_k) alpha_k + tau_k alpha_mu(w_k)
    w_{k+1}       = (1 - tau_k) w_k + tau_k w(beta_k)               (eq. 24)
    alpha_{k+1}   = Proj(beta_k + grad D(beta_k) / L),  grad D(beta) = 1 - y * X w(beta)   (eq. 25)
    mu_{k+1}      = (1 - tau_k) mu_k

and ``J(w_k) - D(alpha_k) <= mu_k / (2 n) = 2 L / (n (k+1) (k+2))`` (eq. 26): O(1/k^2).
Proj is onto the dual's feasible set (:class:`prbmrm.solvers.dual.DistributedProjection`).

Pragam needs the examples themselves, not only ``risk(w)``: every rank keeps the dual variables
of its own examples. The solver therefore takes the :class:`prbmrm.distributed.oracle.DistributedRisk` as
`risk` and attaches a service to it (:meth:`prbmrm.distributed.oracle.DistributedRisk.attach`); each
iteration is one request that every rank runs: two passes over the local data (``X^T`` of two
vectors, X times two vectors), one reproducible Allreduce of 2 d + 2 values and two
projections.

Imports: numpy; of prbmrm: :mod:`prbmrm.solvers.dual`, :mod:`prbmrm.errors`, :mod:`prbmrm.distributed.oracle`,
:mod:`prbmrm.solvers.base`.
"""

import time
from dataclasses import dataclass

import numpy as np

from .dual import SVMDual
from ..errors import InputError, UsageError
from ..distributed.oracle import service
from .base import Progress, Recorder

_START, _STEP = 0, 1


@dataclass
class _Step:
    """What one iteration reports to rank 0: J at (w_k, b_k), D(alpha_k), the model and timings."""

    objective: float
    lower_bound: float
    model: np.ndarray
    seconds_data: float
    seconds_projection: float


@service("pragam")
class PragamRanks:
    """The part of Pragam that runs on every rank: Algorithm 1's state and steps.

    Built on every rank by ``risk.attach(PragamRanks, lam, offset, lipschitz)``;
    ``handle(code)`` runs the start (code 0: L and the first point) or one
    iteration (code 1). Rank 0 reads the results.

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
    lam : float
    offset : bool
        Treat the last coordinate as the unregularized offset b (Pragam-b).
    lipschitz : float or None
        L; None estimates it (:meth:`prbmrm.solvers.dual.SVMDual.lipschitz`).

    Attributes
    ----------
    dual : prbmrm.solvers.dual.SVMDual
    L : float
        The Lipschitz constant used (after the start).
    """

    def __init__(self, risk, lam, offset, lipschitz):
        self.dual = SVMDual(risk, lam, offset)
        self.offset = offset
        self.L = lipschitz

    def handle(self, code):
        """Run the step `code` (0: start, 1: one iteration) on this rank; return its report."""
        return self._start() if code == _START else self._step()

    def _start(self):
        dual = self.dual
        if self.L is None:
            self.L = dual.lipschitz()
        # alpha_{-1} = 0 gives w_0 = w(0) = 0 and grad D(0) = 1, so alpha_0 = Proj(1 / L).
        self.w = np.zeros(dual.dim)
        self.z = np.zeros(len(dual.y))
        self.alpha, self.nu = dual.project(np.full(len(dual.y), 1.0 / self.L))
        self.mu = 2.0 * self.L
        self.k = 0
        self.b = 0.0
        return self.L

    def _step(self):
        dual, y, lam = self.dual, self.dual.y, self.dual.lam
        tau = 2.0 / (self.k + 3)
        data = dual.data_seconds
        started = time.perf_counter()
        # The equality's multiplier in eq. 23 is the offset that minimizes the smoothed J(w_k, .).
        smooth, nu = dual.project((1.0 - y * self.z) / self.mu, guess=self.b / self.mu)
        projection = time.perf_counter() - started
        b = self.mu * nu
        beta = (1.0 - tau) * self.alpha + tau * smooth
        hinge = dual.block_sums(np.maximum(0.0, 1.0 - y * (self.z + b)))
        (x_beta, x_alpha), (hinge_sum, alpha_sum) = dual.adjoint(
            [y * beta, y * self.alpha], [hinge, dual.block_sums(self.alpha)])
        w_beta, w_alpha = dual.weights(x_beta), dual.weights(x_alpha)
        objective = 0.5 * lam * float(self.w @ self.w) + hinge_sum / dual.n
        lower_bound = alpha_sum - 0.5 * lam * float(w_alpha @ w_alpha)
        model = self.w.copy()
        if self.offset:
            model[-1] = b
        self.w = (1.0 - tau) * self.w + tau * w_beta
        gradient_step = beta + (1.0 - y * dual.scores(w_beta)) / self.L
        self.z = dual.scores(self.w)
        started = time.perf_counter()
        self.alpha, self.nu = dual.project(gradient_step, guess=self.nu)
        projection += time.perf_counter() - started
        self.mu *= 1.0 - tau
        self.k += 1
        self.b = b
        return _Step(objective, lower_bound, model, dual.data_seconds - data, projection)


def minimize_pragam(risk, w0, lam, regularizer, *, offset=False, epsilon=0.0, rel_epsilon=1e-3,
                    max_iter=10000, idle_age=None, callback=None, lipschitz=None):
    """Minimize the L2-regularized hinge risk with Pragam (paper 001, Alg. 1).

    Every iteration reports J at the current primal iterate, the best J so
    far, the lower bound ``max_k D(alpha_k)`` (a dual value at a feasible
    point, hence certified by weak duality) and the gap between the two.

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
        The hinge risk oracle on rank 0; Pragam uses its data blocks and
        communicator (the other ranks serve it, as for BMRM).
    w0 : ndarray
        Only its length is used: Pragam starts from the dual point 0 (w = 0).
    lam : float
        Regularization constant, > 0.
    regularizer : object
        Must be the L2 regularizer ``||w||^2 / 2``.
    offset : bool
        Pragam-b: the last coordinate (the constant feature of ``--bias``) is
        an unregularized offset b, which adds the equality
        ``sum_i y_i alpha_i = 0`` to the dual; J then leaves b out of the
        regularizer, and the returned ``w[-1]`` is b.
    epsilon, rel_epsilon : float
        Stop when the gap is at most `epsilon`, or at most `rel_epsilon`
        times the best objective (0 disables either).
    max_iter : int
        Stop after this many iterations.
    idle_age : None
        Accepted for a signature common to all solvers; Pragam keeps no bundle.
    callback : callable, optional
        Called with a :class:`Progress` per iteration (``planes`` is 0);
        raising StopIteration stops the solver.
    lipschitz : float, optional
        The Lipschitz constant L of grad D (``sigma_max(X)^2 / lam``); by
        default estimated by power iterations
        (:meth:`prbmrm.solvers.dual.SVMDual.lipschitz`).

    Returns
    -------
    Result
        ``w`` is the iterate of least J, ``w_last`` the last one evaluated.

    Raises
    ------
    UsageError
        If the risk is not the hinge loss of a DistributedRisk, the
        regularizer is not L2, or (with `offset`) the last feature is not the
        constant 1.
    """
    name = "pragam_b" if offset else "pragam"
    if not hasattr(risk, "attach") or getattr(risk.loss, "name", None) != "hinge":
        raise UsageError(f"solver {name!r} solves the hinge loss's dual: it needs the hinge "
                         "loss's DistributedRisk (its data), not another loss or a plain function")
    if getattr(regularizer, "name", None) != "l2":
        raise UsageError(f"solver {name!r} needs the l2 regularizer")
    if len(w0) != risk.dim:
        raise UsageError(f"w0 has length {len(w0)}, the data {risk.dim}")
    ranks = risk.attach(PragamRanks, lam, offset, lipschitz)
    if ranks.dual.problem is not None:
        raise UsageError(f"solver {name!r}: {ranks.dual.problem}")
    risk.request(_START)
    recorder = Recorder(epsilon, rel_epsilon, callback)
    best_objective, best_w, lower_bound = np.inf, None, -np.inf
    for t in range(1, max_iter + 1):
        started = time.perf_counter()
        step = risk.request(_STEP)
        if not (np.isfinite(step.objective) and np.isfinite(step.lower_bound)):
            raise InputError(f"the objective or its dual is not finite at iteration {t}")
        if step.objective < best_objective:
            best_objective, best_w = step.objective, step.model
        lower_bound = max(lower_bound, step.lower_bound)
        seconds = time.perf_counter() - started
        row = Progress(t, step.objective, best_objective, lower_bound, best_objective - lower_bound, 0,
                       step.seconds_data, step.seconds_projection,
                       seconds - step.seconds_data - step.seconds_projection,
                       time.perf_counter() - recorder.started)
        if recorder.record(row):
            break
    return recorder.result(best_w, best_objective, step.model)


def minimize_pragam_b(risk, w0, lam, regularizer, **options):
    """Pragam-b: :func:`minimize_pragam` with ``offset=True`` (needs ``--bias``).

    Minimizes ``lam ||w||^2 / 2 + (1/n) sum_i max(0, 1 - y_i (<x_i, w> + b))``
    over w and the unregularized offset b (paper 001, eq. 20), b being the
    weight of the constant last feature.
    """
    return minimize_pragam(risk, w0, lam, regularizer, offset=True, **options)
