"""Scalar losses l(f, y) of the score f = <w, x> (paper 000, Table 5; paper 002, Table 1).

Each loss's value l and derivative l' (with respect to f, a subgradient
where l has a kink), and for the twice differentiable ones its curvature l''
(a generalized second derivative where l' has a kink, for Newton's method,
:mod:`prbmrm.solvers.tron`), are written once, in Cython, in
:mod:`prbmrm.kernels.scalar`: a class here names its counterpart there in
``compiled`` and inherits ``value``, ``derivative`` and ``curvature``
(elementwise, compiled loops) from :class:`~prbmrm.losses.base.ScalarLoss`;
the compiled risk passes use the same functions. The docstrings state the
formulas; the classes add what is not hot: parameters and their checks,
``kinks``, labels.
The shared skeleton :meth:`ScalarLoss.loss_gradient` does ``f = X @ w`` and
``X.T @ l'(f, y)``.

Losses with an exponential (``exponential``, ``poisson``) overflow to +inf
for scores beyond about 709 (float64); the risk then is not finite and the
solver stops with its "not finite" error instead of carrying on with NaN.

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.losses.base`, :mod:`prbmrm.kernels.scalar`.
"""

import numpy as np

from ..kernels import scalar as kernels
from .base import BinaryLoss, RegressionLoss, ScalarLoss, _format_labels


# --------------------------------------------------------------------------
# Binary classification, labels in {-1, +1}
# --------------------------------------------------------------------------

class Hinge(BinaryLoss):
    """Hinge loss ``max(0, 1 - y f)``; subgradient ``-y`` where ``y f < 1``, else 0."""

    name = "hinge"
    compiled = kernels.CyHinge
    piecewise_linear = True

    def kinks(self, y):
        return (1.0 / y)[:, None]


class SquaredHinge(BinaryLoss):
    """Squared hinge ``max(0, 1 - y f)^2 / 2``; derivative ``-y max(0, 1 - y f)`` (= f - y where y f < 1);
    curvature ``y^2`` where ``y f < 1``, else 0 (generalized at the kink, Mangasarian 2002, as LIBLINEAR's -s 2)."""

    name = "squared_hinge"
    compiled = kernels.CySquaredHinge



class ZeroHinge(BinaryLoss):
    """Perceptron loss ``max(0, -y f)`` (paper 002's "hinge"); subgradient ``-y`` where ``y f < 0``, else 0.

    Positively homogeneous: with an L2 (or any norm) regularizer the minimum
    is 0, at ``w = 0``.
    """

    name = "zero_hinge"
    compiled = kernels.CyZeroHinge
    piecewise_linear = True

    def kinks(self, y):
        return np.zeros((len(y), 1))


class SquaredZeroHinge(BinaryLoss):
    """Squared perceptron loss ``max(0, -y f)^2 / 2``; derivative ``-y max(0, -y f)`` (= f where y f < 0);
    curvature ``y^2`` where ``y f < 0``, else 0."""

    name = "squared_zero_hinge"
    compiled = kernels.CySquaredZeroHinge



class Exponential(BinaryLoss):
    """Exponential loss ``exp(-y f)``; derivative ``-y exp(-y f)``; curvature ``y^2 exp(-y f)``.

    Overflows to +inf where ``-y f > 709``; the solver reports the
    non-finite risk.
    """

    name = "exponential"
    compiled = kernels.CyExponential



class Logistic(BinaryLoss):
    """Logistic loss ``log(1 + exp(-y f))``; derivative ``-y / (1 + exp(y f))``;
    curvature ``y^2 s(y f) s(-y f)``, s the logistic sigmoid."""

    name = "logistic"
    compiled = kernels.CyLogistic


class HuberHinge(BinaryLoss):
    """Huberized hinge of Chapelle (2007), a smooth hinge; ``delta`` (h) > 0, default 0.5.

    With ``z = y f``::

        l = 0                          if z > 1 + h
            (1 + h - z)^2 / (4 h)      if |1 - z| <= h
            1 - z                      if z < 1 - h

    and ``l' = -y * clip(1 + h - z, 0, 2 h) / (2 h)``: continuously
    differentiable, tending to the hinge as h -> 0; curvature ``y^2 / (2 h)``
    where ``|1 - z| <= h``, else 0. (Paper 002's Table 1
    does not list it; this is the loss of Chapelle's "Training a support
    vector machine in the primal", Section 4, with his h as ``delta``.)
    """

    name = "huber_hinge"
    compiled = kernels.CyHuberHinge
    params = {"delta": 0.5}

    def check_params(self):
        self._require("delta", np.isfinite(self.delta) and self.delta > 0, "a finite number > 0")



# --------------------------------------------------------------------------
# Novelty detection (labels ignored)
# --------------------------------------------------------------------------

class Novelty(ScalarLoss):
    """Novelty detection (Schölkopf et al. 2001) ``max(0, rho - f)``; subgradient -1 where ``f < rho``.

    The labels are ignored. Examples with ``f < rho`` are flagged as novel.
    """

    name = "novelty"
    compiled = kernels.CyNovelty
    piecewise_linear = True
    task = "novelty"
    params = {"rho": 1.0}

    def check_params(self):
        self._require("rho", np.isfinite(self.rho), "a finite number")

    def kinks(self, y):
        return np.full((len(y), 1), self.rho)

    def metrics(self, f, y, qid=None):
        """Fraction of examples flagged as novel (``f < rho``)."""
        return {"flagged_fraction": float(np.mean(f < self.rho)) if len(f) else float("nan")}


