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
:func:`upper_envelope` traces it on eta >= 0 once (scalar losses find their
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
        order = np.argsort(breaks, kind="stable")
        self._breaks = np.asarray(breaks, dtype=np.float64)[order]
        jumps = np.asarray(jumps, dtype=np.float64)[order]
        self._value0, self._slope0 = float(value0), float(slope0)
        self._slopes = np.concatenate([[0.0], np.cumsum(jumps)])
        self._offsets = np.concatenate([[0.0], np.cumsum(jumps * self._breaks)])

    def sums(self, etas):
        """Return the sums of the functions, their left and right slopes at each step of `etas` (3 x K).

        The left slope at eta = 0 is the right one (nothing is known left of 0).
        """
        left = np.searchsorted(self._breaks, etas, "left")
        right = np.searchsorted(self._breaks, etas, "right")
        slope = self._slope0 + self._slopes[right]
        return np.array([self._value0 + etas * slope - self._offsets[right], self._slope0 + self._slopes[left], slope])

    def nearest(self, etas, lo, hi):
        """Return, for each of the sorted `etas`, the largest breakpoint between it and the step before
        and the smallest between it and the step after (2 x K; lo and hi before the first and after the
        last step, and the neighbouring step itself where there is no breakpoint between)."""
        steps = np.concatenate([[lo], etas, [hi]])
        breaks = np.concatenate([[-np.inf], self._breaks, [np.inf]])  # sentinels: no index checks
        below = breaks[np.searchsorted(breaks, etas, "left") - 1]
        above = breaks[np.searchsorted(breaks, etas, "right")]
        return np.array([np.maximum(below, steps[:-2]), np.minimum(above, steps[2:])])


def upper_envelope(A, S):
    """Return the :class:`PiecewiseLinearLine` of ``sum_i max_j A_ji + eta S_ji`` on eta >= 0.

    Each example's upper envelope of its p lines is traced from eta = 0 by
    the next line to overtake the current one (paper 003, Alg. 4-5), all
    examples at once: O(n p) per piece.

    Parameters
    ----------
    A, S : ndarray of shape (p, n)
        Intercepts and slopes (in eta) of the p lines of the n examples, one
        row per line (reductions over lines then run along the fast axis).
    """
    A = np.ascontiguousarray(A, dtype=np.float64)
    S = np.ascontiguousarray(S, dtype=np.float64)
    p, n = A.shape
    # The line on top just right of eta = 0: the highest, then the steepest.
    top = np.argmax(np.where(A == A.max(axis=0), S, -np.inf), axis=0)[None]
    a, s = np.take_along_axis(A, top, axis=0)[0], np.take_along_axis(S, top, axis=0)[0]
    value0, slope0 = np.sum(a), np.sum(s)
    breaks, jumps = [np.empty(0)], [np.empty(0)]
    live, position = np.arange(n), np.zeros(n)
    for _ in range(p - 1):
        As, Ss = A[:, live], S[:, live]
        with np.errstate(divide="ignore", invalid="ignore"):
            # A steeper line overtakes the current one where they cross; rounding may put
            # that slightly before the current position, which is then the crossing.
            cross = np.where(Ss > s, np.maximum((a - As) / (Ss - s), position), np.inf)
        following = cross.min(axis=0)
        found = np.flatnonzero(np.isfinite(following))
        if not found.size:
            break
        live, position = live[found], following[found]
        # Of several lines crossing there, the steepest stays on top to the right.
        Ss = Ss[:, found]
        nxt = np.argmax(np.where(cross[:, found] == position, Ss, -np.inf), axis=0)[None]
        a, s_next = np.take_along_axis(As[:, found], nxt, axis=0)[0], np.take_along_axis(Ss, nxt, axis=0)[0]
        breaks.append(position)
        jumps.append(s_next - s[found])
        s = s_next
    return PiecewiseLinearLine(value0, slope0, np.concatenate(breaks), np.concatenate(jumps))


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
