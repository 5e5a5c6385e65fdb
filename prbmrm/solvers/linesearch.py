"""The line search of LS-BMRM: minimize ``phi(eta) = lam * Omega(w + eta d) + R_emp(w + eta d)`` over eta >= 0.

phi is convex. A *line* (:meth:`prbmrm.distributed.oracle.DistributedRisk.line`, or
:class:`OracleLine` over any risk oracle) evaluates a round of trial steps at
once: ``R_emp`` and its one-sided derivatives in eta at each, and, for a loss
that is piecewise linear along lines, the breakpoints nearest to each; the
regularizer adds its part on rank 0 (``regularizer.line``).

:func:`minimize_line` keeps a bracket with ``phi'_+(lo) < 0 < phi'_-(hi)``.
Each round tries the regula falsi step on the derivative (Illinois variant)
and, if the line takes several steps per round, steps around it and a grid
over the bracket (geometric where the bracket spans orders of magnitude).
When the search is *exact* (a piecewise-linear loss and a quadratic Omega),
phi' is affine between breakpoints, so

- a bracket without a breakpoint inside is solved in closed form: the root of
  the line through ``phi'_+(lo)`` and ``phi'_-(hi)``;
- a step that would fall in the breakpoint-free stretch next to an end of the
  bracket goes to the breakpoint closing that stretch instead, where both
  one-sided derivatives are known exactly;

and it stops where ``0 in [phi'_-(eta), phi'_+(eta)]``. Otherwise (smooth or
other losses) the same bracketing is a safeguarded secant search that stops
when the best value found is within ``ftol`` (relative) of the lower bound of
min phi given by the tangents at the bracket's ends, or the bracket is
shorter than ``xtol`` relative.

Imports: numpy; of prbmrm: nothing of prbmrm.
"""

import math
from collections import namedtuple

import numpy as np

LinePoint = namedtuple("LinePoint", ["eta", "value", "left", "right", "below", "above"])
LinePoint.__doc__ = """A trial step: phi(eta), its left and right derivatives, and the breakpoints
nearest to eta before the neighbouring steps of its round (those steps if none)."""

# Zoom steps around the regula falsi step, as fractions of the bracket.
_ZOOM = (1 / 8, -1 / 8, 1 / 64, -1 / 64, 1 / 512, -1 / 512)


def minimize_line(phi, exact=False, points=1, first=1.0, ftol=1e-10, xtol=1e-12, max_rounds=100):
    """Minimize a convex function of eta >= 0 from its one-sided derivatives.

    Parameters
    ----------
    phi : callable
        ``phi(etas, lo, hi) -> list of LinePoint`` for increasing steps in
        [lo, hi) (hi may be inf).
    exact : bool
        phi' is affine between the breakpoints phi reports (see the module).
    points : int
        Most steps per round (>= 1).
    first : float
        The largest step of the first round; the others are 0 and
        ``first / 4**j`` (with one step per round, the second round's).
    ftol : float
        Inexact search: stop when the best value is within ``ftol * |value|``
        of the lower bound of min phi from the tangents at the bracket's ends.
    xtol : float
        Stop when the bracket is shorter than ``xtol * hi``.
    max_rounds : int
        At most this many rounds.

    Returns
    -------
    point : LinePoint
        The minimizer found, one of the evaluated steps (0 if phi does not
        decrease from 0).
    rounds : int
        Rounds of evaluations of phi.
    """
    etas = [0.0] + [first / 4.0 ** j for j in range(points - 2, -1, -1)]
    lo = hi = None
    best, g_lo, g_hi, moved = None, None, math.inf, None
    free_lo, free_hi = math.inf, -math.inf  # phi' is affine on (lo, free_lo) and on (free_hi, hi)
    widths = [math.inf, math.inf]  # of the bracket after the last two rounds
    for rounds in range(1, max_rounds + 1):
        bracket = (0.0 if lo is None else lo.eta, math.inf if hi is None else hi.eta)
        trials = phi(etas, *bracket)
        for p in trials:
            if math.isfinite(p.value) and (best is None or p.value < best.value):
                best = p
        if lo is None and not trials[0].right < 0:
            return trials[0], rounds  # phi does not decrease from 0
        # phi' increases: the last step with phi'_+ < 0 and the first with phi'_- > 0 (or phi
        # infinite, an overflow) are the new ends; a step between them has 0 in [phi'_-, phi'_+].
        upper = next((i for i, p in enumerate(trials) if not (math.isfinite(p.value) and p.left <= 0)),
                     len(trials))
        lower = next((i for i in range(upper - 1, -1, -1) if trials[i].right < 0), -1)
        if lower + 1 < upper:
            return trials[lower + 1], rounds
        if lower >= 0:
            lo, free_lo, g_lo = trials[lower], trials[lower].above, trials[lower].right
            g_hi *= 0.5 if moved == "lo" and upper == len(trials) else 1.0
            moved = "lo" if upper == len(trials) else None
        if upper < len(trials):
            hi, free_hi = trials[upper], trials[upper].below
            g_hi = hi.left if math.isfinite(hi.value) and math.isfinite(hi.left) else math.inf
            g_lo *= 0.5 if moved == "hi" and lower < 0 else 1.0
            moved = "hi" if lower < 0 else None
        if hi is None:  # no upper end yet: expand
            etas = [(lo.eta or first / 4.0) * 4.0 ** j for j in range(1, points + 1)]
            continue
        width = hi.eta - lo.eta
        if width <= xtol * hi.eta:
            break
        if not exact and best.value - _tangent_bound(lo, hi) <= ftol * abs(best.value):
            break
        stalled = width > 0.5 * widths[-2]  # not halved in two rounds: bisect
        widths = [widths[-1], width]
        if exact and math.isfinite(g_hi) and free_lo >= hi.eta:
            # No breakpoint inside: phi' is affine on (lo, hi) and this is its root.
            eta = lo.eta - lo.right * width / (hi.left - lo.right)
            if lo.eta < eta < hi.eta:
                return phi([eta], lo.eta, hi.eta)[0], rounds + 1
        etas = _next_steps(lo.eta, hi.eta, g_lo, g_hi, free_lo if exact else math.inf,
                           free_hi if exact else -math.inf, points, stalled)
        if not etas:
            break
    return best, rounds


