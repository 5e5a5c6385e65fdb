"""Differential privacy of party mode: per-example clipping and the (epsilon, delta) budget.

:class:`ClippedLoss` bounds what one example adds to a sum (the sensitivity);
:class:`PrivacyBudget` calibrates the Gaussian noise the parties add to each
secure sum and accounts what the evaluations spend. Used by
:class:`prbmrm.party.session.Party`.

Imports: numpy, scipy, :mod:`prbmrm.losses` and (when asked for privacy) dp-accounting.
"""

import math

import numpy as np
import scipy.sparse as sp

from ..errors import UsageError
from ..losses import ScalarLoss
from ..losses.vector import flat_gradient


class ClippedLoss:
    """A loss whose every example's (loss, gradient) is scaled to norm at most `clip`.

    The sum over examples then changes by at most `clip` (in the Euclidean
    norm of the d + 1 values) when one example is added or removed: the
    sensitivity of the Gaussian mechanism. Works for the scalar and vector
    losses (those with per-example coefficients).

    Parameters
    ----------
    loss : prbmrm.losses.ScalarLoss or prbmrm.losses.vector.VectorLoss
        Prepared for the data.
    clip : float
        C > 0.
    """

    decomposable = True

    def __init__(self, loss, clip):
        self.loss = loss
        self.clip = float(clip)
        self.n_outputs = loss.n_outputs

    def weight_dim(self, n_features):
        """Return the wrapped loss's length of w (:meth:`prbmrm.losses.Loss.weight_dim`)."""
        return self.loss.weight_dim(n_features)

    def loss_gradient(self, w, X, y, qid=None):
        """Return the clipped ``(sum of losses, sum of gradients)`` over the rows of `X`."""
        if isinstance(self.loss, ScalarLoss):
            f = X @ w
            losses, G = self.loss.value(f, y), self.loss.derivative(f, y)[:, None]
        else:
            losses, G = self.loss.coefficients(np.asarray(X @ w.reshape(-1, self.n_outputs)), y)
            G = G.toarray() if sp.issparse(G) else np.asarray(G)
        row_norms2 = np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X) else np.einsum(
            "ij,ij->i", X, X)
        # ||(l_i, x_i g_i^T)|| = sqrt(l_i^2 + |x_i|^2 |g_i|^2) for the d x k gradient x_i g_i^T.
        norms = np.sqrt(losses**2 + row_norms2 * np.einsum("ij,ij->i", G, G))
        scale = self.clip / np.maximum(norms, self.clip)  # min(1, C / norm)
        risk = float(scale @ losses)
        if isinstance(self.loss, ScalarLoss):
            return risk, np.asarray(X.T @ (scale * G[:, 0]), dtype=np.float64)
        return risk, flat_gradient(X, G * scale[:, None])


class PrivacyBudget:
    """(epsilon, delta)-differential privacy of the noisy sums, accounted with dp-accounting.

    Each evaluation releases ``sum_i clip_C(l_i, g_i) + N(0, (sigma C)^2 I)``,
    a Gaussian mechanism of noise multiplier sigma (add-or-remove-one
    neighbours). sigma is calibrated so that `evaluations` of them compose to
    the target (epsilon, delta) under Renyi DP (the accountant of Mironov
    2017 as maintained in Google's dp-accounting), and a fresh accountant
    composes one Gaussian event per evaluation actually made.

    The noise is made of one share per party (:meth:`share`). A coalition
    of T parties knows its own T shares and can subtract them; the P - T
    shares of the others must still make ``N(0, (sigma C)^2)``, so each
    share has deviation ``sigma C / sqrt(P - T)``: the epsilon accounted
    holds against any coalition of up to T parties (and outsiders, who face
    more noise, get more privacy).

    Parameters
    ----------
    epsilon, delta : float
        The target, over all evaluations.
    evaluations : int
        The most evaluations the run may make (``max_iter`` for BMRM).
    """

    def __init__(self, epsilon, delta, evaluations):
        try:
            import dp_accounting
            from dp_accounting.rdp import RdpAccountant
        except ImportError:
            raise UsageError("--dp-epsilon needs the package dp-accounting "
                             "(pip install dp-accounting, or prbmrm[dp])") from None
        self._dp = dp_accounting
        self.epsilon = epsilon
        self.delta = delta
        self.noise_multiplier = float(dp_accounting.calibrate_dp_mechanism(
            RdpAccountant, lambda sigma: dp_accounting.SelfComposedDpEvent(
                dp_accounting.GaussianDpEvent(sigma), evaluations), epsilon, delta))
        self.accountant = RdpAccountant()
        self.evaluations = 0

    def share(self, clip, parties, coalition):
        """Return the deviation of one party's noise share against coalitions of up to `coalition` parties."""
        return self.noise_multiplier * clip / math.sqrt(parties - coalition)

    def spend(self, *_):
        """Account for one more release (an observer of the risk oracle, called before each sum)."""
        self.accountant.compose(self._dp.GaussianDpEvent(self.noise_multiplier))
        self.evaluations += 1

    def spent(self):
        """Return the epsilon spent so far at the target delta."""
        return float(self.accountant.get_epsilon(self.delta)) if self.evaluations else 0.0
