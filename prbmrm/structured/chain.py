"""Chain labeling (HMM-SVM, chain CRF): Viterbi for the max-margin loss, forward-backward for the logistic loss.

An example is a sequence x (T x p, one row per position) with a state
y_t in {0, ..., K-1} at each position. The joint feature map is::

    phi(x, y) = ( sum_t e_{y_t} (x) x_t,            emissions   (K x p)
                  sum_{t>0} e_{y_{t-1}} (x) e_{y_t}, transitions (K x K)
                  e_{y_0} )                          start state (K)

so <w, phi(x, y)> = sum_t U[t, y_t] + sum_{t>0} A[y_{t-1}, y_t] + s[y_0] with
node scores U = x W^T, and Delta is the Hamming loss *not* normalized by T
(the number of wrong positions), which adds to the node scores and keeps
the loss-augmented argmax a Viterbi pass.

Imports: numpy; of prbmrm: :mod:`prbmrm.structured.base`.
"""

import numpy as np
from .base import StructuredModel


class ChainModel(StructuredModel):
    """A linear-chain model over `n_states` states (margin rescaling and the logistic form).

    ``w`` is laid out as the emission matrix W (K x p, row-major), the
    transition matrix A (K x K, ``A[i, j]`` scores state i followed by j)
    and the start scores s (K).

    Parameters
    ----------
    n_states : int
        K, the number of states, >= 1.
    """

    name = "chain"
    params = {"n_states": 2}

    def __init__(self, n_states=2):
        super().__init__(n_states=n_states)

    def check_params(self):
        self._require("n_states", self.n_states >= 1, "at least one state")

    def size_joint_feature(self, n_features):
        k = self.n_states
        return k * n_features + k * k + k

    def split(self, w, n_features):
        """Return views ``(W, A, s)`` of the emission, transition and start parts of `w`."""
        k = self.n_states
        emission = k * n_features
        return (w[:emission].reshape(k, n_features),
                w[emission:emission + k * k].reshape(k, k), w[emission + k * k:])

    def joint_feature(self, x, y):
        phi = np.zeros(self.size_joint_feature(x.shape[1]))
        emission, transition, start = self.split(phi, x.shape[1])
        np.add.at(emission, y, x)
        np.add.at(transition, (y[:-1], y[1:]), 1.0)
        if len(y):
            start[y[0]] = 1.0
        return phi

    def delta(self, y, y_hat):
        """Return the number of positions where `y_hat` differs from `y` (Hamming, not divided by T)."""
        return float(np.count_nonzero(np.asarray(y) != np.asarray(y_hat)))

    def _scores(self, x, w):
        emission, transition, start = self.split(w, x.shape[1])
        return x @ emission.T, transition, start

    def loss_augmented_argmax(self, x, y, w, rescaling="margin"):
        scores, transition, start = self._scores(x, w)
        # Delta adds 1 at every position whose state differs from y_t.
        augmented = scores + 1.0
        augmented[np.arange(len(y)), y] -= 1.0
        return viterbi(augmented, transition, start)

    def predict(self, x, w):
        return viterbi(*self._scores(x, w))

    def expected_joint_feature(self, x, w):
        """Return ``(log Z, E[phi])`` by forward-backward in log space (node and edge marginals)."""
        scores, transition, start = self._scores(x, w)
        expected = np.zeros(len(w))
        if len(x) == 0:
            return 0.0, expected  # one labeling, the empty one
        e_emission, e_transition, e_start = self.split(expected, x.shape[1])
        alpha = np.empty_like(scores)
        beta = np.zeros_like(scores)
        alpha[0] = start + scores[0]
        for t in range(1, len(x)):
            alpha[t] = _logsumexp(alpha[t - 1][:, None] + transition, axis=0) + scores[t]
        for t in range(len(x) - 2, -1, -1):
            beta[t] = _logsumexp(transition + scores[t + 1] + beta[t + 1], axis=1)
        log_z = _logsumexp(alpha[-1])
        nodes = np.exp(alpha + beta - log_z)
        e_emission[:] = nodes.T @ x
        e_start[:] = nodes[0]
        # Edge marginals p(y_{t-1} = i, y_t = j), summed over t.
        e_transition[:] = np.exp(alpha[:-1, :, None] + transition
                                 + (scores[1:] + beta[1:])[:, None, :] - log_z).sum(axis=0)
        return float(log_z), expected

    def check_label(self, x, y):
        if len(y) != len(x):
            return f"a chain label has one state per position: {len(y)} states for {len(x)} positions"
        if len(y) and (np.min(y) < 0 or np.max(y) >= self.n_states
                       or not np.array_equal(y, np.asarray(y).astype(np.int64))):
            return f"chain states must be integers in 0..{self.n_states - 1}"
        return None


def viterbi(scores, transition, start):
    """Return the state sequence maximizing ``sum_t scores[t, y_t] + sum_t transition[y_{t-1}, y_t] + start[y_0]``.

    Parameters
    ----------
    scores : ndarray of shape (T, K)
    transition : ndarray of shape (K, K)
    start : ndarray of shape (K,)

    Returns
    -------
    ndarray of shape (T,), int64
        The first maximizer in the order of ``np.argmax`` on ties.
    """
    length, k = scores.shape
    path = np.zeros(length, dtype=np.int64)
    if length == 0:
        return path
    back = np.zeros((length, k), dtype=np.int64)
    best = start + scores[0]
    for t in range(1, length):
        candidates = best[:, None] + transition
        back[t] = candidates.argmax(axis=0)
        best = candidates[back[t], np.arange(k)] + scores[t]
    path[-1] = best.argmax()
    for t in range(length - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


def _logsumexp(a, axis=None):
    """``log sum exp`` of the finite array `a` along `axis` (scipy's is ~50x slower on K x K arrays)."""
    top = a.max(axis=axis, keepdims=True)
    return np.log(np.exp(a - top).sum(axis=axis)) + np.squeeze(top, axis=axis)