def _tangent_bound(lo, hi):
    """A lower bound of min phi over [lo, hi] (phi convex): where its tangents at lo and hi cross."""
    if not (math.isfinite(hi.value) and math.isfinite(hi.left)):
        return -math.inf
    cross = (hi.value - lo.value + lo.right * lo.eta - hi.left * hi.eta) / (lo.right - hi.left)
    return lo.value + lo.right * (min(max(cross, lo.eta), hi.eta) - lo.eta)


def _next_steps(lo, hi, g_lo, g_hi, free_lo, free_hi, points, stalled):
    """The steps of the next round inside (lo, hi), the most useful first, then sorted.

    The regula falsi step (the midpoint if phi'(hi) is unknown or the search
    has `stalled`), moved to the breakpoint closing the affine stretch next
    to an end if it falls there; then the two breakpoints nearest the ends,
    zoom steps around it and a grid over the bracket.
    """
    width = hi - lo
    step = lo - g_lo * width / (g_hi - g_lo) if math.isfinite(g_hi) and not stalled else 0.5 * (lo + hi)
    if step < free_lo < hi:
        step = free_lo
    elif lo < free_hi < step:
        step = free_hi
    candidates = [step, free_lo, free_hi] + [step + width * z for z in _ZOOM]
    grid = points - 1
    if lo > 0 and hi > 16 * lo:
        candidates += list(lo * (hi / lo) ** (np.arange(1, grid + 1) / (grid + 1)))
    elif lo == 0:
        candidates += [hi / 4.0 ** j for j in range(1, grid + 1)]
    else:
        candidates += list(lo + width * np.arange(1, grid + 1) / (grid + 1))
    chosen = []
    for eta in candidates + [0.5 * (lo + hi)]:
        if lo < eta < hi and eta not in chosen and len(chosen) < points:
            chosen.append(float(eta))
    return sorted(chosen)


def search_line(line, regularizer, lam, w, d, **options):
    """Minimize ``lam * Omega(w + eta d) + R_emp(w + eta d)`` over eta >= 0.

    Parameters
    ----------
    line : callable
        ``line(etas, lo, hi) -> ndarray (5, K)`` (R_emp, left and right
        slopes, nearest breakpoints) with attributes ``exact`` and
        ``points``: a :class:`prbmrm.distributed.oracle.RiskLine` or an :class:`OracleLine`.
    regularizer : object
        Provides ``line(w, d) -> omega`` with ``omega(eta) -> (Omega, dOmega/deta)``;
        its attribute ``quadratic`` (default False) allows the exact search.
    lam : float
    w, d : ndarray
        The start and direction of the line.
    **options
        Passed to :func:`minimize_line`.

    Returns
    -------
    point : LinePoint
    rounds : int
    """
    omega = regularizer.line(w, d)

    def phi(etas, lo, hi):
        points = []
        for eta, (risk, left, right, below, above) in zip(etas, line(etas, lo, hi).T):
            value, slope = omega(eta)
            points.append(LinePoint(eta, lam * value + risk, lam * slope + left, lam * slope + right,
                                    below, above))
        return points

    exact = line.exact and getattr(regularizer, "quadratic", False)
    return minimize_line(phi, exact=exact, points=line.points, **options)


class OracleLine:
    """A line search through the risk oracle itself: each trial step is one ``risk(w + eta d)`` call.

    Used for plain oracles and for losses whose risk does not decompose
    over examples or that need query ids (roc_area, fbeta, ndcg, ...), where
    a trial costs a full risk evaluation: one step per round. The slope
    reported is ``<a, d>`` for the oracle's subgradient a (left = right, no
    breakpoints), so the search is the inexact one.

    Parameters
    ----------
    risk : callable
        ``risk(w) -> (R_emp(w), a)``, optionally with ``last_seconds``.
    w, d : ndarray
        The start and direction of the line.
    """

    exact = False
    points = 1

    def __init__(self, risk, w, d):
        self._risk, self._w, self._d = risk, w, d
        self.seconds = {"risk": 0.0, "comm": 0.0}
        self.rounds = 0

    def __call__(self, etas, lo, hi):
        rows = []
        steps = np.concatenate([[lo], etas, [hi]])
        for i, eta in enumerate(etas):
            r, a = self._risk(self._w + eta * self._d)
            for key, seconds in getattr(self._risk, "last_seconds", {}).items():
                self.seconds[key] += seconds
            slope = float(np.dot(a, self._d))
            rows.append((r, slope, slope, steps[i], steps[i + 2]))
        self.rounds += 1
        return np.array(rows).T

    def close(self):
        """Nothing to release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def open_line(risk, w, d):
    """Return the cheapest line of `risk` along ``w + eta d``: its own (``risk.line``) or an OracleLine."""
    line = risk.line(w, d) if hasattr(risk, "line") else None
    return OracleLine(risk, w, d) if line is None else line