# --------------------------------------------------------------------------
# Regression, real targets; r = f - y
# --------------------------------------------------------------------------

class LeastSquares(RegressionLoss):
    """Least mean squares ``(f - y)^2 / 2``; derivative ``f - y``; curvature 1."""

    name = "least_squares"
    compiled = kernels.CyLeastSquares



class LeastAbsoluteDeviation(RegressionLoss):
    """Least absolute deviation ``|f - y|``; subgradient ``sign(f - y)`` (0 at f = y)."""

    name = "least_absolute_deviation"
    compiled = kernels.CyLeastAbsoluteDeviation
    piecewise_linear = True

    def kinks(self, y):
        return np.asarray(y, dtype=np.float64)[:, None]


class Quantile(RegressionLoss):
    """Quantile (pinball) loss ``max(tau (y - f), (1 - tau)(f - y))``, 0 < tau < 1, default 0.5.

    Subgradient ``1 - tau`` where ``f > y``, else ``-tau``. The minimizer
    predicts the tau-quantile of y given x (about a fraction tau of the
    targets lie at or below f), as in Koenker (2005) and
    ``sklearn.metrics.mean_pinball_loss(alpha=tau)``. Paper 000's Table 5
    prints ``max(tau (f - y), (1 - tau)(y - f))``, which is this loss at
    ``1 - tau``: it would estimate the (1 - tau)-quantile.
    """

    name = "quantile"
    compiled = kernels.CyQuantile
    piecewise_linear = True
    params = {"tau": 0.5}

    def check_params(self):
        self._require("tau", 0.0 < self.tau < 1.0, "in (0, 1)")

    def kinks(self, y):
        return np.asarray(y, dtype=np.float64)[:, None]

    def metrics(self, f, y, qid=None):
        """Adds ``pinball`` (the mean loss at tau) and ``coverage``, the fraction with ``y <= f`` (about tau)."""
        measures = super().metrics(f, y, qid)
        empty = len(y) == 0
        measures["pinball"] = float("nan") if empty else float(np.mean(self.value(f, y)))
        measures["coverage"] = float("nan") if empty else float(np.mean(y <= f))
        return measures


class EpsilonInsensitive(RegressionLoss):
    """Vapnik's epsilon-insensitive loss ``max(0, |f - y| - epsilon)``, epsilon >= 0, default 0.1.

    Subgradient ``sign(f - y)`` outside the tube ``|f - y| <= epsilon``, 0 inside.
    """

    name = "epsilon_insensitive"
    compiled = kernels.CyEpsilonInsensitive
    piecewise_linear = True
    params = {"epsilon": 0.1}

    def check_params(self):
        self._require("epsilon", np.isfinite(self.epsilon) and self.epsilon >= 0, "a finite number >= 0")

    def kinks(self, y):
        y = np.asarray(y, dtype=np.float64)
        return np.stack([y - self.epsilon, y + self.epsilon], axis=1)

    def metrics(self, f, y, qid=None):
        """Adds ``inside_tube``, the fraction of examples with ``|f - y| <= epsilon``."""
        measures = super().metrics(f, y, qid)
        measures["inside_tube"] = (float(np.mean(np.abs(f - y) <= self.epsilon)) if len(y)
                                   else float("nan"))
        return measures


class Huber(RegressionLoss):
    """Huber's robust loss, delta > 0 (default 1, paper 000's Table 5); r = f - y.

    ``l = r^2 / 2`` if ``|r| <= delta``, else ``delta (|r| - delta / 2)``;
    derivative ``clip(r, -delta, delta)``; curvature 1 where ``|r| <= delta``, else 0.
    """

    name = "huber"
    compiled = kernels.CyHuber
    params = {"delta": 1.0}

    def check_params(self):
        self._require("delta", np.isfinite(self.delta) and self.delta > 0, "a finite number > 0")



class Poisson(RegressionLoss):
    """Poisson regression (negative log-likelihood up to a constant) ``exp(f) - y f``; derivative ``exp(f) - y``; curvature ``exp(f)``.

    f is the log of the mean count. The targets must be counts: integers
    >= 0 (for negative targets the loss is unbounded below). Overflows to
    +inf where ``f > 709``; the solver reports the non-finite risk.
    """

    name = "poisson"
    compiled = kernels.CyPoisson

    def check_labels(self, classes, label_kind):
        problem = super().check_labels(classes, label_kind)
        if problem is not None:
            return problem
        if classes is None:
            return (f"loss {self.name!r} needs counts (integers >= 0) as labels, the data has "
                    "non-integer labels")
        if classes.size and classes[0] < 0:
            return (f"loss {self.name!r} needs counts (integers >= 0) as labels, the data has "
                    f"negative labels: {_format_labels(classes)}")
        return None

    def prepare(self, classes, label_kind):
        # min_f exp(f) - y f = y - y log y (0 at y = 0), negative for y > e:
        # its least value over the data's counts bounds the mean loss below.
        from scipy.special import xlogy

        self.risk_floor = float(np.min(classes - xlogy(classes, classes)))


SCALAR_LOSSES = (Hinge, SquaredHinge, ZeroHinge, SquaredZeroHinge, Exponential, Logistic, HuberHinge,
                 Novelty, LeastSquares, LeastAbsoluteDeviation, Quantile, EpsilonInsensitive, Huber,
                 Poisson)
