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
(:meth:`prbmrm.distributed.oracle.DistributedRisk.attach`).

Imports: numpy, scipy; of prbmrm: nothing of prbmrm.
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


class Segments:
    """Consecutive segments of a per-example array (the canonical blocks), each summed on its own.

    A block's sum (``np.add.reduceat`` over its segment) does not depend on
    what precedes it in the array, so on any number of ranks a canonical block
    gives bitwise the same sum.

    Parameters
    ----------
    lengths : array_like of int
        Length of each segment, in order; zero-length segments sum to 0.
    """

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self._filled = self.lengths > 0
        self._starts = (np.cumsum(self.lengths) - self.lengths)[self._filled]

    def __len__(self):
        return len(self.lengths)

    def sums(self, values):
        """Return the sum of `values` over each segment, shape (len(self),)."""
        sums = np.zeros(len(self.lengths))
        if len(self._starts):
            sums[self._filled] = np.add.reduceat(values, self._starts, dtype=np.float64)
        return sums


class DistributedProjection:
    """Projection onto ``{0 <= alpha <= upper, sum_i y_i alpha_i = 0}`` of a vector spread over ranks.

    Each rank passes its own entries of v. The multiplier ``nu`` with
    ``alpha = clip(v - nu y, 0, upper)`` is a root of the nonincreasing,
    piecewise linear ``g(nu) = sum_i y_i alpha_i(nu)`` (module docstring),
    found by a safeguarded Newton search on the bracket
    ``[min_i l_i, max_i l_i + upper]``:

    1. every rank evaluates its blocks' parts of g at one or two trial points,
       its counts of examples on a sloped piece just left and just right of
       each (g's one-sided slopes are minus the totals) and its counts of
       breakpoints strictly between consecutive points and bracket ends; one
       reproducible sum over the canonical blocks combines them (a single
       Allreduce: the values have known bounds);
    2. the points where g changes sign become the new bracket; if it holds no
       breakpoint, g is linear on it and its root is found by interpolation,
       exact up to rounding;
    3. otherwise examples whose breakpoints left the bracket become per-block
       constants (the "aggregation of slope and offset" of the appendix), and
       the next points are Newton's ``t + g(t) / slope`` from the bracket end
       with the shorter step, plus a guard a quarter step beyond it so that
       the next bracket is usually tight on both sides; if Newton's point
       falls outside the bracket, the secant of the bracket (its midpoint
       after a secant round, which halves the bracket at least every other
       round). When no breakpoint lies between Newton's point and its origin,
       g is linear there and the point is the root.

    The bracket shrinks strictly at every round, so the search ends; every
    decision uses sums that do not depend on the number of ranks, so 1, 2 or
    3 ranks holding the same blocks find bitwise the same multiplier. Warm
    started near the root (Pragam's successive projections), it takes two or
    three rounds, each O(number of examples still undecided).

    Parameters
    ----------
    y : ndarray of shape (n_local,)
        This rank's labels, each -1 or +1.
    bounds : sequence of int
        Local boundaries ``[0, n_1, ..., n_local]`` of the canonical blocks.
    n_parts : int
        Number of canonical blocks over all ranks.
    comm : prbmrm.distributed.comm.SerialComm or MPIComm
    upper : float
        Upper bound of the box, > 0.
    equality : bool
        With the constraint ``sum_i y_i alpha_i = 0``; without it the
        projection is a clip and needs no communication.

    Attributes
    ----------
    trials : int
        Rounds of the last call (one Allreduce each).
    """

    def __init__(self, y, bounds, n_parts, comm, upper, equality=True):
        self.y = np.asarray(y, dtype=np.float64)
        self.comm = comm
        self.n_parts = n_parts
        self.upper = float(upper)
        self.equality = equality
        self._blocks = Segments(np.diff(bounds))
        self._positives = self._blocks.sums(self.y > 0)
        self._shift = self.upper * (self.y > 0)  # breakpoints(v, y, upper) = y v - shift
        counts = comm.allreduce_sum(np.array([np.count_nonzero(self.y > 0),
                                              np.count_nonzero(self.y < 0)], dtype=np.int64))
        self._n_positive, self._n_negative = (int(c) for c in counts)
        self._g_bound = self.upper * comm.allreduce_max([np.max(np.diff(bounds), initial=0)])[0]
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
        low = self.y * v - self._shift
        extremes = self.comm.allreduce_max([-np.min(low, initial=np.inf), np.max(low, initial=-np.inf)])
        a, b = -extremes[0], extremes[1] + u
        if not np.isfinite(b - a):  # v is not finite on some rank
            return np.full_like(v, np.nan), np.nan
        # At a every alpha_i of y_i = +1 is upper and every other is 0; at b the other way round.
        g_a, g_b = u * self._n_positive, -u * self._n_negative
        if g_a <= 0:
            nu = a
        elif g_b >= 0:
            nu = b
        else:
            nu = self._search(low, a, b, g_a, g_b, guess)
        return alpha_at(v, self.y, u, nu), float(nu)

    def _search(self, low, a, b, g_a, g_b, guess):
        """The bracketed search of the class docstring; returns the multiplier."""
        u, blocks = self.upper, self._blocks
        # On the bracket, g restricted to a block is offset - sloped * nu minus the sum of
        # clip(nu - l_i, 0, u) over its undecided examples, kept in block order in `low`.
        offset = u * self._positives
        sloped = np.zeros(len(blocks))
        # This rank's breakpoints <= a and < b among the undecided examples.
        at_a = _breakpoints_below(low, u, a, inclusive=True)
        at_b = _breakpoints_below(low, u, b, inclusive=False)
        points, origin = [guess if a < guess < b else 0.5 * (a + b)], None
        while True:
            self.trials += 1
            g, right, left, below, upto, inside = self._evaluate(low, blocks, offset, sloped, points,
                                                                 at_a, at_b)
            for p, g_p in zip(points, g):
                if g_p == 0:
                    return p
            # No breakpoint between Newton's point and its origin: g is linear there and the
            # point is its root (g there is rounding noise, whose sign must not move the bracket).
            if (origin == "a" and inside[0] == 0) or (origin == "b" and inside[-1] == 0):
                return points[0] if origin == "a" else points[-1]
            k = int(np.count_nonzero(g > 0))  # the root lies between point k - 1 and point k
            if k > 0:
                a, g_a, at_a = points[k - 1], g[k - 1], upto[k - 1]
            if k < len(points):
                b, g_b, at_b = points[k], g[k], below[k]
            if inside[k] == 0:
                return interpolate_root(a, b, g_a, g_b)
            high = low + u
            saturated = high <= a
            spanning = (low <= a) & (high >= b)
            offset = offset + blocks.sums(np.where(spanning, low, 0.0) - u * saturated)
            sloped = sloped + blocks.sums(spanning)
            keep = ~(saturated | spanning | (low >= b))
            removed = 2 * np.count_nonzero(saturated) + np.count_nonzero(spanning)
            at_a, at_b = at_a - removed, at_b - removed
            blocks = Segments(blocks.sums(keep))
            low = np.compress(keep, low)
            # Newton from the end with the shorter step, plus a guard a quarter step beyond
            # it, so that one round usually brackets the root tightly from both sides.
            previous, newtons = origin, []
            if k > 0 and right[k - 1] > 0:
                newtons.append((g_a / right[k - 1], a, "a"))
            if k < len(points) and left[k] > 0:
                newtons.append((g_b / left[k], b, "b"))
            step, end, origin = min(newtons, key=lambda n: abs(n[0])) if newtons else (np.nan, a, None)
            newton = end + step
            if newton == end:  # the root is within rounding of that end
                return end
            if a < newton < b:
                points = sorted(p for p in {newton, newton + 0.25 * step} if a < p < b)
            else:
                # No Newton step inside the bracket: the secant, but the midpoint if the last
                # round was a secant too (the secant alone can creep along a flat g).
                secant = interpolate_root(a, b, g_a, g_b)
                bisect = previous == "secant" or not a < secant < b
                points, origin = [0.5 * (a + b) if bisect else secant], None if bisect else "secant"

    def _evaluate(self, low, blocks, offset, sloped, points, at_a, at_b):
        """g, its one-sided slopes and breakpoint counts at the sorted trial `points`, over all ranks.

        Returns global arrays: g and the numbers of sloped examples just right
        and just left of each point (minus g's one-sided slopes); this rank's
        numbers of breakpoints below and up to each point; and the global
        numbers of breakpoints strictly inside the len(points) + 1 intervals
        that the points cut the bracket into.
        """
        u, m = self.upper, len(points)
        high = low + u
        partial = np.zeros((len(blocks), 4 * m + 1))
        below, upto = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
        for j, p in enumerate(points):
            # g restricted to a block b lies in [-u n_b, u n_b]; the clip removes only rounding
            # excess, so that the fixed-point sum below may take u max_b n_b as its bound.
            partial[:, j] = np.clip(offset - sloped * p - blocks.sums(np.clip(p - low, 0.0, u)),
                                    -self._g_bound, self._g_bound)
            low_below, high_below = np.count_nonzero(low < p), np.count_nonzero(high < p)
            low_upto, high_upto = np.count_nonzero(low <= p), np.count_nonzero(high <= p)
            below[j], upto[j] = low_below + high_below, low_upto + high_upto
            # Examples on a sloped piece just right of p: low <= p < high; just left: low < p <= high.
            partial[0, m + j] = low_upto - high_upto
            partial[0, 2 * m + j] = low_below - high_below
        # Counts are integers, summed exactly; they ride in the first block's row.
        partial[0, m:3 * m] += sloped.sum()
        partial[0, 3 * m:-1] = below - np.concatenate([[at_a], upto[:-1]])
        partial[0, -1] = at_b - upto[-1]
        # Known bounds (for g, and the number of breakpoints for counts) save the Allreduce-max.
        bound = np.full(4 * m + 1, 2.0 * (self._n_positive + self._n_negative))
        bound[:m] = self._g_bound
        total = self.comm.reproducible_sum(partial, self.n_parts, bound)
        return (total[:m], total[m:2 * m], total[2 * m:3 * m], below, upto, total[3 * m:])


