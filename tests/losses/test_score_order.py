"""The global order of scores over ranks (:class:`prbmrm.losses.multivariate.ScoreOrder`) and the spread
multivariate losses built on it: (a) the sample sort against numpy's sort of all the keys, ties and
interleaved tags included, with balanced ranges and :meth:`back` returning each key's value home; (b) the
spread losses against brute force with exact ties, and bitwise equal to one process holding the same
blocks (the same bits on 1, 2 and 3 ranks). Marker ``distributed``: tests/distributed/test_mpiexec.py runs
them again under mpiexec -n 2 and -n 3.
"""

import numpy as np
import pytest

from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.io import load_local, write_shards
from prbmrm.losses import get_loss
from prbmrm.losses.multivariate import ScoreOrder

pytestmark = pytest.mark.distributed

PAIRWISE = [name for name in ("roc_area", "ordinal") if get_loss(name).spread]
SPREAD = PAIRWISE + [name for name in ("prbep",) if get_loss(name).spread]


def split(n, comm, seed):
    """This rank's slice of n items split unevenly (every rank gets at least one when n >= size)."""
    sizes = np.random.default_rng(seed).multinomial(n - comm.size, np.ones(comm.size) / comm.size) + 1
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return int(bounds[comm.rank]), int(bounds[comm.rank + 1])


def gathered(comm, values):
    return comm.allgatherv_array(np.ascontiguousarray(values), 10 ** 7)


@pytest.mark.parametrize("distinct", [1, 5, 10 ** 6])
@pytest.mark.parametrize("interleaved", [False, True])
def test_the_sample_sort_orders_every_key_by_key_then_tag(comm, distinct, interleaved):
    m = 3000
    rng = np.random.default_rng(distinct)
    keys = rng.integers(0, distinct, size=2 * m).astype(np.float64)
    a, b = split(m, comm, distinct)
    if interleaved:
        # Two runs per rank (as ordinal's low then high events): tags of other ranks fall between.
        mine = np.r_[a:b, m + a:m + b]
    else:
        mine = np.r_[2 * a:2 * b]
    tags = mine.astype(np.int64)
    order = ScoreOrder(comm, keys[mine], tags * 7, tags if interleaved else None)
    # Ties by tag: here the global position unless interleaved.
    expected = np.lexsort((np.arange(2 * m), keys))
    owned_tags = order.owned_payload // 7
    np.testing.assert_array_equal(gathered(comm, owned_tags), expected)
    np.testing.assert_array_equal(gathered(comm, order.owned_keys), keys[expected])
    assert order.owned_before == np.sum(comm.allgather_array(np.array([order.owned_keys.size]))[:comm.rank])
    # Every key's value comes back to where the key came from.
    np.testing.assert_array_equal(order.back(owned_tags), tags)
    np.testing.assert_array_equal(order.back(order.owned_keys), keys[mine])
    # The ranges hold about 2m / P keys each, ties or not.
    sizes = comm.allgather_array(np.array([order.owned_keys.size], dtype=np.int64))[:, 0]
    assert sizes.sum() == 2 * m and sizes.max() <= 1.25 * 2 * m / comm.size


def all_pairs(f, y, cost):
    """m R and m dR/df of the pairs y_i < y_j, with the serial code's ties: a pair with margin exactly 0
    counts (subgradient 1) when its upper member j comes first in the data (ROC area: a positive before a
    negative; ordinal: no pair at margin 0)."""
    m = len(y)
    risk, c, pairs = 0.0, np.zeros(m), 0
    for i in range(m):
        for j in range(m):
            if y[i] < y[j]:
                pairs += 1
                weight = y[j] - y[i] if cost == "linear" else 1.0
                margin = 1 + f[i] - f[j]
                if margin > 0 or (margin == 0 and cost == "roc" and j < i):
                    risk += weight * margin
                    c[i] += weight
                    c[j] -= weight
    normalizer = np.sum(y > 0) * np.sum(y < 0) if cost == "roc" else pairs
    return risk * m / normalizer, c * m / normalizer


@pytest.mark.parametrize("name", PAIRWISE)
@pytest.mark.parametrize("seed", range(6))
def test_spread_losses_equal_all_pairs_with_ties(comm, name, seed):
    rng = np.random.default_rng(seed)
    m = 15
    # Integer scores: many equal, and margins exactly 0.
    X = rng.integers(-2, 3, size=(m, 2)).astype(np.float64)
    w = np.array([1.0, 0.0]) if seed % 2 else np.zeros(2)
    if name == "roc_area":
        y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
        cost = "roc"
    else:
        y = rng.permutation(np.r_[0.0, 3.0, rng.integers(0, 4, size=m - 2)]).astype(np.float64)
        cost = "constant"
    a, b = split(m, comm, seed)
    loss = get_loss(name)
    risk = DistributedRisk(loss, X[a:b], y[a:b], m, comm)
    values = run_distributed(risk, lambda evaluate: [evaluate(w)])
    if comm.is_root:
        (r, g), = values
        expected_risk, c = all_pairs(X @ w, y, cost)
        assert r == pytest.approx(expected_risk / m, rel=1e-14, abs=1e-15)
        np.testing.assert_allclose(g, X.T @ c / m, rtol=1e-14, atol=1e-15)
        # The serial coefficients, with the same ties.
        risk_sum, c_serial = loss.coefficients(X @ w, y)
        np.testing.assert_allclose(c_serial, c, rtol=1e-14, atol=1e-14)
        assert risk_sum == pytest.approx(expected_risk, rel=1e-14, abs=1e-14)


