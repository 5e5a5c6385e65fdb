"""Checks every party makes on each aggregated plane: a poisoned sum stops the run.

Secure aggregation shows each party the sum only, so a party that sends
something other than its risk and subgradient cannot be seen directly.
What every honest party can check, on the same public numbers and so
raising together, is that the aggregates are those of *some* convex risk
that obeys the run's bounds:

- finite: a party whose values are not finite declares so and is named;
- ``R_emp(w) >= risk_floor`` (0 for a non-negative loss);
- the planes and values seen so far are mutually consistent, as those of a
  convex function must be: ``R(w_t) >= R(w_s) + <a_s, w_t - w_s>`` and
  ``R(w_s) >= R(w_t) + <a_t, w_s - w_t>`` for the last :data:`WINDOW`
  evaluations s (up to round-off). This is "the lower bound never exceeds
  the objective" at every point evaluated, in its strongest form: every
  cutting plane lies below every value. It costs no message;
- under differential privacy, where noise makes the planes inconsistent by
  design, the norm of ``(risk sum, gradient sum)`` must stay within
  ``m C`` (every clipped example contributes at most C) plus a margin of
  eight noise standard deviations.

A party that scales its sums by a negative factor, adds a constant to
them, or switches to large values during a run breaks one of these at
once. A lie whose values and planes, with the honest ones before it, stay
consistent with some convex function above the floor passes: a scaled or
shifted copy of the party's own risk from the first evaluation on, and
also one that starts later if the earlier planes happen to lie below the
lied values (measured in docs/party.md: x0.5 from the third evaluation
passes, from the fourth is caught). It cannot be told from honest data
without zero-knowledge proofs of each party's computation, and secure
aggregation hides which party lied: the message names the check, not the
party.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`.
"""

import math

import numpy as np

from ..errors import JointError

WINDOW = 64
"""Most recent evaluations each new one is checked against."""

TOLERANCE = 1e-9
"""Relative round-off allowed in the consistency checks."""


class AggregateCheck:
    """Called on every party after each secure sum of the risk oracle, as ``check(w, sums)``.

    Parameters
    ----------
    comm : prbmrm.party.secure.SecureComm
    n_total : int
    risk_floor : float or None
        The loss's lower bound of the mean risk (None: unbounded below).
    noise_bound : float or None
        Under differential privacy: the largest norm the noisy sum may have.
    """

    def __init__(self, comm, n_total, risk_floor, noise_bound=None):
        self.comm = comm
        self.n_total = n_total
        self.risk_floor = risk_floor
        self.noise_bound = noise_bound
        self.evaluations = 0
        self._points = []  # (w, R, a, <a, w>) of the last WINDOW evaluations

    def _stop(self, what):
        raise JointError(f"the aggregated risk of evaluation {self.evaluations} {what}: a party's "
                         "contribution is not its risk and subgradient (poisoned, or a broken "
                         "installation); secure aggregation hides which party's, so every party stops")

    def __call__(self, w, sums):
        self.evaluations += 1
        if not np.all(np.isfinite(sums)):
            named = self.comm.nonfinite
            who = (f"party {', '.join(map(str, named))} sent non-finite values" if named else
                   "is not finite though no party declares non-finite values (a party tampered with it)")
            raise JointError(f"the aggregated risk of evaluation {self.evaluations}: {who}")
        if self.noise_bound is not None:
            norm = float(np.linalg.norm(sums))
            if norm > self.noise_bound:
                self._stop(f"has norm {norm:.6g}, beyond the {self.noise_bound:.6g} that clipped "
                           "examples and the noise allow")
            return
        risk, a = sums[-1] / self.n_total, sums[:-1] / self.n_total
        if self.risk_floor is not None and risk < self.risk_floor - TOLERANCE * max(1.0, abs(self.risk_floor)):
            self._stop(f"is {risk:.6g}, below the loss's floor {self.risk_floor:g}")
        aw = float(a @ w)
        for s, (w_s, r_s, a_s, aw_s) in enumerate(self._points):
            # Each plane at the other point, and the round-off of forming it.
            below_t = r_s + float(a_s @ w) - aw_s
            below_s = risk + float(a @ w_s) - aw
            slack = TOLERANCE * (abs(risk) + abs(r_s) + float(np.abs(a_s) @ np.abs(w - w_s))
                                 + float(np.abs(a) @ np.abs(w - w_s)))
            if below_t > risk + slack or below_s > r_s + slack:
                earlier = self.evaluations - len(self._points) + s
                self._stop(f"and that of evaluation {earlier} are not those of a convex function: "
                           f"R = {risk:.9g} here, {r_s:.9g} there, but a plane of one lies above the "
                           f"other's value by {max(below_t - risk, below_s - r_s):.3g}")
        self._points.append((np.array(w), risk, a.copy(), aw))
        del self._points[:-WINDOW]


def dp_noise_bound(n_total, clip, noise_std_total, dim):
    """The norm the noisy sum of `n_total` examples clipped to `clip` stays within.

    A Gaussian vector of n components of deviation s has norm above
    ``s (sqrt(n) + t)`` with probability below ``exp(-t^2 / 2)``: t = 8.
    """
    return n_total * clip + noise_std_total * (math.sqrt(dim + 1.0) + 8.0)


__all__ = ["AggregateCheck", "TOLERANCE", "WINDOW", "dp_noise_bound"]
