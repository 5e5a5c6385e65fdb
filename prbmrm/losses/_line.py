"""Losses along a line, for the line search of LS-BMRM (paper 000, Alg. 3).

Along ``w(eta) = w_b + eta d`` the scores of a block are ``F0 + eta dF`` with
``F0 = X w_b`` and ``dF = X d``, computed once per line search. A loss turns
them into a *line object* (:meth:`prbmrm.losses.Loss.line`) with

- ``sums(etas)``: for each trial step, the sum of losses and the sums of
  their left and right slopes (one-sided derivatives in eta);
- ``exact``: True if the loss is piecewise linear along lines, and then
  ``nearest(etas, lo, hi)``: around each step, the nearest breakpoints (steps
  where some example changes its linear piece) before the neighbouring steps.

A convex piecewise-linear loss is, per example, the maximum of a few lines in
eta (two for the hinge loss, k for the multiclass hinge, paper 003 Alg. 4-5):
:class:`EnvelopeLine` traces it on eta >= 0 (scalar losses find their
breakpoints directly from their kinks), and every trial decides an example's
piece by comparing eta with the same stored breakpoints. A trial placed exactly on a breakpoint therefore sees the
slopes of both neighbouring pieces, and the search can stop where
``0 in [phi'_-(eta), phi'_+(eta)]`` holds exactly.
"""

import numpy as np


class PiecewiseLinearLine:
    """A sum of convex piecewise-linear functions of eta >= 0, from its slope jumps.

    The sum is ``value0 + eta slope0 + sum_{j: breaks_j <= eta} jumps_j (eta - breaks_j)``.
    The breakpoints are sorted once with prefix sums of the jumps, so a trial
    step costs two binary searches, O(log n).

    Parameters
    ----------
    value0, slope0 : float
        The sum and its right derivative at eta = 0.
    breaks : ndarray
        Every example's breakpoints in eta > 0 (with repeats, any order).
    jumps : ndarray
        The increase of the slope at each breakpoint (>= 0 for convex functions).

    Attributes
    ----------
    exact : bool
        True: :meth:`nearest` reports breakpoints.
    """

    exact = True

    def __init__(self, value0, slope0, breaks, jumps):
        self._value0, self._slope0 = float(value0), float(slope0)
        self._reach = np.inf  # every breakpoint up to here is known
        self._add(breaks, jumps)

    def _add(self, breaks, jumps):
        """Merge the events (breaks, jumps) into the sorted ones and their prefix sums."""
        if hasattr(self, "_breaks"):
            breaks = np.concatenate([self._breaks, breaks])
            jumps = np.concatenate([self._jumps, jumps])
        order = np.argsort(breaks, kind="stable")
        self._breaks = np.asarray(breaks, dtype=np.float64)[order]
        self._jumps = np.asarray(jumps, dtype=np.float64)[order]
        self._slopes = np.concatenate([[0.0], np.cumsum(self._jumps)])
        self._offsets = np.concatenate([[0.0], np.cumsum(self._jumps * self._breaks)])

    def _trace(self, eta):
        """Make every breakpoint up to eta known (all are, here)."""

    def sums(self, etas):
        """Return the sums of the functions, their left and right slopes at each step of `etas` (3 x K).

        The left slope at eta = 0 is the right one (nothing is known left of 0).
        """
        self._trace(np.max(etas))
        left = np.searchsorted(self._breaks, etas, "left")
        right = np.searchsorted(self._breaks, etas, "right")
        slope = self._slope0 + self._slopes[right]
        return np.array([self._value0 + etas * slope - self._offsets[right], self._slope0 + self._slopes[left],
                         slope])

    def nearest(self, etas, lo, hi):
        """Return, for each of the sorted `etas`, the largest breakpoint between it and the previous step
        and the smallest between it and the next step (2 x K; lo and hi are the steps before the first and
        after the last; the neighbouring step itself where there is no breakpoint between).

        Beyond the breakpoints known (see :class:`EnvelopeLine`) the smallest
        is reported no further than the last known point: an affine stretch
        is never claimed longer than it is.
        """
        self._trace(np.max(etas))
        steps = np.concatenate([[lo], etas, [hi]])
        breaks = np.concatenate([[-np.inf], self._breaks, [np.inf]])  # sentinels: no index checks
        below = breaks[np.searchsorted(breaks, etas, "left") - 1]
        above = breaks[np.searchsorted(breaks, etas, "right")]
        return np.array([np.maximum(below, steps[:-2]), np.minimum(np.minimum(above, steps[2:]), self._reach)])


