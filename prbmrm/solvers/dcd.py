"""Dual coordinate descent for the L2-regularized hinge SVM (Hsieh et al. 2008; LIBLINEAR's ``-s 3``), its gap
certified by the dual value.

``J(w) = lam ||w||^2 / 2 + (1/n) sum_i max(0, 1 - y_i <x_i, w>)`` is ``lam`` times LIBLINEAR's primal
with ``C = 1 / (lam n)``, whose dual is

    D(alpha) = sum_i alpha_i - ||sum_i alpha_i y_i x_i||^2 / 2,   0 <= alpha_i <= C,

so ``lam D(alpha) <= min J`` for every alpha in the box (weak duality): a certified lower bound.
A pass visits the examples one at a time and maximizes D in each ``alpha_i`` exactly, keeping
``w = sum_i alpha_i y_i x_i`` up to date (:func:`prbmrm.kernels.sparse.hinge_dual_pass`), with
LIBLINEAR's shrinking: an example at a bound whose gradient points out of the box by more than the last
pass's extreme projected gradients is skipped until the active set is reset.

The passes are sequential, one example after the other, in a random order of all examples drawn anew
each pass from one generator seeded with `seed` (an order random only within the canonical blocks,
visited in turn, converged 8x slower on email-like text). Rank 0 therefore gathers every rank's rows in
canonical order and runs the passes and the certificates alone: 1, 2 or 3 ranks run the same
floating-point operations in the same order, bitwise the same run. The ranks gain no speed: this solver
is for problems of modest size (see :data:`prbmrm.solvers.auto.DCD_NONZEROS`), where LIBLINEAR's method
needs a fraction of the bundle methods' time at small lam.

An iteration (a row of the progress table) is a run of passes that ends in a certificate: after the first
pass, after a pass whose estimate of the gap may meet the gap sought (and fell below
:data:`PREDICTED_STEP` of its value at the last certificate), after one whose estimate fell below
:data:`ESTIMATE_STEP` of its value at the last certificate, or after :data:`CERTIFY_EVERY` passes. A
pass's estimate is the sum of the gap's terms ``C max(0, -G_i) + alpha_i G_i`` (``G_i = y_i <x_i, w> -
1``) of the rows it visits, each taken as it comes to the row, at no cost beyond the pass; scaled by the
last certificate's gap over its estimate (when that is below 1), it schedules the certificates, which
cost two products over all rows each (a9a, lam 1e-4: 6 certificates in 101 passes, where certifying
on LIBLINEAR's measure took 7 in 102). A certificate is J at the passes' w and ``lam D(alpha)``, with
``sum_i alpha_i y_i x_i`` computed afresh: the estimate never enters the bound.

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.distributed.oracle`,
:mod:`prbmrm.kernels.sparse`, :mod:`prbmrm.solvers.base`.
"""

import time

import numpy as np
import scipy.sparse as sp

from ..distributed.oracle import service
from ..errors import InputError, UsageError
from ..kernels.sparse import hinge_dual_pass
from .base import Progress, Recorder, snapshot

CERTIFY_EVERY = 32
"""Passes between certificates at most."""

ESTIMATE_STEP = 0.1
"""A certificate follows the pass whose gap estimate fell below this fraction of its value at the last
certificate (or below the gap sought)."""

PREDICTED_STEP = 0.9
"""A certificate predicted to succeed follows a pass whose gap estimate is at most this fraction of its value at
the last certificate."""

RESET_SPREAD = 0.1
"""A failed certificate resets a shrunk active set once the spread of projected gradients is below this
(LIBLINEAR's default stopping tolerance, where it does the same)."""

_PASS, _CERTIFY, _RESET = 0, 1, 2

_WORD = 2**64 - 1  # the generator's 128-bit integers are saved as two 64-bit words each


