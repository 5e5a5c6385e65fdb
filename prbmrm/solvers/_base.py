"""What every solver shares: the bundle of cutting planes and the result type."""

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..errors import InputError

HISTORY_COLUMNS = ("iteration", "objective", "best_objective", "lower_bound", "gap", "planes",
                   "seconds_risk", "seconds_subproblem", "seconds_comm", "seconds_total")
"""The progress-table columns, also the datasets of a model file's ``/history``."""


SPARSE_MIN_DIM = 2 ** 16
"""The smallest dimension at which a :class:`Bundle` stores planes sparsely by default."""


class Bundle:
    """Cutting planes ``R_emp(w) >= <a_i, w> + b_i`` with their Gram matrix kept up to date.

    Rows of :attr:`A` are the subgradients a_i. Adding a plane costs one
    product ``A @ a`` (O(t d)) to extend the Gram matrix; storage grows by
    doubling so the hot path does not reallocate every iteration, up to
    `max_size` rows if given.

    Sparse planes: with `sparse`, a plane whose support holds less than half
    of the `dim` coordinates is stored as its indices and values (12 bytes
    per nonzero instead of 8 per coordinate), the others as dense vectors;
    the Gram row of a new plane, :meth:`combine` (``A^T alpha``, hence w),
    :meth:`products` (``A w``) and aggregation then cost O(nonzeros of the
    planes) plus O(d) for the one dense result, not O(t d). Sums run plane
    by plane in a fixed order, so the results depend on the planes only (not
    on the ranks), but they may differ in the last bits from the dense
    bundle's BLAS products.

    Parameters
    ----------
    dim : int
        Length of the subgradients.
    metric : callable, optional
        ``metric(a) -> M a`` for a positive definite M: the Gram matrix is then
        ``A M A^T`` (the quadratic-form regularizer's ``B^-1``); identity by default.
    max_size : int, optional
        Most planes ever held (storage never exceeds it); the solver keeps
        within it with :meth:`aggregate_oldest`. Unlimited by default.
    sparse : bool, optional
        Store planes of small support sparsely; by default when `dim` is at
        least :data:`SPARSE_MIN_DIM` (below it a dense plane is small anyway,
        and results stay those of the dense bundle).
    """

    def __init__(self, dim, metric=None, max_size=None, sparse=None):
        if max_size is not None and max_size < 2:
            raise ValueError(f"a bundle holds at least 2 planes, got max_size={max_size}")
        self._metric = metric
        self.max_size = max_size
        self.dim = dim
        self.sparse = dim >= SPARSE_MIN_DIM if sparse is None else bool(sparse)
        capacity = 8 if max_size is None else min(8, max_size)
        # With a limit the planes' storage is reserved whole at once: the pages of
        # np.empty are only committed as planes are written, and growing never
        # holds an old and a new copy of the planes (twice the budget) at once.
        # Sparse planes are separate arrays, one (indices or None, values) pair each.
        self._A = None if self.sparse else np.empty((capacity if max_size is None else max_size, dim))
        self._planes = []
        self._b = np.empty(capacity)
        self._gram = np.empty((capacity, capacity))
        self._idle = np.empty(capacity, dtype=np.int64)
        self.size = 0

    @property
    def A(self):
        """ndarray of shape (t, dim): the subgradients, one per row (a dense copy for sparse planes)."""
        if not self.sparse:
            return self._A[:self.size]
        A = np.zeros((self.size, self.dim))
        for row, (index, values) in zip(A, self._planes):
            row[slice(None) if index is None else index] = values
        return A

    @property
    def b(self):
        """ndarray of shape (t,): the offsets."""
        return self._b[:self.size]

    @property
    def gram(self):
        """ndarray of shape (t, t): ``A @ A.T`` (``A M A^T`` with a metric)."""
        return self._gram[:self.size, :self.size]

    @property
    def nbytes(self):
        """int: the bytes the planes' storage holds (reserved, for a dense bundle)."""
        if not self.sparse:
            return self._A.nbytes
        return sum(values.nbytes + (0 if index is None else index.nbytes) for index, values in self._planes)

    def combine(self, alpha):
        """Return ``A^T alpha`` (w is ``-A^T alpha / lam`` for the L2 regularizer)."""
        if not self.sparse:
            return alpha @ self.A
        return _combine(alpha, self._planes, self.dim)

    def products(self, w):
        """Return ``A w``, the planes' slopes at `w`."""
        if not self.sparse:
            return self.A @ w
        return np.array([_dot(plane, w) for plane in self._planes])

    def add(self, a, b):
        """Append the plane (a, b)."""
        t = self.size
        if t == len(self._b):
            if t == self.max_size:
                raise ValueError(f"the bundle already holds its maximum of {t} planes")
            self._grow(2 * t if self.max_size is None else min(2 * t, self.max_size))
        self._b[t] = b
        image = a if self._metric is None else self._metric(a)
        if self.sparse:
            self._planes.append(_plane(a))
            row = self.products(image)
        else:
            self._A[t] = a
            row = self._A[:t + 1] @ image
        self._gram[t, :t + 1] = row
        self._gram[:t + 1, t] = row
        self._idle[t] = 0
        self.size = t + 1

    def _grow(self, capacity):
        t = self.size
        A, b, gram, idle = self._A, self._b, self._gram, self._idle
        if A is not None and len(A) < capacity:
            self._A = np.empty((capacity, A.shape[1]))
            self._A[:t] = A[:t]
        self._b = np.empty(capacity)
        self._b[:t] = b[:t]
        self._gram = np.empty((capacity, capacity))
        self._gram[:t, :t] = gram[:t, :t]
        self._idle = np.empty(capacity, dtype=np.int64)
        self._idle[:t] = idle[:t]

    def update_idle(self, alpha):
        """Count, per plane, the consecutive iterations its multiplier has been zero."""
        idle = self._idle[:self.size]
        idle[:] = np.where(alpha > 0, 0, idle + 1)

    def prune(self, idle_age, alpha):
        """Drop the planes idle for `idle_age` iterations or more; return the kept multipliers.

        Dropped planes have zero multipliers, so the subproblem's optimum, and
        the lower bound, are unchanged.
        """
        keep = self._idle[:self.size] < idle_age
        if keep.all():
            return alpha
        index = np.flatnonzero(keep)
        self._select(index, 0)
        return alpha[index]

    def make_room(self, alpha):
        """Make room for one more plane: if the bundle is full, aggregate all but the newest max_size - 2.

        For max_size 2 this is Alg. 4 of paper 000: one aggregate and the new
        plane. Returns the multipliers of the planes left.
        """
        if self.size == self.max_size:
            return self.aggregate_oldest(alpha, self.max_size - 2)
        return alpha

    def aggregate_oldest(self, alpha, keep):
        """Replace all planes but the newest `keep` by their aggregate; return the new multipliers.

        With the multipliers alpha of the last subproblem and I the oldest
        planes, the aggregate (paper 000, Sec. 3.1; Kiwiel 1983) is
        ``a_I = sum_{i in I} alpha_i a_i / alpha_I``, the same for b, with
        multiplier ``alpha_I = sum_{i in I} alpha_i``. Being a convex
        combination of planes it is a plane below R_emp, and the returned
        multipliers give the same dual value, so the subproblem's optimum and
        the lower bound are unchanged. If alpha_I is 0 the planes I are dropped
        (the same argument). The aggregate becomes the first plane. The Gram
        matrix follows from the old one, in O(t^2); the only O(d) work is
        forming a_I, in O(|I| d).

        Parameters
        ----------
        alpha : ndarray of shape (t,)
            The multipliers of the bundle's planes, >= 0.
        keep : int
            How many of the newest planes stay as they are, >= 0.

        Returns
        -------
        ndarray
            The multipliers of the planes left, aggregate first.
        """
        old = self.size - keep
        if old <= 0:
            return alpha
        total = float(np.sum(alpha[:old]))
        kept = np.arange(old, self.size)
        if total <= 0.0:
            self._select(kept, 0)
            return alpha[kept]
        weights = alpha[:old] / total
        gram = self._gram[:self.size, :self.size]
        cross = weights @ gram[:old]  # <a_I, a_j> for every plane j, in the Gram metric
        diagonal = float(cross[:old] @ weights)
        if self.sparse:
            a = _plane(_combine(weights, self._planes[:old], self.dim))
        else:
            a = weights @ self._A[:old]
        b = float(weights @ self._b[:old])
        self._select(kept, 1)
        if self.sparse:
            self._planes[0] = a
        else:
            self._A[0] = a
        self._b[0] = b
        self._gram[0, 1:keep + 1] = cross[old:]
        self._gram[1:keep + 1, 0] = cross[old:]
        self._gram[0, 0] = diagonal
        self._idle[0] = 0
        return np.concatenate(([total], alpha[kept]))

    def state(self):
        """Return the planes, Gram matrix and idle counts as a dict of arrays (for a checkpoint).

        Dense planes are ``A``; sparse ones (:attr:`sparse`) are the rows of a
        CSR matrix ``indptr, indices, values``, a dense plane among them with
        all `dim` indices, so that :meth:`restore` gives back the same storage.
        """
        state = {"b": self.b.copy(), "gram": self.gram.copy(), "idle": self._idle[:self.size].copy()}
        if not self.sparse:
            return dict(state, A=self.A.copy())
        every = np.arange(self.dim, dtype=_index_type(self.dim))
        indices = [every if index is None else index for index, _ in self._planes]
        indptr = np.zeros(self.size + 1, dtype=np.int64)
        np.cumsum([len(index) for index in indices], out=indptr[1:])
        return dict(state, indptr=indptr, indices=np.concatenate(indices or [every[:0]]),
                    values=np.concatenate([values for _, values in self._planes] or [np.zeros(0)]))

    def restore(self, state):
        """Replace the planes by those of :meth:`state` (either storage); the Gram matrix is taken as saved."""
        t = len(state["b"])
        if t > len(self._b):
            self._grow(t)
        if "A" in state:
            rows = np.asarray(state["A"], dtype=np.float64)
        else:
            indptr, indices, values = (np.asarray(state[key]) for key in ("indptr", "indices", "values"))
            rows = [(indices[start:end], values[start:end]) for start, end in zip(indptr[:-1], indptr[1:])]
        if self.sparse:
            self._planes = [_plane(row) if "A" in state else
                            (None if len(row[0]) == self.dim else row[0].astype(_index_type(self.dim)),
                             np.array(row[1], dtype=np.float64)) for row in rows]
        elif "A" in state:
            self._A[:t] = rows
        else:
            self._A[:t] = 0.0
            for target, (index, values) in zip(self._A, rows):
                target[index] = values
        self._b[:t] = state["b"]
        self._gram[:t, :t] = state["gram"]
        self._idle[:t] = state["idle"]
        self.size = t

    def _select(self, index, start):
        """Move the planes `index` (increasing) to rows ``start, start + 1, ...``; keep only those."""
        n = len(index)
        rows = slice(start, start + n)
        if self.sparse:
            self._planes = self._planes[:start] + [self._planes[i] for i in index]
        else:
            self._A[rows] = self._A[index]
        self._b[rows] = self._b[index]
        self._gram[rows, rows] = self._gram[np.ix_(index, index)]
        self._idle[rows] = self._idle[index]
        self.size = start + n


