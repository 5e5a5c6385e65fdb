"""The dual of the binary hinge SVM over the examples of every rank (paper 001, Sec. 4).

With ``J(w) = lam ||w||^2 / 2 + (1/n) sum_i max(0, 1 - y_i <x_i, w>)`` the adjoint (eq. 21-22) is

    D(alpha) = sum_i alpha_i - ||sum_i alpha_i y_i x_i||^2 / (2 lam),   0 <= alpha_i <= 1/n,

plus ``sum_i y_i alpha_i = 0`` when the model has an unregularized offset b, and
``w(alpha) = sum_i alpha_i y_i x_i / lam`` (eq. 24). ``D(alpha) <= min J`` for every feasible
alpha (weak duality), so a dual value is a certified lower bound.

Each rank holds the ``alpha_i`` of its own examples; what crosses ranks is

- ``X^T (y * alpha)``: one reproducible Allreduce of d values per vector, summed over the
  canonical blocks of rows so that 1, 2 or 3 ranks get bitwise the same sums;
- for the projection onto the feasible set with the equality, a few scalars per trial of the
  multiplier (:class:`DistributedProjection`).

The projection (paper 001, Appendix B) is

    alpha = argmin ||alpha - v||^2  subject to  0 <= alpha_i <= upper,  sum_i y_i alpha_i = 0.

By the KKT conditions ``alpha_i = clip(v_i - nu y_i, 0, upper)`` for a multiplier ``nu`` of the
equality that is a root of

    g(nu) = sum_i y_i alpha_i(nu) = upper * n_+ - sum_i clip(nu - l_i, 0, upper),
    l_i = y_i v_i - upper [y_i = +1],

a continuous, nonincreasing, piecewise linear function with breakpoints ``l_i`` and
``l_i + upper``. :func:`project_box_equality` is the serial kernel (exact, sort-based,
O(n log n)), the reference of the tests; :class:`DistributedProjection` finds the same root
over the examples of every rank.

Every method here is collective: all ranks call it in the same order, with the same scalar
arguments. :mod:`prbmrm.solvers.pragam` runs them as a service of the risk oracle
(:meth:`prbmrm.risk.DistributedRisk.attach`).
"""

import time

import numpy as np
import scipy.sparse as sp


def breakpoints(v, y, upper):
    """Return ``l``: ``alpha_i(nu)`` changes slope at ``nu = l_i`` and ``nu = l_i + upper``."""
    return y * v - upper * (y > 0)


def alpha_at(v, y, upper, nu):
    """Return ``clip(v - nu y, 0, upper)``, the projection's point for the multiplier `nu`."""
    return np.clip(v - nu * y, 0.0, upper)


def interpolate_root(a, b, g_a, g_b):
    """Root of the line through ``(a, g_a)`` and ``(b, g_b)``, with ``g_a > 0 > g_b``; in [a, b]."""
    return a + (b - a) * (g_a / (g_a - g_b))


