"""Seeded synthetic data for the built-in structured models: HMM sequences and point-set matchings.

Imports: numpy; of prbmrm: :mod:`prbmrm.structured.base`, :mod:`prbmrm.structured.matching`.
"""

import numpy as np

from .base import RaggedExamples
from .matching import pair_features


def make_chain_data(n_sequences, n_states=4, n_features=8, lengths=(10, 30), stay=0.8, noise=1.5,
                    seed=0):
    """Return sequences of an HMM with Gaussian emissions, for :class:`~prbmrm.structured.ChainModel`.

    The states follow a Markov chain that stays in its state with
    probability `stay` and otherwise moves to another one with probabilities
    drawn once (Dirichlet); the start state is uniform. Position t emits
    ``[mu_{y_t} + noise * N(0, I), 1]``: the state's mean (drawn once from
    N(0, I)) plus noise, and a constant feature that gives every state a bias.
    A large `noise` makes single positions ambiguous, so the transitions matter.

    Parameters
    ----------
    n_sequences : int
    n_states : int
        K >= 2.
    n_features : int
        p, the Gaussian features per position (x has p + 1 columns).
    lengths : (int, int)
        Each sequence's length is uniform in ``[lengths[0], lengths[1]]``.
    stay : float
        Probability of keeping the state from one position to the next.
    noise : float
        Standard deviation of the emission noise.
    seed : int
        The same seed gives the same chain, means and sequences; a
        different seed gives a different HMM, so draw training and test
        sequences in one call and slice them apart.

    Returns
    -------
    RaggedExamples
        x: (sum of lengths, p + 1); y: the states, int64.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_states, n_features))
    moves = rng.dirichlet(np.ones(n_states - 1), size=n_states)
    transition = np.zeros((n_states, n_states))
    for state in range(n_states):
        transition[state, np.arange(n_states) != state] = (1.0 - stay) * moves[state]
        transition[state, state] = stay
    xs, ys = [], []
    for length in rng.integers(lengths[0], lengths[1] + 1, size=n_sequences):
        states = np.empty(length, dtype=np.int64)
        states[:1] = rng.integers(n_states)
        for t in range(1, length):
            states[t] = rng.choice(n_states, p=transition[states[t - 1]])
        emitted = means[states] + noise * rng.normal(size=(length, n_features))
        xs.append(np.hstack([emitted, np.ones((length, 1))]))
        ys.append(states)
    return RaggedExamples.from_lists(xs, ys, n_features + 1)


def make_matching_data(n_pairs, n_points=10, group_sizes=(4, 4, 12), group_noise=(0.2, 1.0, 4.0), seed=0):
    """Return point-set matching problems for :class:`~prbmrm.structured.MatchingModel`.

    Each pair draws n points with d = sum(group_sizes) features from
    N(0, I), and a second set that is the first permuted by a random
    permutation, with noise of standard deviation ``group_noise[g]`` added to
    the features of group g and the sum scaled back to unit variance (so
    every feature has the same scale and only its reliability differs: the
    correlation of a point's feature with its partner's is
    ``1 / sqrt(1 + noise^2)``). Groups of noisy features mislead the uniform
    cost ``-||x_i - x'_j||^2``; learned weights can discount them.

    Parameters
    ----------
    n_pairs : int
    n_points : int
        n, the points per set.
    group_sizes : sequence of int
        Features per group.
    group_noise : sequence of float
        Noise standard deviation of each group (its unreliability).
    seed : int
        The same seed gives the same problems.

    Returns
    -------
    RaggedExamples
        x: the n * n pair features of each problem (:func:`pair_features`);
        y: the permutation, point i of the first set is point ``y[i]`` of the second.
    """
    rng = np.random.default_rng(seed)
    noise = np.repeat(np.asarray(group_noise, dtype=np.float64), group_sizes)
    xs, ys = [], []
    for _ in range(n_pairs):
        points = rng.normal(size=(n_points, len(noise)))
        permutation = rng.permutation(n_points)
        other = np.empty_like(points)
        other[permutation] = (points + noise * rng.normal(size=points.shape)) / np.sqrt(1.0 + noise ** 2)
        xs.append(pair_features(points, other))
        ys.append(permutation)
    return RaggedExamples.from_lists(xs, ys, len(noise))
