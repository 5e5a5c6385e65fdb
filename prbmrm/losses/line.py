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
- ``evaluate_parts(etas, lo, hi)``: the same sums kept apart per *part*, a
  block of consecutive rows: the risk oracle holds one line object per group
  of blocks (:meth:`prbmrm.losses.Loss.lines`) and adds the parts in a
  reproducible sum. A part's sums are formed from its own rows alone (:func:`block_sums`
  over its rows, ``np.bincount`` in their order over its breakpoints), so
  they do not depend on which other parts share the object: the same on
  any number of ranks.

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


def block_sums(values, starts):
    """Sums of `values` over the blocks between consecutive `starts`, each of its own entries only.

    One ``np.add.reduceat``: a block's sum depends on its entries alone, not
    on where it lies in `values` (the same whichever blocks a rank holds).
    """
    values, starts = np.asarray(values, dtype=np.float64), np.asarray(starts, dtype=np.intp)
    empty = starts[1:] == starts[:-1]
    if len(values) == 0:
        return np.zeros(len(empty))
    sums = np.add.reduceat(values, np.minimum(starts[:-1], len(values) - 1))
    sums[empty] = 0.0
    return sums


class _Line:
    """What every line object shares: the whole sum from the sums per part."""

    def evaluate(self, etas, lo, hi):
        """Return the sums over all parts and the nearest breakpoints at each of `etas` (5 x K).

        See :meth:`evaluate_parts` for the rows; here the three sums are
        added over the parts.
        """
        sums, ends = self.evaluate_parts(etas, lo, hi)
        return np.vstack([sums.sum(axis=0), ends])

    def evaluate_parts(self, etas, lo, hi):
        """Return ``(sums, ends)`` at the increasing steps `etas` inside [lo, hi).

        Returns
        -------
        sums : ndarray of shape (parts, 3, K)
            Per part: the sum of losses, of their left and of their right
            slopes at each step.
        ends : ndarray of shape (2, K)
            Over all parts, around each step, the largest breakpoint after
            the previous step (lo before the first) and the smallest before
            the next one (hi after the last); the neighbouring step itself
            where there is none.
        """
        raise NotImplementedError


class BlockLines(_Line):
    """The line objects of consecutive blocks, one part each: the default of :meth:`prbmrm.losses.Loss.lines`.

    Parameters
    ----------
    lines : list of line objects
        One per block, each of one part.
    """

    def __init__(self, lines):
        self._lines = lines
        self.exact = all(line.exact for line in lines)

    def evaluate_parts(self, etas, lo, hi):
        k = len(etas)
        sums, ends = np.empty((len(self._lines), 3, k)), np.array([[-np.inf] * k, [np.inf] * k])
        for part, line in zip(sums, self._lines):
            values = line.evaluate(etas, lo, hi)
            part[:] = values[:3]
            np.maximum(ends[0], values[3], out=ends[0])
            np.minimum(ends[1], values[4], out=ends[1])
        return sums, ends