def all_labelings(f, y):
    """m R and the c = y' - y of every maximizing y' of the PRBEP risk, by enumerating the 2^m labelings."""
    m = len(y)
    z = np.array([[1.0 if (code >> i) & 1 else -1.0 for i in range(m)] for code in range(2 ** m)])
    false_neg = np.sum((z < 0) & (y > 0), axis=1)
    false_pos = np.sum((z > 0) & (y < 0), axis=1)
    values = np.where(false_neg == false_pos, false_neg / np.sum(y > 0), -np.inf) + (z - y) @ f / m
    best = values.max()
    return best * m, z[values >= best - 1e-12] - y


@pytest.mark.parametrize("seed", range(8))
def test_prbep_spread_equals_all_labelings_with_ties(comm, seed):
    rng = np.random.default_rng(seed)
    m = 12
    # Integer scores: many equal, and increments of the total exactly 0.
    X = rng.integers(-2, 3, size=(m, 2)).astype(np.float64)
    w = np.array([1.0, 0.5]) if seed % 2 else np.array([0.25, 0.0])
    y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
    a, b = split(m, comm, seed)
    loss = get_loss("prbep")
    risk = DistributedRisk(loss, X[a:b], y[a:b], m, comm)
    values = run_distributed(risk, lambda evaluate: [evaluate(w)])
    if comm.is_root:
        (r, g), = values
        expected_risk, best = all_labelings(X @ w, y)
        assert r == pytest.approx(expected_risk / m, rel=1e-14, abs=1e-15)
        # a = X^T c / m for a maximizing labeling: the fewest flips, the lowest positives and highest
        # negatives, ties in example order (the serial coefficients).
        risk_sum, c = loss.coefficients(X @ w, y)
        assert any(np.array_equal(c, candidate) for candidate in best)
        assert risk_sum == pytest.approx(expected_risk, rel=1e-14, abs=1e-14)
        np.testing.assert_allclose(g, X.T @ c / m, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", SPREAD)
def test_spread_losses_give_the_same_bits_on_any_number_of_ranks(comm, mpi_tmp_path, name):
    from helpers import load_svmlight

    X, y = load_svmlight("abalone.xz" if name == "ordinal" else "a9a.xz")
    X, y = X[:2000], y[:2000]
    directory = str(mpi_tmp_path / "shards")
    if comm.is_root:
        write_shards(X, y, directory, 5)
    comm.barrier()
    local = load_local(directory, comm)
    rng = np.random.default_rng(1)
    # w = 0 puts every score at one value; rounded weights make many ties.
    points = [np.zeros(X.shape[1]), np.round(rng.normal(size=X.shape[1]), 1), rng.normal(size=X.shape[1]) * 0.1]
    risk = DistributedRisk(get_loss(name), local.X, local.y, local.n_examples_total, comm, local.blocks)
    values = run_distributed(risk, lambda evaluate: [evaluate(w) for w in points])
    if comm.is_root:
        one = load_local(directory, SerialComm())
        serial = DistributedRisk(get_loss(name), one.X, one.y, one.n_examples_total, SerialComm(), one.blocks)
        for w, (r, a) in zip(points, values):
            r_one, a_one = serial(w)
            assert r == r_one and r > 0
            np.testing.assert_array_equal(a, a_one)


@pytest.mark.parametrize("seed", range(4))
def test_shared_measures_equal_those_of_all_scores(comm, seed):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    m = 40
    f = rng.integers(0, 5, size=m).astype(np.float64)   # ties
    y = rng.permutation(np.r_[-1.0, 1.0, rng.choice([-1.0, 1.0], size=m - 2)])
    a, b = split(m, comm, seed)
    shared = get_loss("roc_area").shared_metrics(f[a:b], y[a:b], None, comm)
    assert shared["roc_area"] == pytest.approx(roc_auc_score(y > 0, f), rel=1e-14)
    # Scores with ties, at and around 0 (fbeta predicts f >= 0), and labels of either class in the top ones.
    for name, scores, target in (("hinge", f, y), ("least_squares", f, f + rng.normal(size=m)), ("prbep", f, y),
                                 ("prbep", f, np.where(f > 2, 1.0, -1.0)), ("fbeta", f - 2, y), ("fbeta", f - 2, -y)):
        loss = get_loss(name, **({"beta": 0.5 + seed} if name == "fbeta" else {}))
        expected = loss.metrics(scores, target)
        assert loss.shared_metrics(scores[a:b], target[a:b], None, comm) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("name, labels, message", [
    ("roc_area", 1.0, "needs both positive and negative examples, got 12 positive and 0 negative"),
    ("ordinal", 2.0, "all 12 labels are equal: no pair to order")])
def test_a_spread_loss_fails_on_every_rank_with_one_message(comm, name, labels, message):
    from prbmrm.errors import CollectiveError

    a, b = split(12, comm, 0)
    X = np.ones((12, 2))
    risk = DistributedRisk(get_loss(name), X[a:b], np.full(b - a, labels), 12, comm)
    with pytest.raises(CollectiveError, match=message):
        run_distributed(risk, lambda evaluate: evaluate(np.zeros(2)))
