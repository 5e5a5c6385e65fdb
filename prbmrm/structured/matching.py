"""Learning the cost matrix of graph matching (paper 000 Sec. 5.3.2, eqs. 18-20).

An example matches the n points of one set to the n points of another. Its
x holds one part per pair (i, j), row ``i * n + j``: a feature vector
psi(x, i, j) of matching point i of the first set to point j of the second,
e.g. the negated squared feature differences ``-(x_i^(k) - x'_j^(k))^2`` of
eq. 19 (:func:`pair_features`). The label y is the permutation: point i
goes to point y_i. Then::

    phi(x, y) = sum_i psi(x, i, y_i)                     (19)
    Delta(y, y') = 1 - (1/n) sum_i [y_i == y'_i]          (20)

and the loss-augmented argmax of (18) and the prediction are linear
assignment problems on the n x n score matrix ``S[i, j] = <w, psi(x, i, j)>``
(with 1/n added off the true matches for (18)), solved by
:func:`scipy.optimize.linear_sum_assignment`. Only margin rescaling is
offered: slack rescaling is no longer an assignment problem, and the
logistic form needs the permanent of an n x n matrix (#P-hard).

Imports: numpy, scipy; of prbmrm: :mod:`prbmrm.structured.base`.
"""

import math

import numpy as np

from .base import StructuredModel


def pair_features(points, other):
    """Return the negated squared feature differences of every pair of points (eq. 19).

    Parameters
    ----------
    points, other : ndarray of shape (n, d)
        The two point sets, one feature vector per point.

    Returns
    -------
    ndarray of shape (n * n, d)
        Row ``i * n + j``: ``-(points[i] - other[j]) ** 2``, so that uniform
        weights ``w = 1`` give the standard cost ``-||x_i - x'_j||^2``.
    """
    points, other = np.asarray(points, dtype=np.float64), np.asarray(other, dtype=np.float64)
    return -((points[:, None, :] - other[None, :, :]) ** 2).reshape(-1, points.shape[1])


class MatchingModel(StructuredModel):
    """Graph matching by linear assignment: x is the n * n pairs' features, y a permutation."""

    name = "matching"

    def size_joint_feature(self, n_features):
        return n_features

    def joint_feature(self, x, y):
        n = _n_points(x)
        return x[np.arange(n) * n + y].sum(axis=0)

    def delta(self, y, y_hat):
        """Return the normalized Hamming loss ``1 - (1/n) #{i : y_i == y_hat_i}`` (eq. 20)."""
        return float(np.mean(np.asarray(y) != np.asarray(y_hat))) if len(y) else 0.0

    def _scores(self, x, w):
        n = _n_points(x)
        return (x @ w).reshape(n, n)

    def loss_augmented_argmax(self, x, y, w, rescaling="margin"):
        scores = self._scores(x, w)
        # Delta adds 1/n for every point not sent to its true partner.
        augmented = scores + 1.0 / max(len(y), 1)
        augmented[np.arange(len(y)), y] = scores[np.arange(len(y)), y]
        return _assign(augmented)

    def predict(self, x, w):
        return _assign(self._scores(x, w))

    def check_label(self, x, y):
        n = math.isqrt(len(x))
        if n * n != len(x):
            return f"a matching example has n * n pair rows, not {len(x)}"
        if not np.array_equal(np.sort(y), np.arange(n)):
            return f"a matching label must be a permutation of 0..{n - 1}"
        return None


def _n_points(x):
    n = math.isqrt(len(x))
    if n * n != len(x):
        raise ValueError(f"a matching example has n * n pair rows, not {len(x)}")
    return n


def _assign(scores):
    """Return the permutation y maximizing ``sum_i scores[i, y_i]``."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize costs every run ~0.1 s to import

    rows, columns = linear_sum_assignment(scores, maximize=True)
    return columns.astype(np.int64)