def project_box_equality(v, y, upper):
    """Project `v` onto ``{0 <= alpha <= upper, sum_i y_i alpha_i = 0}`` by sorting breakpoints.

    Evaluates g at every breakpoint from prefix sums, takes the first
    breakpoint where g <= 0 (checked with direct sums) and interpolates
    linearly from the breakpoint before it (g is linear in between).

    Parameters
    ----------
    v : ndarray of shape (n,)
    y : ndarray of shape (n,)
        Labels, each -1 or +1.
    upper : float
        The box's upper bound, > 0.

    Returns
    -------
    alpha : ndarray of shape (n,)
        The projection.
    nu : float
        A multiplier of the equality: ``alpha = clip(v - nu y, 0, upper)``.
    """
    v = np.asarray(v, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    low = breakpoints(v, y, upper)
    positives = np.count_nonzero(y > 0)
    points = np.unique(np.concatenate([low, low + upper]))
    lows, highs = np.sort(low), np.sort(low + upper)
    below_low = np.searchsorted(lows, points)
    below_high = np.searchsorted(highs, points)
    prefix_low = np.concatenate([[0.0], np.cumsum(lows)])
    prefix_high = np.concatenate([[0.0], np.cumsum(highs)])
    # sum_i clip(t - l_i, 0, upper) = sum_{l_i < t} (t - l_i) - sum_{l_i + upper < t} (t - l_i - upper)
    clipped = (points * below_low - prefix_low[below_low]) - (points * below_high - prefix_high[below_high])
    j = int(np.argmax(upper * positives - clipped <= 0))

    def g(nu):
        return upper * positives - np.sum(np.clip(nu - low, 0.0, upper))

    # Prefix sums round differently from direct sums: settle the crossing with the latter.
    while j < len(points) - 1 and g(points[j]) > 0:
        j += 1
    while j > 0 and g(points[j - 1]) <= 0:
        j -= 1
    g_right = g(points[j])
    nu = points[j] if j == 0 or g_right == 0 else interpolate_root(points[j - 1], points[j],
                                                                  g(points[j - 1]), g_right)
    return alpha_at(v, y, upper, nu), float(nu)


def segment_sums(values, starts):
    """Sums of `values` over the consecutive segments beginning at `starts` (sorted; may repeat).

    Each segment is summed on its own (``np.add.reduceat``), so a block's sum
    does not depend on what precedes it in the array: on any number of ranks
    a canonical block gives bitwise the same sum.
    """
    sums = np.zeros(len(starts))
    filled = np.diff(np.append(starts, len(values))) > 0
    if filled.any():
        sums[filled] = np.add.reduceat(values, starts[filled], dtype=np.float64)
    return sums


class DistributedProjection:
    """Projection onto ``{0 <= alpha <= upper, sum_i y_i alpha_i = 0}`` of a vector spread over ranks.

    Each rank passes its own entries of v. The multiplier ``nu`` with
    ``alpha = clip(v - nu y, 0, upper)`` is a root of the nonincreasing,
    piecewise linear ``g(nu) = sum_i y_i alpha_i(nu)`` (module docstring),
    found by a safeguarded Newton search on the bracket
    ``[min_i l_i, max_i l_i + upper]``:

    1. every rank evaluates its blocks' parts of g at the trial ``t``, its
       counts of examples on a sloped piece just left and just right of t
       (g's one-sided slopes are minus the totals) and its counts of
       breakpoints strictly inside each half of the bracket; one
       reproducible sum over the canonical blocks (two Allreduces) combines
       them;
    2. t replaces the bracket end of g's sign; if the new bracket holds no
       breakpoint, g is linear on it and its root is found by interpolation:
       exact up to rounding;
    3. otherwise examples whose breakpoints left the bracket become per-block
       constants (the "aggregation of slope and offset" of the appendix), and
       the next trial is Newton's ``t + g(t) / slope`` if it falls inside the
       bracket, else the secant of the bracket (else its midpoint); when no
       breakpoint lies between Newton's point and its origin, g is linear
       there and the point is the root.

    The bracket shrinks strictly at every trial, so the search ends; every
    decision uses sums that do not depend on the number of ranks, so 1, 2 or
    3 ranks holding the same blocks find bitwise the same multiplier. Warm
    started near the root (Pragam's successive projections), it takes two or
    three trials, each O(number of examples still undecided).

    Parameters
    ----------
    y : ndarray of shape (n_local,)
        This rank's labels, each -1 or +1.
    bounds : sequence of int
        Local boundaries ``[0, n_1, ..., n_local]`` of the canonical blocks.
    n_parts : int
        Number of canonical blocks over all ranks.
    comm : prbmrm.comm.SerialComm or MPIComm
    upper : float
        Upper bound of the box, > 0.
    equality : bool
        With the constraint ``sum_i y_i alpha_i = 0``; without it the
        projection is a clip and needs no communication.

    Attributes
    ----------
    trials : int
        Trial multipliers of the last call (one reproducible sum each).
    """

    def __init__(self, y, bounds, n_parts, comm, upper, equality=True):
        self.y = np.asarray(y, dtype=np.float64)
        self.comm = comm
        self.n_parts = n_parts
        self.upper = float(upper)
        self.equality = equality
        self._starts = np.asarray(bounds[:-1], dtype=np.int64)
        self._positives = segment_sums(self.y > 0, self._starts)
        counts = comm.allreduce_sum(np.array([np.count_nonzero(self.y > 0),
                                              np.count_nonzero(self.y < 0)], dtype=np.int64))
        self._n_positive, self._n_negative = (int(c) for c in counts)
        self.trials = 0

    def __call__(self, v, guess=0.0):
        """Project this rank's entries `v`; return ``(alpha, nu)`` (`nu` is 0 without the equality).

        Parameters
        ----------
        v : ndarray of shape (n_local,)
        guess : float
            A first trial multiplier, e.g. the previous projection's.
        """
        self.trials = 0
        if not self.equality:
            return np.clip(v, 0.0, self.upper), 0.0
        u = self.upper
        low = breakpoints(v, self.y, u)
        extremes = self.comm.allreduce_max([-np.min(low, initial=np.inf), np.max(low, initial=-np.inf)])
        a, b = -extremes[0], extremes[1] + u
        # At a every alpha_i of y_i = +1 is upper and every other is 0; at b the other way round.
        g_a, g_b = u * self._n_positive, -u * self._n_negative
        if g_a <= 0:
            nu = a
        elif g_b >= 0:
            nu = b
        else:
            nu = self._search(low, a, b, g_a, g_b, guess)
        return alpha_at(v, self.y, u, nu), float(nu)

    def _search(self, low, a, b, g_a, g_b, t):
        """The bracketed search of the class docstring; returns the multiplier."""
        u, starts = self.upper, self._starts
        # On the bracket, g restricted to a block is offset - sloped * nu minus the sum of
        # clip(nu - l_i, 0, u) over its undecided examples, kept in block order in `low`.
        offset = u * self._positives
        sloped = np.zeros(len(starts))
        origin = None  # the bracket end that t is a Newton step from: "a" or "b"
        if not a < t < b:
            t = 0.5 * (a + b)
        while True:
            self.trials += 1
            high = low + u
            partial = np.zeros((len(starts), 5))
            partial[:, 0] = offset - sloped * t - segment_sums(np.clip(t - low, 0.0, u), starts)
            # Integer counts are summed exactly; they ride in the first block's row. g's slope
            # just right of t is minus the number of examples with low <= t < high, just left
            # of it minus the number with low < t <= high.
            inner = sloped.sum() + np.count_nonzero((low < t) & (t < high))
            partial[0, 1] = inner + np.count_nonzero(low == t)
            partial[0, 2] = inner + np.count_nonzero(high == t)
            partial[0, 3] = _count_between(low, high, a, t)
            partial[0, 4] = _count_between(low, high, t, b)
            g_t, slope_right, slope_left, left, right = self.comm.reproducible_sum(partial, self.n_parts)
            # No breakpoint between Newton's origin and t: g is linear there and t is its root
            # (g_t is then rounding noise, whose sign must not move the bracket).
            if g_t == 0 or (origin == "a" and left == 0) or (origin == "b" and right == 0):
                return t
            if g_t > 0:
                a, g_a, inside, origin, slope = t, g_t, right, "a", slope_right
            else:
                b, g_b, inside, origin, slope = t, g_t, left, "b", slope_left
            if inside == 0:
                return interpolate_root(a, b, g_a, g_b)
            saturated = high <= a
            spanning = (low <= a) & (high >= b)
            offset = offset + segment_sums(np.where(spanning, low, 0.0) - u * saturated, starts)
            sloped = sloped + segment_sums(spanning, starts)
            keep = ~(saturated | spanning | (low >= b))
            starts = np.concatenate([[0], np.cumsum(segment_sums(keep, starts)[:-1])]).astype(np.int64)
            low = np.compress(keep, low)
            newton = t + g_t / slope if slope > 0 else np.nan
            if newton == t:  # the root is within rounding of t
                return t
            if not a < newton < b:
                # Newton left the bracket: secant, and bisection if that stalls at an end.
                newton, origin = interpolate_root(a, b, g_a, g_b), None
                if not a < newton < b:
                    newton = 0.5 * (a + b)
            t = newton


def _count_between(low, high, a, b):
    """Number of breakpoints (entries of `low` and `high`) strictly between a and b."""
    return (np.count_nonzero((low > a) & (low < b)) + np.count_nonzero((high > a) & (high < b)))


class SVMDual:
    """The hinge SVM's dual on the data of a :class:`prbmrm.risk.DistributedRisk`, on every rank.

    Parameters
    ----------
    risk : prbmrm.risk.DistributedRisk
        Supplies this rank's canonical blocks (X, y), the communicator and n.
    lam : float
        Regularization constant.
    offset : bool
        The last column of X is the constant 1 and its weight is the
        unregularized offset b: the feasible set gets ``sum_i y_i alpha_i = 0``
        and ``w(alpha)`` leaves that coordinate 0 (paper 001, eq. 20-22).

    Attributes
    ----------
    y : ndarray
        This rank's labels, in block order.
    n : int
        Number of examples over all ranks.
    upper : float
        ``1 / n``, the box's upper bound.
    mask : ndarray
        1 on the regularized coordinates of w, 0 on the offset's.
    project : DistributedProjection
        Projection onto the feasible set.
    problem : str or None
        Why the data do not suit the dual (labels not +-1, no constant last
        column for the offset); the same on every rank.
    seconds : dict
        Seconds this rank spent in data passes (``"data"``) and in the
        reproducible sums of d-vectors (``"comm"``), accumulated.
    """

    def __init__(self, risk, lam, offset):
        self.comm = risk.comm
        self.lam = float(lam)
        self.n = risk.n_total
        self.n_parts = risk.n_parts
        self.upper = 1.0 / self.n
        self._X = [X for X, _ in risk.blocks]
        self.y = np.concatenate([np.asarray(y, dtype=np.float64) for _, y in risk.blocks])
        self._bounds = np.concatenate([[0], np.cumsum([X.shape[0] for X in self._X])])
        self.dim = risk.dim
        self.mask = np.ones(self.dim)
        if offset:
            self.mask[-1] = 0.0
        last = np.zeros(self.dim)
        last[-1] = 1.0
        flags = [float(not np.all(np.abs(self.y) == 1.0)),
                 float(offset and not all(np.all(X @ last == 1.0) for X in self._X))]
        bad_labels, no_offset = self.comm.allreduce_max(flags)
        self.problem = ("the dual of the hinge SVM needs labels in {-1, +1}" if bad_labels else
                        "the offset needs a constant last feature 1 (train with --bias)"
                        if no_offset else None)
        self.project = DistributedProjection(self.y, self._bounds, self.n_parts, self.comm,
                                             self.upper, equality=offset)
        self.seconds = {"data": 0.0, "comm": 0.0}

    def block_sums(self, values):
        """Per-block sums of a local per-example vector, shape (blocks,)."""
        return segment_sums(values, self._bounds[:-1])

    def adjoint(self, columns, extras=()):
        """Return ``[X^T c for c in columns]`` and the totals of `extras`, summed over all ranks.

        Parameters
        ----------
        columns : sequence of ndarray of shape (n_local,)
        extras : sequence of ndarray of shape (blocks,)
            Per-block partial sums of scalars (:meth:`block_sums`) that ride in
            the same reproducible sum.

        Returns
        -------
        vectors : list of ndarray of shape (dim,)
        totals : ndarray of shape (len(extras),)
        """
        started = time.perf_counter()
        k, d = len(columns), self.dim
        partial = np.empty((len(self._X), k * d + len(extras)))
        for row, (X, a, b) in enumerate(zip(self._X, self._bounds[:-1], self._bounds[1:])):
            for j, c in enumerate(columns):
                partial[row, j * d:(j + 1) * d] = X.T @ c[a:b]
        for j, extra in enumerate(extras):
            partial[:, k * d + j] = extra
        summed = time.perf_counter()
        total = self.comm.reproducible_sum(partial, self.n_parts)
        self.seconds["data"] += summed - started
        self.seconds["comm"] += time.perf_counter() - summed
        return [total[j * d:(j + 1) * d] for j in range(k)], total[k * d:]

    def scores(self, w):
        """Return ``X w`` for this rank's examples (no communication)."""
        started = time.perf_counter()
        z = np.concatenate([X @ w for X in self._X]) if self._X else np.zeros(0)
        self.seconds["data"] += time.perf_counter() - started
        return z

    def weights(self, alpha_y):
        """Return ``w(alpha) = mask * X^T (alpha y) / lam`` from ``X^T (alpha y)``."""
        return self.mask * alpha_y / self.lam

    def lipschitz(self, tol=1e-4, max_iter=100):
        """Estimate L, the Lipschitz constant of grad D: ``sigma_max(X_w)^2 / lam``.

        X_w is X without the offset's column. Power iterations on ``X_w^T X_w``
        from a fixed random start (the same on every rank) stop when the
        Rayleigh quotient ``rho`` changes by less than `tol` relative. ``rho``
        approaches sigma_max^2 from below, so the estimate is ``1.1 rho``,
        capped by the certified bound ``||X_w||_F^2`` (trace of X_w^T X_w).

        Returns
        -------
        float
            L, > 0.
        """
        squares = self.block_sums(np.concatenate([
            np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X) else np.einsum("ij,ij->i", X, X)
            for X in self._X]))
        v = self.mask * np.random.default_rng(0).standard_normal(self.dim)
        rho = 0.0
        for iteration in range(max_iter):
            v /= np.linalg.norm(v)
            (product,), (frobenius,) = self.adjoint([self.scores(v)], [squares])
            product *= self.mask
            previous, rho = rho, float(v @ product)
            if not np.any(product) or abs(rho - previous) <= tol * rho:
                break
            v = product
        # The offset's column of ones adds 1 per example to ||X||_F^2.
        frobenius -= self.n if self.mask[-1] == 0.0 else 0.0
        bound = min(1.1 * rho, frobenius)
        return max(bound, np.finfo(np.float64).eps) / self.lam