class PiecewiseLinearLine(_Line):
    """Sums of convex piecewise-linear functions of eta >= 0, one per part, from their slope jumps.

    The sum of part q is ``value0_q + eta slope0_q + sum_{j in q: breaks_j <=
    eta} jumps_j (eta - breaks_j)``. The breakpoints are never sorted: a
    round bins those inside the bracket between its K steps (O(n log K));
    as the bracket shrinks, breakpoints beyond it are dropped and those
    below it are folded into two constants per part, so a whole search
    costs about one pass over them.

    Parameters
    ----------
    value0, slope0 : float or ndarray of shape (parts,)
        The sums and their right derivatives at eta = 0.
    breaks : ndarray
        Every example's breakpoints in eta > 0 (with repeats, any order).
    jumps : ndarray
        The increase of the slope at each breakpoint (>= 0 for convex functions).
    owners : ndarray of int, optional
        The part of each breakpoint; all in part 0 by default.
    """

    exact = True

    def __init__(self, value0, slope0, breaks, jumps, owners=None):
        self._value0 = np.atleast_1d(np.asarray(value0, dtype=np.float64))
        # With the jumps folded in: those at or below the bracket.
        self._slope0 = np.atleast_1d(np.asarray(slope0, dtype=np.float64)).copy()
        self._offset = np.zeros(len(self._value0))  # per part, the sum of jumps * breaks folded in
        self._breaks, self._jumps = np.asarray(breaks, dtype=np.float64), np.asarray(jumps, dtype=np.float64)
        self._owners = np.zeros(len(self._breaks), dtype=np.intp) if owners is None else owners
        self._reach = np.inf  # every breakpoint up to here is known

    def _trace(self, eta):
        """Make every breakpoint up to eta known (all are, here)."""

    def _narrow(self, lo, hi):
        """Keep the breakpoints in (lo, hi]; fold those at or below lo into the constants."""
        breaks, jumps, owners, parts = self._breaks, self._jumps, self._owners, len(self._value0)
        below = breaks <= lo
        if below.any():
            self._slope0 += np.bincount(owners[below], jumps[below], parts)
            self._offset += np.bincount(owners[below], jumps[below] * breaks[below], parts)
        keep = ~below & (breaks <= hi)
        if not keep.all():
            self._breaks, self._jumps, self._owners = breaks[keep], jumps[keep], owners[keep]

    def _cumulative(self, slots, weights, k):
        """Per part, the running sums over the K steps of `weights` binned by `slots` (parts x K)."""
        binned = np.bincount(slots, weights, len(self._value0) * (k + 1)).reshape(-1, k + 1)
        return np.cumsum(binned, axis=1)[:, :k]

    def evaluate_parts(self, etas, lo, hi):
        """Return the sums per part, their left and right slopes, and the nearest breakpoints at `etas`.

        See :meth:`_Line.evaluate_parts`. Beyond the breakpoints known (see
        :class:`EnvelopeLine`) the smallest breakpoint after a step is no
        further than the last known point: an affine stretch is never
        claimed longer than it is. The left slope at eta = 0 is the right
        one (nothing is known left of 0).
        """
        etas = np.asarray(etas, dtype=np.float64)
        self._trace(etas[-1])
        self._narrow(lo, hi)
        breaks, jumps, k = self._breaks, self._jumps, len(etas)
        after = np.searchsorted(etas, breaks, "left")  # the steps from here on are >= the breakpoint
        inside = after < k
        # Breakpoints exactly at a step: the steps from after + 1 on are > them.
        hit = inside & (breaks == etas[np.minimum(after, k - 1)])
        slots = self._owners * (k + 1) + after
        right = self._slope0[:, None] + self._cumulative(slots, jumps, k)
        # Left slopes count the jumps strictly before each step: they differ only where a step hits one.
        left = self._slope0[:, None] + self._cumulative(slots + hit, jumps, k) if hit.any() else right
        offset = self._offset[:, None] + self._cumulative(slots, jumps * breaks, k)
        below, above = _neighbours(etas, lo, hi)
        between = ~hit
        strictly = inside & between
        np.maximum.at(below, after[strictly], breaks[strictly])
        strictly = (after > 0) & between
        np.minimum.at(above, after[strictly] - 1, breaks[strictly])
        sums = np.stack([self._value0[:, None] + etas * right - offset, left, right], axis=1)
        return sums, np.array([below, np.minimum(above, self._reach)])


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
        self._owners = np.zeros(len(self._breaks), dtype=np.intp)


class GenericLine(_Line):
    """A loss along a line evaluated afresh at every trial step, O(n): the search is not exact.

    Left and right slopes are equal (the derivative, or one subgradient's
    slope where the loss has a kink), and no breakpoint is known.

    Parameters
    ----------
    sums : callable
        ``sums(eta)`` returns, per part, the sum of losses and of their
        slopes in eta at the step eta (parts x 2).
    """

    exact = False

    def __init__(self, sums):
        self._sums = sums

    def evaluate_parts(self, etas, lo, hi):
        values = np.array([self._sums(eta) for eta in etas])  # K x parts x 2
        value, slope = values[:, :, 0].T, values[:, :, 1].T
        return np.stack([value, slope, slope], axis=1), _neighbours(etas, lo, hi)
