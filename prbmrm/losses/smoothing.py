"""Nesterov-smoothed ROC-area and PRBEP risks (paper 004, Sec. 2-3).

Both nonsmooth risks are maxima of linear functions of the scores over a
convex set Q: ``R(f) = max_{beta in Q} <beta, A^T f> - g(beta)``. Subtracting
the prox-function ``mu d(beta) = mu ||beta||^2 / 2`` inside the maximum gives
``R_mu``, differentiable with a (1/mu)-Lipschitz gradient in ``A^T f``, whose
gradient is ``A beta*`` at the unique maximizer beta* (eq. 12-13), and
(eq. 6, eq. 16 of App. A)::

    R(f) - mu D <= R_mu(f) <= R(f),      D = max_{beta in Q} d(beta).

ROC area (:class:`SmoothedRocArea`), for the pairs (i positive, j negative)
of :class:`prbmrm.losses.multivariate.RocArea`, with ``t_ij = 1 + f_j - f_i``
and ``m' = m+ m-``::

    R_mu = max_{beta in [0,1]^{m'}} (1/m') sum_ij beta_ij t_ij - (mu/2) ||beta||^2
         = (1/m') sum_ij huber_kappa(t_ij),        kappa = mu m',   D = m'/2,

a Huber-smoothed hinge per pair: ``huber_kappa(t) = 0`` (t <= 0),
``t^2 / (2 kappa)`` (0 <= t <= kappa), ``t - kappa/2`` (t >= kappa), with
``beta_ij = clip(t_ij / kappa, 0, 1)``. The paper smooths its eq. 3 the
same way with ``beta in [-1, 1]`` (eq. 11); as printed, eq. 3 reads
``max(x, 1 - x)`` per pair (``x = f_i - f_j``), not the hinge
``max(0, 1 - x)`` of RocArea, which is what is smoothed here. The sums over
partners of beta and huber come from sorted scores, prefix sums and binary
searches: O(m log m) (Sec. 3.2).

PRBEP (:class:`SmoothedPrbep`), the contingency-table risk of
:class:`prbmrm.losses.multivariate.Prbep` (eq. 2, 7-9): beta_i is the
probability that example i is flipped, and the flips must be as many among
the positives as among the negatives (Delta is -inf otherwise), so
``Q = {beta in [0,1]^m : sum_P beta = sum_N beta}`` (the constraint matrix is
totally unimodular: Q is the convex hull of the balanced flips) and
``g(beta) = -sum_P beta_i / m+``::

    R_mu = max_{beta in Q} sum_i beta_i (-2 y_i f_i / m) + sum_P beta_i / m+ - (mu/2) ||beta||^2,

``D = max_Q d = min(m+, m-)`` (the paper bounds it by m/2). One scalar
multiplier theta of the balance constraint decouples the beta_i into
clipped linear functions of theta; the theta that balances them is where a
monotone piecewise linear function crosses m-: a binary search over its 2m
sorted breakpoints, each step O(log m) with prefix sums, then exact
interpolation: O(m log m) with the sort (Sec. 3.1 solves the same problem
with one multiplier per example).

Both return ``m R_mu`` and ``m dR_mu/df`` like every
:class:`~prbmrm.losses.MultivariateLoss`, and also record the nonsmooth risk
of the same scores (:attr:`SmoothedLoss.exact_risk`) at no extra
communication: ``smooth_lbfgs`` steps on ``R_mu`` and reports the true J.

Imports: numpy; of prbmrm: :mod:`prbmrm.losses.base`, :mod:`prbmrm.losses.multivariate`.
"""

import math

import numpy as np

from .base import MultivariateLoss
from .multivariate import Prbep, RocArea, _plus_minus_counts, prbep_totals