class EnvelopeLine(PiecewiseLinearLine):
    """``sum_i max_j A_ji + eta S_ji`` on eta >= 0: every example's upper envelope of its p lines.

    Each envelope is traced from eta = 0 by the next line to overtake the
    current one (paper 003, Alg. 4-5), all examples at once, O(n p) per piece.
    Only as far as the steps asked for, though (doubling the reach when a
    larger step comes): the search rarely looks far, and most pieces lie
    beyond. The steps are the same on every rank, so the pieces traced do not
    depend on the number of ranks.

    Parameters
    ----------
    A, S : ndarray of shape (p, n)
        Intercepts and slopes (in eta) of the p lines of the n examples, one
        row per line (reductions over lines then run along the fast axis).
    """

    def __init__(self, A, S):
        self._A = A = np.ascontiguousarray(A, dtype=np.float64)
        self._S = S = np.ascontiguousarray(S, dtype=np.float64)
        n = A.shape[1]
        # The line on top just right of eta = 0: the highest, then the steepest.
        top = np.argmax(np.where(A == A.max(axis=0), S, -np.inf), axis=0)[None]
        a, s = np.take_along_axis(A, top, axis=0)[0], np.take_along_axis(S, top, axis=0)[0]
        super().__init__(np.sum(a), np.sum(s), np.empty(0), np.empty(0))
        # The examples whose envelope may go on: their current line and position.
        self._front = (np.arange(n), a, s, np.zeros(n))
        self._reach = 0.0

    def _trace(self, eta):
        if eta <= self._reach:
            return
        reach = max(eta, 2.0 * self._reach)
        live, a, s, position = self._front
        later, breaks, jumps = [tuple(x[:0] for x in self._front)], [], []
        while live.size:
            As, Ss = self._A[:, live], self._S[:, live]
            with np.errstate(divide="ignore", invalid="ignore"):
                # A steeper line overtakes the current one where they cross; rounding may put
                # that slightly before the current position, which is then the crossing.
                cross = np.where(Ss > s, np.maximum((a - As) / (Ss - s), position), np.inf)
            following = cross.min(axis=0)
            ahead = following <= reach
            beyond = np.isfinite(following) & ~ahead
            later.append((live[beyond], a[beyond], s[beyond], position[beyond]))
            found = np.flatnonzero(ahead)
            live, position = live[found], following[found]
            # Of several lines crossing there, the steepest stays on top to the right.
            Ss = Ss[:, found]
            nxt = np.argmax(np.where(cross[:, found] == position, Ss, -np.inf), axis=0)[None]
            a, s_next = np.take_along_axis(As[:, found], nxt, axis=0)[0], np.take_along_axis(Ss, nxt, axis=0)[0]
            breaks.append(position)
            jumps.append(s_next - s[found])
            s = s_next
        self._front = tuple(np.concatenate(parts) for parts in zip(*later))
        self._reach = reach
        if breaks:
            self._add(np.concatenate(breaks), np.concatenate(jumps))


class GenericLine:
    """A loss along a line evaluated afresh at every trial, O(n): the search is not exact.

    ``sums(eta)`` returns the loss's :meth:`line_values` at ``F0 + eta dF``;
    left and right slopes are equal (the derivative, or one subgradient's
    slope where the loss has a kink).
    """

    exact = False

    def __init__(self, loss, F0, dF, y):
        self._loss, self._F0, self._dF, self._y = loss, F0, dF, y

    def sums(self, etas):
        """Return the sums of the losses, their left and right slopes at each step of `etas` (3 x K)."""
        values = np.array([self._loss.line_values(self._F0, self._dF, self._y, eta) for eta in etas]).T
        return np.array([values[0], values[1], values[1]]).reshape(3, len(etas))