def _breakpoints_below(low, upper, x, inclusive):
    """Number of breakpoints (entries of `low` and ``low + upper``) below `x` (or equal, if `inclusive`)."""
    below = np.less_equal if inclusive else np.less
    return np.count_nonzero(below(low, x)) + np.count_nonzero(below(low + upper, x))


class SVMDual:
    """The hinge SVM's dual on the data of a :class:`prbmrm.distributed.oracle.DistributedRisk`, on every rank.

    Parameters
    ----------
    risk : prbmrm.distributed.oracle.DistributedRisk
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
    data_seconds : float
        Seconds this rank spent in passes over its data, accumulated.
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
        self._blocks = Segments(np.diff(self._bounds))
        self._XT = [X.T for X in self._X]  # built once: scipy's transpose is a new object per call
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
        self.data_seconds = 0.0

    def block_sums(self, values):
        """Per-block sums of a local per-example vector, shape (blocks,)."""
        return self._blocks.sums(values)

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
        for row, (XT, a, b) in enumerate(zip(self._XT, self._bounds[:-1], self._bounds[1:])):
            for j, c in enumerate(columns):
                partial[row, j * d:(j + 1) * d] = XT @ c[a:b]
        for j, extra in enumerate(extras):
            partial[:, k * d + j] = extra
        self.data_seconds += time.perf_counter() - started
        total = self.comm.reproducible_sum(partial, self.n_parts)
        return [total[j * d:(j + 1) * d] for j in range(k)], total[k * d:]

    def scores(self, w):
        """Return ``X w`` for this rank's examples (no communication)."""
        started = time.perf_counter()
        z = np.concatenate([X @ w for X in self._X])
        self.data_seconds += time.perf_counter() - started
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
        # The offset's column of ones adds 1 per example to ||X||_F^2.
        frobenius = self.adjoint([], [squares])[1][0] - (self.n if self.mask[-1] == 0.0 else 0.0)
        v = self.mask * np.random.default_rng(0).standard_normal(self.dim)
        rho = 0.0
        for _ in range(max_iter):
            norm = np.linalg.norm(v)
            if norm == 0.0:  # X_w v = 0: no larger singular value is left to find
                break
            (product,), _ = self.adjoint([self.scores(v / norm)])
            product *= self.mask
            previous, rho = rho, float(v @ product) / norm
            if abs(rho - previous) <= tol * rho:
                break
            v = product
        bound = min(1.1 * rho, frobenius)
        return max(bound, np.finfo(np.float64).eps) / self.lam