class SmoothedLoss(MultivariateLoss):
    """Base class: a smoothed multivariate risk wrapping its nonsmooth loss.

    Parameters
    ----------
    mu : float
        The prox parameter (> 0). 0 (default) takes ``max_deviation / D``.
    max_deviation : float
        The largest ``R - R_mu`` allowed, mu D, used when `mu` is 0. With
        both 0 the loss is the nonsmooth one (the limit mu -> 0).

    Attributes
    ----------
    exact : MultivariateLoss
        The nonsmooth loss.
    exact_risk : float
        The nonsmooth risk R at the scores of the last call of
        :meth:`coefficients` (NaN before the first).
    last_mu : float
        The mu used by the last call.
    """

    exact_class = None
    task = "ranking"
    params = {"mu": 0.0, "max_deviation": 0.0}

    def check_params(self):
        for name in self.params:
            self._require(name, math.isfinite(getattr(self, name)) and getattr(self, name) >= 0,
                          "a finite number >= 0")
        self.exact = self.exact_class()
        self.exact_risk = math.nan
        self.last_mu = math.nan

    def check_labels(self, classes, label_kind):
        return self.exact.check_labels(classes, label_kind)

    def metrics(self, f, y, qid=None):
        return self.exact.metrics(f, y, qid)

    def diameter(self, y):
        """Return D, the largest value of the prox-function ``||beta||^2 / 2`` on Q, for labels y."""
        raise NotImplementedError

    def smoothing(self, y):
        """Return the mu in effect for labels `y`: `mu`, else ``max_deviation / D``."""
        return self.mu if self.mu > 0 else self.max_deviation / self.diameter(y)

    def coefficients(self, f, y, qid=None):
        f = np.asarray(f, dtype=np.float64)
        self.last_mu = mu = self.smoothing(y)
        if mu == 0:
            risk_sum, c = self.exact.coefficients(f, y, qid)
            exact_sum = risk_sum
        else:
            # Both risks ignore a constant offset of the scores: centring them keeps
            # the prefix sums below small, so differences of them lose no digits.
            risk_sum, c, exact_sum = self._smoothed(f - np.mean(f), y, mu)
        self.exact_risk = exact_sum / y.size
        return risk_sum, c

    def _smoothed(self, f, y, mu):
        """``(m R_mu, m dR_mu/df, m R)`` for mu > 0: the nonsmooth risk comes from the same sorts."""
        raise NotImplementedError


def _prefix(values):
    """Prefix sums with a leading 0: ``out[k] = sum(values[:k])``."""
    return np.concatenate([[0.0], np.cumsum(values)])


class SmoothedRocArea(SmoothedLoss):
    """ROC-area risk of :class:`~prbmrm.losses.multivariate.RocArea` with a Huber-smoothed hinge per pair.

    ``R_mu = (1/m') sum_{i in P, j in N} huber_kappa(1 + f_j - f_i)`` with
    ``kappa = mu m'`` and ``D = m'/2`` (``m' = m+ m-``); see the module
    docstring. O(m log m).
    """

    name = "smoothed_roc_area"
    exact_class = RocArea

    def diameter(self, y):
        _, m_pos, m_neg = _plus_minus_counts(self.exact.name, y)
        return 0.5 * m_pos * m_neg

    def _smoothed(self, f, y, mu):
        positive, m_pos, m_neg = _plus_minus_counts(self.exact.name, y)
        pairs = float(m_pos) * m_neg
        kappa = mu * pairs
        pos_index, neg_index = np.flatnonzero(positive), np.flatnonzero(~positive)
        pos_index = pos_index[np.argsort(f[pos_index])]
        neg_index = neg_index[np.argsort(f[neg_index])]
        p = f[pos_index]
        q = f[neg_index] + 1.0   # t_ij = q_j - p_i
        q1, q2, p1 = _prefix(q), _prefix(q * q), _prefix(p)
        # Each positive p_i: negatives with q_j >= p_i + kappa have beta = 1, those with
        # p_i < q_j < p_i + kappa have beta = (q_j - p_i) / kappa.
        lo = np.searchsorted(q, p, side="right")
        hi = np.searchsorted(q, p + kappa, side="left")
        n_window, n_full = hi - lo, m_neg - hi
        s1, s2 = q1[hi] - q1[lo], q2[hi] - q2[lo]
        full_sum = q1[-1] - q1[hi]
        beta_pos = n_full + (s1 - n_window * p) / kappa
        risk = (np.sum(full_sum - n_full * (p + 0.5 * kappa))
                + np.sum(s2 - 2.0 * p * s1 + n_window * p * p) / (2.0 * kappa))
        # The hinge itself: every negative with q_j > p_i adds q_j - p_i.
        exact = np.sum(q1[-1] - q1[lo] - (m_neg - lo) * p)
        # Each negative q_j: positives with p_i <= q_j - kappa have beta = 1, those with
        # q_j - kappa < p_i < q_j have beta = (q_j - p_i) / kappa.
        full_end = np.searchsorted(p, q - kappa, side="right")
        window_end = np.searchsorted(p, q, side="left")
        beta_neg = full_end + ((window_end - full_end) * q - (p1[window_end] - p1[full_end])) / kappa
        scale = y.size / pairs
        c = np.empty(y.size)
        c[pos_index] = -beta_pos * scale
        c[neg_index] = beta_neg * scale
        return float(risk) * scale, c, float(exact) * scale