@service("dcd")
class DualDescentRanks:
    """The part of dual coordinate descent that runs on every rank: the gathering of the rows.

    Built on every rank by ``risk.attach(DualDescentRanks, lam, seed)``, which gathers every rank's rows
    and labels onto rank 0 in canonical order; ``handle(code)`` runs a pass (code 0), a certificate
    (code 1) or a reset of the active set (code 2) on rank 0 alone (the other ranks return None).

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
    lam : float
    seed : int
        Seeds the order of each pass.

    Attributes
    ----------
    alpha, w : ndarray
        The dual point and ``sum_i alpha_i y_i x_i`` as updated by the passes (rank 0 alone).
    problem : str or None
        Rank 0: why the data do not suit the dual (labels not -1/+1).
    """

    def __init__(self, risk, lam, seed):
        self.comm, self.lam = risk.comm, float(lam)
        self.upper = 1.0 / (self.lam * risk.n_total)
        X, y, _ = risk.rows
        # A copy only where the rows' column indices need sorting: the oracle's own rows stay as they are.
        local = sp.csr_matrix(X, dtype=np.float64)
        local = local if local.has_sorted_indices else local.sorted_indices()
        nonzeros = int(self.comm.allreduce_sum(np.array([local.nnz], dtype=np.int64))[0])
        # Onto rank 0 alone: the other ranks never hold more than their own rows.
        data, indices, lengths, y = [self.comm.gatherv_array(part, limit) for part, limit in (
            (local.data, nonzeros), (local.indices.astype(np.int64), nonzeros),
            (np.diff(local.indptr).astype(np.int64), risk.n_total),
            (np.asarray(y, dtype=np.float64).ravel(), risk.n_total))]
        self.problem = None
        if self.comm.is_root:
            self.alpha = np.zeros(risk.n_total)
            self.w = np.zeros(risk.dim)
            self._X = sp.csr_matrix((data, indices, np.concatenate([[0], np.cumsum(lengths)])),
                                    shape=(risk.n_total, risk.dim))
            self._y = y
            self._diagonal = np.bincount(np.repeat(np.arange(risk.n_total), lengths), weights=data * data,
                                         minlength=risk.n_total)
            if not np.all(np.abs(y) == 1.0):
                self.problem = "the dual of the hinge SVM needs labels in {-1, +1}"
            self._random = np.random.default_rng(int(seed))
            self._reset()

    def handle(self, code):
        """Run the step `code` (0: a pass, 1: a certificate, 2: reset the active set) on rank 0."""
        return (self._pass, self._certify, self._reset)[code]() if self.comm.is_root else None

    def _reset(self):
        self.active = np.arange(self._X.shape[0])
        self.before = (np.inf, -np.inf)

    def _pass(self):
        """One pass over the active rows in a random order; returns the spread of the projected gradients,
        the number of active rows, the pass's estimate of the gap (in J's scale) and the seconds taken."""
        started = time.perf_counter()
        order = self._random.permutation(self.active)
        keep = np.empty(order.size, dtype=np.int8)
        high, low, estimate = hinge_dual_pass(self._X.indptr, self._X.indices, self._X.data, self._y,
                                              self._diagonal, order, self.upper, self.before[0], self.before[1],
                                              self.alpha, self.w, keep)
        self.active = order[keep.view(bool)]
        # LIBLINEAR's bounds for the next pass's shrinking: none where the pass saw no violation that side.
        self.before = (high if high > 0.0 else np.inf, low if low < 0.0 else -np.inf)
        return high - low, self.active.size, self.lam * estimate, time.perf_counter() - started

    def _certify(self):
        """J at w and ``lam D(alpha)`` over the gathered rows; returns them, w and the seconds taken."""
        started = time.perf_counter()
        X, y, lam = self._X, self._y, self.lam
        v = X.T @ (y * self.alpha)  # sum_i alpha_i y_i x_i afresh: the passes' w carries their rounding
        hinge = float(np.sum(np.maximum(0.0, 1.0 - y * (X @ self.w))))
        objective = 0.5 * lam * float(self.w @ self.w) + hinge / len(y)
        lower_bound = lam * (float(np.sum(self.alpha)) - 0.5 * float(v @ v))
        return objective, lower_bound, self.w.copy(), time.perf_counter() - started

    def state(self):
        """Rank 0's dual point, active set, shrinking bounds and the state of the generator of the orders, as the
        group ``dcd`` of a checkpoint (:func:`prbmrm.solvers.base.snapshot`); w is the solver's."""
        generator = self._random.bit_generator.state
        words = [word for big in (generator["state"]["state"], generator["state"]["inc"])
                 for word in (big >> 64, big & _WORD)] + [generator["has_uint32"], generator["uinteger"]]
        return {"dcd": {"alpha": self.alpha.copy(), "active": self.active.copy(), "shrink_high": self.before[0],
                        "shrink_low": self.before[1], "generator": np.array(words, dtype=np.uint64)}}

    def restore(self, state):
        """Continue from :meth:`state` and the state's w (rank 0): the next pass is the saved run's next.

        Raises
        ------
        InputError
            If the dual point lies outside the box ``[0, C]`` (its certificates would bound nothing), the
            active set is not a set of rows, or the generator's state is not 6 words.
        """
        saved, n = state["dcd"], self._X.shape[0]
        alpha, active, words = (np.asarray(saved[key]) for key in ("alpha", "active", "generator"))
        problem = None
        if alpha.shape != (n,) or alpha.dtype.kind != "f" or not np.all((alpha >= 0.0) & (alpha <= self.upper)):
            problem = f"dcd/alpha is not a point of the dual box [0, {self.upper:.6g}] of {n} examples"
        elif not (active.ndim == 1 and active.dtype.kind in "iu" and np.all((active >= 0) & (active < n))
                  and np.unique(active).size == active.size):
            problem = f"dcd/active is not a set of rows of the {n}"
        elif words.shape != (6,) or words.dtype != np.uint64:
            problem = "dcd/generator is not the 6 words of the orders' generator"
        if problem is not None:
            raise InputError(f"{getattr(state, 'path', 'the state')}: {problem} (damaged, or written for "
                             "other data or by another solver)")
        words = [int(word) for word in words]
        self._random.bit_generator.state = {
            "bit_generator": self._random.bit_generator.state["bit_generator"],
            "state": {"state": words[0] << 64 | words[1], "inc": words[2] << 64 | words[3]},
            "has_uint32": words[4], "uinteger": words[5]}
        self.alpha, self.active = alpha.astype(np.float64), active.astype(np.int64)
        self.before = (float(saved["shrink_high"]), float(saved["shrink_low"]))
        self.w = np.array(state["w"], dtype=np.float64)

    def start_from(self, alpha):
        """Start from `alpha` clipped to this box ``[0, C]`` and its w (rank 0, before the first pass)."""
        self.alpha = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, self.upper)
        self.w = np.asarray(self._X.T @ (self._y * self.alpha), dtype=np.float64).ravel()


