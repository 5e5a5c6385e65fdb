"""Losses along a line, for the line search of LS-BMRM (paper 000, Alg. 3).

Along ``w(eta) = w_b + eta d`` the scores of a block are ``F0 + eta dF`` with
``F0 = X w_b`` and ``dF = X d``, computed once per line search. A loss turns
them into a *line object* (:meth:`prbmrm.losses.Loss.line`) with

- ``exact``: True if the loss is piecewise linear along lines;
- ``evaluate(etas, lo, hi)``: for a round of increasing trial steps inside
  the bracket [lo, hi), the sum of losses and the sums of their left and
  right slopes (one-sided derivatives in eta) at each step, and around each
  step the nearest breakpoints (steps where some example changes its linear
  piece) before the neighbouring steps. Later rounds stay inside the bracket.

A convex piecewise-linear loss is, per example, the maximum of a few lines in
eta (two for the hinge loss, k for the multiclass hinge, paper 003 Alg. 4-5):
:class:`EnvelopeLine` traces it on eta >= 0 (scalar losses find their
breakpoints directly from their kinks), and every trial decides an example's
piece by comparing eta with the same stored breakpoints. A trial placed
exactly on a breakpoint therefore sees the slopes of both neighbouring pieces,
and the search can stop where ``0 in [phi'_-(eta), phi'_+(eta)]`` holds
exactly.

Imports: numpy; of prbmrm: nothing of prbmrm.
"""

import numpy as np


def _neighbours(etas, lo, hi):
    """The steps before and after each of `etas` (lo before the first, hi after the last), 2 x K."""
    steps = np.concatenate([[lo], etas, [hi]])
    return np.array([steps[:-2], steps[2:]])


class PiecewiseLinearLine:
    """A sum of convex piecewise-linear functions of eta >= 0, from its slope jumps.

    The sum is ``value0 + eta slope0 + sum_{j: breaks_j <= eta} jumps_j (eta - breaks_j)``.
    The breakpoints are never sorted: a round bins those inside the bracket
    between its K steps (O(n log K)); as the bracket shrinks, breakpoints
    beyond it are dropped and those below it are folded into two constants,
    so a whole search costs about one pass over them.

    Parameters
    ----------
    value0, slope0 : float
        The sum and its right derivative at eta = 0.
    breaks : ndarray
        Every example's breakpoints in eta > 0 (with repeats, any order).
    jumps : ndarray
        The increase of the slope at each breakpoint (>= 0 for convex functions).
    """

    exact = True

    def __init__(self, value0, slope0, breaks, jumps):
        self._value0 = float(value0)
        self._slope0 = float(slope0)  # with the jumps folded in: those at or below the bracket
        self._offset = 0.0  # sum of jumps * breaks folded in
        self._breaks, self._jumps = np.asarray(breaks, dtype=np.float64), np.asarray(jumps, dtype=np.float64)
        self._reach = np.inf  # every breakpoint up to here is known

    def _trace(self, eta):
        """Make every breakpoint up to eta known (all are, here)."""

    def _narrow(self, lo, hi):
        """Keep the breakpoints in (lo, hi]; fold those at or below lo into the constants."""
        breaks, jumps = self._breaks, self._jumps
        below = breaks <= lo
        if below.any():
            self._slope0 += float(np.sum(jumps[below]))
            self._offset += float(np.dot(jumps[below], breaks[below]))
        keep = ~below & (breaks <= hi)
        if not keep.all():
            self._breaks, self._jumps = breaks[keep], jumps[keep]

    def evaluate(self, etas, lo, hi):
        """Return the sum, its left and right slopes and the nearest breakpoints at each of `etas` (5 x K).

        `etas` increase inside [lo, hi). Rows 3 and 4: the largest breakpoint
        between the previous step (lo before the first) and the step, and the
        smallest between the step and the next one (hi after the last); the
        neighbouring step itself where there is none. Beyond the breakpoints
        known (see :class:`EnvelopeLine`) row 4 is no further than the last
        known point: an affine stretch is never claimed longer than it is.
        The left slope at eta = 0 is the right one (nothing is known left of 0).
        """
        etas = np.asarray(etas, dtype=np.float64)
        self._trace(etas[-1])
        self._narrow(lo, hi)
        breaks, jumps, k = self._breaks, self._jumps, len(etas)
        after = np.searchsorted(etas, breaks, "left")  # the steps from here on are >= the breakpoint
        beyond = np.searchsorted(etas, breaks, "right")  # ... and from here on are > it
        weighted = jumps * breaks
        right = self._slope0 + np.cumsum(np.bincount(after, jumps, k + 1))[:k]
        left = self._slope0 + np.cumsum(np.bincount(beyond, jumps, k + 1))[:k]
        offset = self._offset + np.cumsum(np.bincount(after, weighted, k + 1))[:k]
        below, above = _neighbours(etas, lo, hi)
        inside = after < k
        strictly = inside & (breaks < etas[np.minimum(after, k - 1)])
        np.maximum.at(below, after[strictly], breaks[strictly])
        past = beyond > 0
        strictly = past & (breaks > etas[np.maximum(beyond, 1) - 1])
        np.minimum.at(above, beyond[strictly] - 1, breaks[strictly])
        return np.array([self._value0 + etas * right - offset, left, right, below, np.minimum(above, self._reach)])


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

    def _narrow(self, lo, hi):
        super()._narrow(lo, hi)
        if hi <= self._reach:  # no step will go further: the rest of the envelopes is not needed
            self._front = tuple(x[:0] for x in self._front)

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
        self._breaks = np.concatenate([self._breaks] + breaks)
        self._jumps = np.concatenate([self._jumps] + jumps)


class GenericLine:
    """A loss along a line evaluated afresh at every trial step, O(n): the search is not exact.

    :meth:`evaluate` takes the loss's ``line_values`` at ``F0 + eta dF``;
    left and right slopes are equal (the derivative, or one subgradient's
    slope where the loss has a kink), and no breakpoint is known.
    """

    exact = False

    def __init__(self, loss, F0, dF, y):
        self._loss, self._F0, self._dF, self._y = loss, F0, dF, y

    def evaluate(self, etas, lo, hi):
        """Return the sum of losses, its slope twice and the neighbouring steps at each of `etas` (5 x K)."""
        value, slope = np.array([self._loss.line_values(self._F0, self._dF, self._y, eta)
                                 for eta in etas]).reshape(-1, 2).T
        return np.vstack([value, slope, slope, _neighbours(etas, lo, hi)])