class SmoothedPrbep(SmoothedLoss):
    """PRBEP risk of :class:`~prbmrm.losses.multivariate.Prbep` smoothed over the balanced flips.

    ``R_mu = max_{beta in [0,1]^m, sum_P beta = sum_N beta} sum_i beta_i (-2 y_i f_i / m)
    + sum_P beta_i / m+ - (mu/2) ||beta||^2`` and ``D = min(m+, m-)``; see the
    module docstring. O(m log m).
    """

    name = "smoothed_prbep"
    exact_class = Prbep

    def diameter(self, y):
        _, m_pos, m_neg = _plus_minus_counts(self.exact.name, y)
        return float(min(m_pos, m_neg))

    def _smoothed(self, f, y, mu):
        positive, m_pos, m_neg = _plus_minus_counts(self.exact.name, y)
        m = y.size
        p = np.sort(f[positive])               # ascending
        n = np.sort(f[~positive])[::-1]         # descending
        top = min(m_pos, m_neg)
        exact = float(np.max(prbep_totals(p[:top], n[:top], m_pos, m))) * m
        # In units of m/2: beta_i = clip((u_i - theta) / kappa, 0, 1) on the positives and
        # clip((v_j + theta) / kappa, 0, 1) on the negatives, theta balancing the two sums.
        half = 0.5 * m
        kappa = mu * half
        u = -f[positive] + half / m_pos
        v = f[~positive]
        # Both parts of the breakpoints' values are sorted already (ascending): -p reversed, kappa - n.
        theta = _balance(np.concatenate([half / m_pos - p[::-1], kappa - n]), kappa, m_neg)
        beta_pos = np.clip((u - theta) / kappa, 0.0, 1.0)
        beta_neg = np.clip((v + theta) / kappa, 0.0, 1.0)
        risk = (u @ beta_pos + v @ beta_neg
                - 0.5 * kappa * (beta_pos @ beta_pos + beta_neg @ beta_neg)) / half
        c = np.empty(m)
        c[positive] = -2.0 * beta_pos
        c[~positive] = 2.0 * beta_neg
        return float(risk) * m, c, exact


def _balance(values, kappa, target):
    """The theta with ``sum_k clip((values_k - theta) / kappa, 0, 1) == target`` (0 < target < len).

    The sum S(theta) is continuous, nonincreasing and linear between the
    breakpoints ``values_k - kappa`` and ``values_k``. A binary search over
    the sorted breakpoints, evaluating S in O(log m) from sorted values and
    prefix sums, finds the segment where S crosses the target; S is
    interpolated there exactly.
    """
    w = np.sort(values, kind="stable")   # timsort: linear on a few sorted runs
    prefix = _prefix(w)
    # Two sorted runs: the stable sort (timsort) merges them in linear time.
    points = np.sort(np.concatenate([w - kappa, w]), kind="stable")

    def level(theta):
        full_from = np.searchsorted(w, theta + kappa, side="left")    # w >= theta + kappa: 1 each
        window_from = np.searchsorted(w, theta, side="right")         # theta < w < theta + kappa
        window = prefix[full_from] - prefix[window_from] - (full_from - window_from) * theta
        return (w.size - full_from) + window / kappa

    lo, hi = 0, points.size - 1    # S(points[lo]) >= target > S(points[hi]) = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if level(points[mid]) >= target:
            lo = mid
        else:
            hi = mid
    above, below = level(points[lo]), level(points[hi])
    return float(points[lo] + (above - target) * (points[hi] - points[lo]) / (above - below))


SMOOTHED_LOSSES = {cls.exact_class.name: cls for cls in (SmoothedRocArea, SmoothedPrbep)}
"""The smoothed loss class of each nonsmooth loss that has one, by the nonsmooth loss's name."""