def minimize_dcd(risk, w0, lam, regularizer, *, epsilon=0.0, rel_epsilon=1e-3, max_iter=10000, idle_age=None,
                 callback=None, seed=0, dual=None, state=None, checkpoint=None):
    """Minimize the L2-regularized hinge risk by dual coordinate descent with shrinking.

    Every row of the progress table is a certificate: J at the current w, the best J so far, the lower
    bound ``max lam D(alpha)`` over the certificates (a dual value at a feasible point, hence certified
    by weak duality) and the gap between the two; the passes before it are the iteration's (see the
    module docstring).

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
        The hinge risk oracle on rank 0; the solver uses its rows and communicator (the other ranks
        serve it, as for BMRM).
    w0 : ndarray
        Only its length is used: the descent starts from the dual point 0 (w = 0).
    lam : float
        Regularization constant, > 0.
    regularizer : object
        Must be the L2 regularizer ``||w||^2 / 2``.
    epsilon, rel_epsilon : float
        Stop when the gap is at most `epsilon`, or at most `rel_epsilon` times the best objective (0
        disables either).
    max_iter : int
        Stop after this many iterations (certificates).
    idle_age : None
        Accepted for a signature common to all solvers; no bundle is kept.
    callback : callable, optional
        Called with a :class:`Progress` per certificate (``planes`` is 0); raising StopIteration stops
        the solver.
    seed : int
        Seeds the order in which each pass visits the rows.
    dual : ndarray, optional
        Rank 0: a start, the ``dual`` of an earlier result on the same data (any lam), clipped to this
        lam's box ``[0, C]``, ``C = 1 / (lam n)`` (LIBLINEAR's warm start along C). None: alpha = 0.
    state, checkpoint
        As for :func:`~prbmrm.solvers.bmrm.minimize_bmrm` (`state` wins over `dual`); the state holds, under
        ``dcd`` (:meth:`DualDescentRanks.state`), the dual point of all examples in canonical order (on any
        number of ranks alike), the active set in its order, the shrinking bounds and the state of the
        generator of the orders, and besides them the passes' w, the best certified point and bound, the
        pass count, the certificates' schedule and the history.

    Returns
    -------
    Result
        ``w`` is the certified iterate of least J, ``w_last`` the last one certified; the message ends
        with the number of passes.

    Raises
    ------
    UsageError
        If the risk is not the hinge loss of a DistributedRisk, the regularizer is not L2 or the labels
        are not -1/+1.
    """
    if not hasattr(risk, "attach") or getattr(risk.loss, "name", None) != "hinge":
        raise UsageError("solver 'dcd' solves the hinge loss's dual: it needs the hinge loss's "
                         "DistributedRisk (its data), not another loss or a plain function")
    if getattr(regularizer, "name", None) != "l2":
        raise UsageError("solver 'dcd' needs the l2 regularizer")
    if len(w0) != risk.dim:
        raise UsageError(f"w0 has length {len(w0)}, the data {risk.dim}")
    ranks = risk.attach(DualDescentRanks, lam, seed)
    if ranks.problem is not None:
        raise UsageError(f"solver 'dcd': {ranks.problem}")
    if dual is not None and state is None:
        if len(dual) != risk.n_total:
            raise UsageError(f"a dual start of {len(dual)} examples for data of {risk.n_total}")
        ranks.start_from(dual)
    recorder = Recorder(epsilon, rel_epsilon, callback)
    best_objective, best_w, lower_bound, passes = np.inf, None, -np.inf, 0
    target, last_estimate, scale = 0.0, np.inf, 1.0
    w, start = None, 1
    if state is not None:
        ranks.restore(state)
        recorder.restore(state)
        w, best_w, best_objective = state["w"], state["best_w"], state["best_objective"]
        lower_bound, passes, target = state["lower_bound"], int(state["passes"]), state["target"]
        last_estimate, scale = state["last_estimate"], state["scale"]
        start = state["iteration"] + 1
    for t in range(start, max_iter + 1):
        started, data_seconds = time.perf_counter(), 0.0
        for _ in range(CERTIFY_EVERY):
            spread, active, estimate, seconds = risk.request(_PASS)
            passes, data_seconds = passes + 1, data_seconds + seconds
            # A certificate when the scaled estimate meets the gap sought, after the estimate fell at least by
            # PREDICTED_STEP (a certificate per pass where it hovers at the target would cost as much again).
            if (scale * estimate <= target and estimate <= PREDICTED_STEP * last_estimate
                    or estimate <= ESTIMATE_STEP * last_estimate):
                break
        objective, bound, w, certify_seconds = risk.request(_CERTIFY)
        if not (np.isfinite(objective) and np.isfinite(bound)):
            raise InputError(f"the objective or its dual is not finite after pass {passes}")
        if objective < best_objective:
            best_objective, best_w = objective, w
        lower_bound = max(lower_bound, bound)
        seconds = time.perf_counter() - started
        row = Progress(t, objective, best_objective, lower_bound, best_objective - lower_bound, 0,
                       data_seconds + certify_seconds, 0.0, seconds - data_seconds - certify_seconds,
                       time.perf_counter() - recorder.started)
        if recorder.record(row):
            break
        # The estimate runs high near the end (each row's term is taken before its update): scaled by the last
        # certificate's gap over it, it says when the next certificate may succeed.
        target, last_estimate = max(epsilon, rel_epsilon * abs(best_objective)), estimate
        scale = min(1.0, row.gap / estimate) if estimate > 0.0 else 1.0
        # The gap is not where the passes' estimate put it: the rows left out of the passes hold the rest.
        if active < risk.n_total and (estimate <= target or spread < RESET_SPREAD):
            risk.request(_RESET)
        if recorder.offer(checkpoint, t, lambda: snapshot(
                recorder, ranks, w=w, best_w=best_w, best_objective=best_objective, lower_bound=lower_bound,
                passes=passes, target=target, last_estimate=last_estimate, scale=scale, iteration=t)):
            break
    result = recorder.result(best_w, best_objective, w)
    result.message = f"{result.message} after {passes} passes"
    result.dual = ranks.alpha.copy()
    return result