def _index_type(dim):
    return np.int32 if dim <= np.iinfo(np.int32).max else np.int64


def _plane(a):
    """A sparse bundle's storage of the vector `a`: ``(indices, values)`` if under half of it is nonzero,
    else ``(None, a copy of a)``."""
    support = np.flatnonzero(a)
    if 2 * len(support) < len(a):
        return support.astype(_index_type(len(a))), a[support]
    return None, np.array(a, dtype=np.float64)


def _dot(plane, w):
    index, values = plane
    if index is None:
        return float(np.dot(values, w))
    # scipy's CSR kernel reads the plane once; w[index] would first copy the gathered values (5x slower).
    row = sp.csr_matrix((values, index, np.array([0, len(index)], dtype=index.dtype)), shape=(1, len(w)))
    return float((row @ w)[0])


def _combine(alpha, planes, dim):
    """``sum_i alpha_i a_i`` over sparse-bundle `planes`, dense, summed plane by plane in order."""
    total = np.zeros(dim)
    for weight, (index, values) in zip(alpha, planes):
        # A zero weight adds only zeros: skipping it leaves every bit of the sum as it is.
        if weight != 0.0:
            if index is None:
                total += weight * values
            else:
                total[index] += weight * values
    return total


def planes_within(memory, dim):
    """Return how many planes of `dim` float64 values fit in `memory` bytes (at least 2).

    A memory budget for the bundle gives its ``bundle_size``: the oldest
    planes are then aggregated (paper 000, Sec. 3.1), which keeps the
    subproblem's optimum and the lower bound, so the budget costs iterations
    at most, never correctness. The Gram matrix (``8 t^2`` bytes) is small
    next to the planes for any budget that holds a plane of a large d.
    """
    return max(2, int(memory) // (8 * max(1, int(dim))))


class CuttingPlaneModel:
    """BMRM's model ``J_t(w) = lam * Omega(w) + max_i <a_i, w> + b_i``: its planes and their multipliers.

    What every BMRM variant does with a risk evaluation: add its plane,
    minimize J_t through the regularizer's dual subproblem warm-started from
    the previous multipliers, and drop planes that stayed idle. Given a
    tolerance ``gap`` > 0, :meth:`minimize` solves the subproblem only that
    loosely where the regularizer offers ``solve_loosely`` (the quadratic
    ones, :func:`prbmrm.qp.solve_simplex_pg`) and the bundle is unlimited;
    then a :attr:`floor` (a lower bound of R_emp, None: none known) is an
    implicit plane ``R_emp >= floor`` with the multiplier ``1 - sum(alpha)``.
    A subproblem projected gradient cannot solve (``solve_loosely`` returns
    None) turns :attr:`loose` off: exact QPs for the rest of the run.

    Parameters
    ----------
    dim : int
        Length of w.
    lam : float
    regularizer : object
        Provides ``solve_subproblem(bundle, lam, alpha0)`` and optionally ``metric``.
    idle_age : int
        Drop planes whose multiplier stayed zero this many consecutive
        iterations; 0 keeps every plane.
    bundle_size : int
        Keep at most this many planes (>= 2), aggregating the oldest
        (:meth:`Bundle.make_room`); 0: no limit.
    """

    def __init__(self, dim, lam, regularizer, idle_age, bundle_size=0):
        self.bundle = Bundle(dim, getattr(regularizer, "metric", None), bundle_size or None)
        self.lam = lam
        self.regularizer = regularizer
        self.idle_age = idle_age
        self.alpha = np.zeros(0)
        self.floor = None
        self.loose = True

    def minimize(self, w, r, a, gap=0.0):
        """Add the plane ``(a, r - <a, w>)`` of R_emp at `w`; return ``(w_t, lower_bound, seconds)``.

        ``w_t`` minimizes J_t and ``lower_bound``, the dual value, is a
        certified lower bound of min J. With a `gap` > 0 the subproblem may be
        solved only to that tolerance: ``w_t`` is then the primal map of the
        multipliers returned and ``lower_bound`` their dual value, still a
        lower bound of min J (weak duality: they are feasible).
        """
        started = time.perf_counter()
        self.alpha = self.bundle.make_room(self.alpha)
        self.bundle.add(a, r - float(np.dot(a, w)))
        alpha0 = np.append(self.alpha, 0.0)
        solved = None
        if gap > 0.0 and self.loose and self.bundle.max_size is None and hasattr(self.regularizer, "solve_loosely"):
            solved = self.regularizer.solve_loosely(self.bundle, self.lam, alpha0, gap, self.floor)
            # An ill-conditioned subproblem defeats projected gradient: exact QPs from now on.
            self.loose = solved is not None
        if solved is None:
            solved = self.regularizer.solve_subproblem(self.bundle, self.lam, alpha0)
        w_t, lower_bound, self.alpha = solved
        return w_t, lower_bound, time.perf_counter() - started

    def prune(self):
        """Drop the idle planes (their multipliers are zero: J_t's minimum is unchanged)."""
        if self.idle_age > 0:
            self.bundle.update_idle(self.alpha)
            self.alpha = self.bundle.prune(self.idle_age, self.alpha)

    def state(self):
        """Return the planes and multipliers as a dict (for a checkpoint)."""
        return {"bundle": self.bundle.state(), "alpha": self.alpha.copy(), "loose": int(self.loose)}

    def restore(self, state):
        """Continue from :meth:`state`: the next :meth:`minimize` is warm-started as the saved one was."""
        self.bundle.restore(state["bundle"])
        self.alpha = np.asarray(state["alpha"], dtype=np.float64)
        self.loose = bool(state.get("loose", 1))


def snapshot(recorder, model, **values):
    """A checkpoint's state: the history, the planes of `model` (its ``state()``) and the solver's `values`.

    `model` is a :class:`CuttingPlaneModel` (BMRM variants) or a
    :class:`CuttingPlaneBound` (solvers that only bound the gap with planes).
    """
    return dict(recorder.state(), **model.state(), **values)


_MESSAGES = {0: "gap <= epsilon", 1: "gap <= rel_epsilon * objective",
             2: "maximum number of iterations reached", 3: "stopped by the callback",
             4: "no further progress (the line search failed)", 5: "interrupted by a signal"}


class Recorder:
    """The bookkeeping every solver shares: history, stopping tests, callback and result.

    Parameters
    ----------
    epsilon : float
        Stop when the gap is at most this (0 disables).
    rel_epsilon : float
        Stop when the gap is at most this times the best objective (0 disables).
    callback : callable, optional
        Called with each :class:`Progress`; raising StopIteration stops the solver.
    """

    def __init__(self, epsilon=0.0, rel_epsilon=1e-3, callback=None):
        self.epsilon = epsilon
        self.rel_epsilon = rel_epsilon
        self.callback = callback
        self.history = {name: [] for name in HISTORY_COLUMNS}
        self.started = time.perf_counter()
        self.status = 2

    def _test_gap(self, gap, best_objective):
        if gap <= self.epsilon:
            self.status = 0
        elif gap <= self.rel_epsilon * abs(best_objective):
            self.status = 1

    def record(self, row):
        """Append one :class:`Progress` row and return True if the solver must stop."""
        for name in HISTORY_COLUMNS:
            self.history[name].append(getattr(row, name))
        self._test_gap(row.gap, row.best_objective)
        if self.callback is not None:
            try:
                self.callback(row)
            except StopIteration:
                self.status = 3 if self.status == 2 else self.status
        return self.status != 2

    def interrupt(self):
        """Mark the run as stopped by a signal (status 5)."""
        self.status = 5

    def offer(self, checkpoint, iteration, state):
        """Offer ``checkpoint(iteration, state)`` the run after `iteration`; return True if it says stop.

        `checkpoint` may be None (no checkpoints); `state` makes the
        checkpoint's dict only when one is written. A stop marks the run
        interrupted (status 5).
        """
        if checkpoint is None or not checkpoint(iteration, state):
            return False
        self.interrupt()
        return True

    def state(self):
        """Return the history so far as a dict of arrays (for a checkpoint)."""
        return {"history": {name: np.asarray(values) for name, values in self.history.items()}}

    def restore(self, state):
        """Continue the history of :meth:`state`; elapsed seconds continue from its last row."""
        self.history = {name: list(np.atleast_1d(state["history"][name])) for name in HISTORY_COLUMNS}
        if self.history["seconds_total"]:
            self.started -= self.history["seconds_total"][-1]

    def raise_lower_bound(self, lower_bound):
        """Give the last row a better `lower_bound`, computed later for the same iterates, and
        re-test the gap (a solver that computes its bound only every few iterations
        calls this when it ends)."""
        if lower_bound > self.history["lower_bound"][-1]:
            gap = self.history["best_objective"][-1] - lower_bound
            self.history["lower_bound"][-1] = lower_bound
            self.history["gap"][-1] = gap
            if self.status in (2, 4):
                self._test_gap(gap, self.history["best_objective"][-1])

    def result(self, w, fun, w_last):
        """Return the :class:`Result` with the best iterate `w`, its objective `fun` and `w_last`."""
        history = {k: np.asarray(v) for k, v in self.history.items()}
        return Result(w=w, fun=fun, lower_bound=history["lower_bound"][-1], gap=history["gap"][-1],
                      nit=len(history["iteration"]), status=self.status,
                      message=_MESSAGES[self.status], w_last=w_last, history=history)


def check_finite(r, a, t):
    """Raise InputError unless the risk `r` and ``|a|^2`` of iteration `t` are finite."""
    # |a|^2 enters the Gram matrix: it must be finite too, not only a.
    with np.errstate(over="ignore"):
        norm2 = np.dot(a, a)
    if not (np.isfinite(r) and np.isfinite(norm2)):
        raise InputError(f"the empirical risk or its subgradient is not finite at iteration {t} "
                         "(overflow in the loss? try a larger --lam or scaled features)")


@dataclass
class Result:
    """The outcome of a solver, in the manner of scipy's ``OptimizeResult``.

    Attributes
    ----------
    w : ndarray
        The best iterate: argmin of J over the evaluated iterates.
    fun : float
        J(w), the best objective.
    lower_bound : float
        A certified lower bound of min J.
    gap : float
        ``fun - lower_bound``, the paper's epsilon_t.
    nit : int
        Iterations, i.e. risk evaluations.
    status : int
        0: gap <= epsilon; 1: gap <= rel_epsilon * fun; 2: max_iter reached;
        3: stopped by the callback; 4: no further progress (L-BFGS's line search failed);
        5: interrupted by a signal (see :mod:`prbmrm.checkpoint`).
    message : str
    w_last : ndarray
        The last iterate (BMRM: the minimizer of the last model J_t).
    history : dict of str to ndarray
        One array per column of :data:`HISTORY_COLUMNS`.
    bundle : Bundle or None
        The final planes of ``R_emp``, for solvers that keep a bundle (BMRM):
        ``minimize_bmrm(..., bundle=result.bundle, alpha=result.alpha)`` goes
        on from them.
    alpha : ndarray or None
        The multipliers of `bundle`'s planes.
    """

    w: np.ndarray
    fun: float
    lower_bound: float
    gap: float
    nit: int
    status: int
    message: str
    w_last: np.ndarray
    history: dict = field(default_factory=dict)
    bundle: object = None
    alpha: np.ndarray = None

    @property
    def success(self):
        """bool: True if the solver stopped on its gap criterion."""
        return self.status in (0, 1)


@dataclass
class Progress:
    """One row of the progress table, handed to ``callback`` after every iteration."""

    iteration: int
    objective: float
    best_objective: float
    lower_bound: float
    gap: float
    planes: int
    seconds_risk: float
    seconds_subproblem: float
    seconds_comm: float
    seconds_total: float


class CuttingPlaneBound:
    """A certified lower bound of min J from every point a solver evaluates.

    Each evaluation ``(w, R_emp(w), a)`` gives the plane ``R_emp >= <a, .> + b``
    with ``b = R_emp(w) - <a, w>``; the dual value of the BMRM subproblem over
    the planes kept (``regularizer.solve_subproblem``, warm-started) is a
    lower bound of min J for any set of planes below R_emp, whatever solver
    produced them. With ``Omega = ||w||^2 / 2`` the one-plane bound
    ``b - ||a||^2 / (2 lam)``, which equals paper 002's eq. 15
    ``J_-(w) = J(w) - ||a + lam w||^2 / (2 lam)``, is also taken at every
    plane: Lemma 5's proof needs only the subgradient inequality, so it holds
    for any subgradient, and it is tight near the optimum where J is
    differentiable (there the gradient vanishes), which is why L-BFGS on a
    smooth loss gets a small certified gap without solving the QP.

    Planes of any function below R_emp (a smoothed risk ``R_mu <= R_emp``)
    are planes below R_emp too.

    Parameters
    ----------
    dim : int
        Length of w.
    regularizer : object
        Provides ``solve_subproblem(bundle, lam, alpha0)``.
    lam : float
    max_planes : int
        Keep at most this many planes (0: no limit, >= 2 otherwise). A plane
        arriving at a full bundle first makes the QP be solved; the planes
        whose multiplier is 0 are dropped, and if every plane is active they
        are replaced by their aggregate ``sum_i alpha_i (a_i, b_i)`` (paper
        000, Sec. 3.1), which keeps the dual value.
    idle_age : int
        After each solve drop the planes whose multiplier has been 0 at this
        many consecutive solves, as BMRM does (0: never).

    Attributes
    ----------
    value : float
        The best lower bound found so far (-inf before any plane).
    bundle : Bundle
    seconds : float
        Seconds spent in the QP so far.
    """

    def __init__(self, dim, regularizer, lam, *, max_planes=0, idle_age=10):
        if max_planes == 1 or max_planes < 0:
            raise ValueError(f"max_planes must be 0 (no limit) or >= 2, got {max_planes}")
        self.regularizer = regularizer
        self.lam = lam
        self.max_planes = max_planes
        self.idle_age = idle_age
        self._metric = getattr(regularizer, "metric", None)
        self.bundle = Bundle(dim, self._metric)
        self._alpha = np.zeros(0)
        self._stale = False
        self._one_plane = getattr(regularizer, "name", None) == "l2"
        self.value = -np.inf
        self.seconds = 0.0

    @property
    def stale(self):
        """bool: planes were added since the QP was last solved."""
        return self._stale

    def state(self):
        """Return the planes, multipliers and best bound as a dict (for a checkpoint)."""
        return {"bundle": self.bundle.state(), "alpha": self._alpha.copy(), "stale": self._stale,
                "value": self.value, "seconds": self.seconds}

    def restore(self, state):
        """Continue from :meth:`state`: the next QP is warm-started as the saved one would have been."""
        self.bundle.restore(state["bundle"])
        self._alpha = np.asarray(state["alpha"], dtype=np.float64)
        self._stale, self.value, self.seconds = bool(state["stale"]), state["value"], state["seconds"]

    def add(self, w, risk, a):
        """Add the plane of the evaluation ``(w, R_emp(w) = risk, a)``."""
        b = risk - float(np.dot(a, w))
        if self._one_plane:
            self.value = max(self.value, b - float(np.dot(a, a)) / (2.0 * self.lam))
        if self.max_planes and self.bundle.size >= self.max_planes:
            self._make_room()
        self.bundle.add(a, b)
        self._alpha = np.append(self._alpha, 0.0)
        self._stale = True

    def lower_bound(self):
        """Return the best bound, solving the QP first if planes arrived since the last solve."""
        if self._stale:
            self._solve()
        return self.value

    def _solve(self):
        started = time.perf_counter()
        _, value, alpha = self.regularizer.solve_subproblem(self.bundle, self.lam, self._alpha)
        self.value = max(self.value, value)
        self._stale = False
        if self.idle_age > 0:
            self.bundle.update_idle(alpha)
            alpha = self.bundle.prune(self.idle_age, alpha)
        self._alpha = alpha
        self.seconds += time.perf_counter() - started

    def _make_room(self):
        if self._stale:
            self._solve()
        # update_idle marked the planes whose multiplier is 0 now: they do not
        # contribute to the optimum, so dropping them keeps the bound.
        self.bundle.update_idle(self._alpha)
        self._alpha = self.bundle.prune(1, self._alpha)
        if self.bundle.size >= self.max_planes:
            a = self.bundle.combine(self._alpha)
            b = float(self._alpha @ self.bundle.b)
            self.bundle = Bundle(len(a), self._metric)
            self.bundle.add(a, b)
            self._alpha = np.ones(1)
