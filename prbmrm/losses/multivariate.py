"""Multivariate scores that do not decompose over examples (paper 000, App. A.3).

Every risk here is a convex upper bound ("majorization") of a ranking or
contingency-table error, written with the scores ``f = X w`` of all m
examples. The non-decomposable ones (:class:`MultivariateLoss`) compute
``(risk_sum, c)`` with ``R_emp = risk_sum / m`` and ``a = X.T @ c / m``; so each
returns ``m * R`` and ``m * dR/df``. ``roc_area``, ``ordinal`` and ``prbep``
are spread over the ranks: every rank passes the scores of its own examples
to ``local_coefficients``, a sample sort (:class:`ScoreOrder`) puts them in
one global order with about m/P on each rank, counts (or, for ``prbep``, the
number of flips, found by a search over the sorted scores) come back, and
each rank gets the c of its examples and its blocks' shares of the risk: the
same bits on any number of ranks, and no rank handles all m scores. The
others (``preference``: arbitrary pairs; ``fbeta``: a best false-positive
count for every true-positive count, from prefix sums of floats over the
global order) run ``coefficients(f, y)`` on rank 0 over all examples in
global order. The definitions (P = pairs, C = costs)::

    roc_area    R = 1/(m+ m-)  sum_{y_i < y_j} max(0, 1 + f_i - f_j)              (eq. 27, Alg. 7)
    ordinal     R = 1/M  sum_{y_i < y_j} C(y_i, y_j) max(0, 1 + f_i - f_j),       (Alg. 8)
                M = (m^2 - sum_k m_k^2) / 2,  C = 1 (constant) or y_j - y_i (linear)
    preference  R = 1/|P|  sum_{(i, j) in P} C_ij max(0, 1 + f_i - f_j)            (Alg. 9)
                (j should rank above i)
    fbeta       R = max_{y' in {-1,1}^m} [Delta(y', y) + (1/m) sum_i (y'_i - y_i) f_i],
                Delta = 1 - F_beta(contingency table of y' against y)              (Alg. 11)
    prbep       the same with Delta = FN / m+ if FN = FP, -inf otherwise           (paper 004, eq. 2)
    ndcg        R = (1/m) sum_queries l_q,  l_q = max_pi [Delta(pi) + <c, f(pi)>] - <c_bar, f>
                Delta = 1 - NDCG@k(pi)                                             (Alg. 10, eq. 28)

``fbeta`` and ``prbep`` use the normalization of paper 004, eq. (2): the score
term is divided by m, so that the risk is O(1) like the averaged losses and
``--lam`` has the same scale as for them (paper 000 writes Alg. 11 without the
1/m; that is the same risk with lam multiplied by m).

``ndcg`` decomposes over queries, and queries never cross blocks, so it is a
plain per-block :meth:`Loss.loss_gradient` summed over the queries of the block.

ROC area and ordinal regression run in O(m log m) with NumPy sorts and
prefix sums, with no Python loop over examples; F-beta and PRBEP in
O(m log m) (better than the O(m^2) of Alg. 11: the inner maximization over
tables is concave in the number of false positives and found by bisection).

Imports: numpy, scipy, sklearn; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.losses.base`,
:mod:`prbmrm.kernels.order` (and a communicator handed in, never imported).
"""

import math

import numpy as np

from ..errors import InputError
from ..kernels.order import Workspace, order_keys, order_values, roc_keys, roc_weights, sorted_order, split_ranges
from .base import Loss, MultivariateLoss, _format_labels


# --------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------

def _check_plus_minus(name, classes, label_kind):
    """Error text unless the labels are exactly {-1, +1} (both present)."""
    if label_kind == "multilabel" or classes is None or set(classes) != {-1.0, 1.0}:
        shown = ("real values" if classes is None and label_kind != "multilabel"
                 else "multilabel data" if label_kind == "multilabel" else _format_labels(classes))
        return (f"loss {name!r} needs labels in {{-1, +1}}, both present; the data has {shown} "
                "(give --positive LABEL for one class against the rest)")
    return None


def _require_both_classes(name, m_pos, m_neg):
    """Raise the InputError of a loss `name` that needs both classes, unless m_pos and m_neg are both > 0."""
    if m_pos == 0 or m_neg == 0:
        raise InputError(f"loss {name!r}: needs both positive and negative examples, "
                         f"got {m_pos} positive and {m_neg} negative")


def _plus_minus_counts(name, y):
    positive = y > 0
    m_pos = int(np.count_nonzero(positive))
    m_neg = y.size - m_pos
    _require_both_classes(name, m_pos, m_neg)
    return positive, m_pos, m_neg


def _pair_sums(level, key_low, key_high, weights_low, weights_high):
    """Sums over the "active" pairs: level_i < level_j and key_low_i > key_high_j.

    The 2m keys are sorted once (a low key before an equal high key, so that
    only strictly greater keys count). The pairs with level_i < level_j are
    split by the highest bit in which the two level numbers differ: at that bit
    i has 0 and j has 1, and the higher bits (the "group") agree. For each bit,
    a stable sort by group (a radix sort of small integers) keeps the key order
    inside each group, and prefix sums give every i the sum over the j of its
    group whose high key comes earlier, and every j the sum over the i whose
    low key comes later: O(m log m) once plus O(m) per bit, log2(levels) bits,
    no loop over examples.

    Parameters
    ----------
    level : ndarray of int64, shape (m,)
        Dense level numbers 0..n-1 (the order of the labels).
    key_low, key_high : ndarray, shape (m,)
        Values compared across a pair: i as the lower member uses
        ``key_low``, j as the upper one ``key_high``.
    weights_low, weights_high : ndarray of shape (m, p)
        Per-example quantities summed over the partners.

    Returns
    -------
    low_sums : ndarray of shape (m, p)
        For each i, the sum of ``weights_high[j]`` over its active partners j.
    high_sums : ndarray of shape (m, p)
        For each j, the sum of ``weights_low[i]`` over its active partners i.
    """
    m = level.size
    low_sums = np.zeros((m, weights_high.shape[1]))
    high_sums = np.zeros((m, weights_low.shape[1]))
    if m == 0:
        return low_sums, high_sums
    # Everything below runs on the 2m events in key order, one 1-D array per column.
    order = np.argsort(np.concatenate([key_low, key_high]), kind="stable")
    is_low = order < m
    example = np.where(is_low, order, order - m)
    low_weights = [np.where(is_low, column[example], 0.0) for column in weights_low.T]
    high_weights = [np.where(is_low, 0.0, column[example]) for column in weights_high.T]
    low_out, high_out = _event_pair_sums(is_low, level[example], low_weights, high_weights)
    low_sums[example[is_low]] = np.column_stack(low_out)[is_low]
    high_sums[example[~is_low]] = np.column_stack(high_out)[~is_low]
    return low_sums, high_sums


def _event_pair_sums(is_low, event_level, low_weights, high_weights):
    """:func:`_pair_sums` on its events, already in key order (a low key before an equal high key).

    Parameters
    ----------
    is_low : ndarray of bool, shape (e,)
        Whether each event is the low key of its example (else the high key).
    event_level : ndarray of int64, shape (e,)
        The level of each event's example.
    low_weights, high_weights : lists of ndarray of shape (e,)
        Per column, the weights of the low events (0 at high events), and of the high ones.

    Returns
    -------
    low_out, high_out : lists of ndarray of shape (e,)
        Per column of `high_weights`, at each low event the sum over the high events before it
        with a higher level; per column of `low_weights`, at each high event the sum over the low
        events after it with a lower level.
    """
    size = is_low.size
    low_out = [np.zeros(size) for _ in high_weights]    # filled at low events
    high_out = [np.zeros(size) for _ in low_weights]    # filled at high events
    if size == 0:
        return low_out, high_out
    top = int(event_level.max())
    small = np.int16 if top < 2**15 else np.int32 if top < 2**31 else np.int64
    for bit in range(max(1, top.bit_length())):
        at_bit = ((event_level >> bit) & 1).astype(bool)
        low_event = is_low & ~at_bit      # the low key of a candidate lower member
        high_event = ~is_low & at_bit     # the high key of a candidate upper member
        group = (event_level >> (bit + 1)).astype(small)
        if top >> (bit + 1) == 0:
            by_group = slice(None)        # one group: the key order as it is
            first, last = 0, size
        else:
            by_group = np.argsort(group, kind="stable")   # radix sort of small integers
            sizes = np.bincount(group)
            first = np.repeat(np.cumsum(sizes) - sizes, sizes)
            last = first + np.repeat(sizes, sizes)
        low_event, high_event = low_event[by_group], high_event[by_group]
        for weights, out in zip(high_weights, low_out):
            # Each lower member: the upper members of its group whose high key comes earlier.
            prefix = np.concatenate([[0.0], np.cumsum(weights[by_group] * high_event)])
            out[by_group] += (prefix[:-1] - prefix[first]) * low_event
        for weights, out in zip(low_weights, high_out):
            # Each upper member: the lower members of its group whose low key comes later.
            prefix = np.concatenate([[0.0], np.cumsum(weights[by_group] * low_event)])
            out[by_group] += (prefix[last] - prefix[1:]) * high_event
    return low_out, high_out


def _dense_levels(y):
    values, level = np.unique(y, return_inverse=True)
    return values, level.astype(np.int64).ravel()


def pairwise_accuracy(f, y):
    """Fraction of the pairs y_i < y_j ordered f_i < f_j, ties in f counting 1/2 (O(m log m)).

    For labels +-1 this is the ROC area; in general Harrell's concordance index.
    """
    f = np.asarray(f, dtype=np.float64).ravel()
    _, level = _dense_levels(y)
    _, rank = np.unique(f, return_inverse=True)
    rank = rank.astype(np.int64).ravel()
    ones = np.ones((f.size, 1))
    counts = np.bincount(level).astype(np.float64)
    pairs = (counts.sum() ** 2 - np.sum(counts ** 2)) / 2
    if pairs == 0:
        return float("nan")
    # f_i > f_j (discordant), then f_i >= f_j (discordant or tied), in integer ranks of f.
    discordant = _pair_sums(level, rank, rank, ones, ones)[1].sum()
    not_concordant = _pair_sums(level, rank, rank - 0.5, ones, ones)[1].sum()
    tied = not_concordant - discordant
    return float((pairs - not_concordant + 0.5 * tied) / pairs)


def precision_recall_break_even(f, y):
    """PRBEP: precision (= recall) of the m+ highest scores; ties at the cut shared in proportion."""
    f = np.asarray(f, dtype=np.float64).ravel()
    positive = np.asarray(y).ravel() > 0
    m_pos = int(np.count_nonzero(positive))
    if m_pos == 0:
        return float("nan")
    threshold = np.sort(f)[::-1][m_pos - 1]
    above = f > threshold
    tied = f == threshold
    needed = m_pos - np.count_nonzero(above)
    share = np.count_nonzero(tied & positive) / np.count_nonzero(tied)
    hits = np.count_nonzero(above & positive) + needed * share
    return float(hits / m_pos)


# --------------------------------------------------------------------------
# The global order of scores over ranks (a sample sort)
# --------------------------------------------------------------------------

SORT_SAMPLES = 64
"""Samples of its sorted keys each rank gathers to every rank, per rank of the job, to choose the splitters of a
:class:`ScoreOrder`: the ranges then hold about m/P keys each, within a few percent."""


def _rank_counts(comm, counts):
    """Every rank's small integer `counts`, one row per rank (collective; None: this process's only)."""
    if comm is None:
        return np.asarray(counts, dtype=np.int64)[None, :]
    return comm.allgather_array(np.asarray(counts, dtype=np.int64))


def _lower_ranks_sum(comm, count):
    """The sum of the integer `count` over the ranks below this one (collective; None: one process)."""
    if comm is None or comm.size == 1:
        return 0
    return int(comm.allgather_array(np.array([count], dtype=np.int64))[:comm.rank, 0].sum())


def _block_risks(weights, values, bounds, scale):
    """``sum(weights * values) * scale`` per block of rows between `bounds` (numpy's pairwise sum: the same
    bits for the same block wherever it lies)."""
    return np.array([float(np.sum(weights[a:b] * values[a:b])) * scale for a, b in zip(bounds[:-1], bounds[1:])])


def _owned_at(comm, orders, values, positions):
    """Every rank: the values of several sample sorts at the same global positions (collective, one gather).

    ``values[k]`` holds one value per key owned here by ``orders[k]`` (a
    :class:`ScoreOrder`), in global order; returns an array of shape
    ``(len(orders), len(positions))``: at each position the value from the
    rank that owns it.
    """
    parts = []
    for order, owned in zip(orders, values):
        here = positions - order.owned_before
        mine = (here >= 0) & (here < owned.size)
        picked = owned[np.where(mine, here, 0)] if owned.size else np.zeros(positions.size)
        parts += [np.where(mine, picked, 0.0), mine.astype(np.float64)]
    every = np.concatenate(parts)[None] if comm is None else comm.allgather_array(np.concatenate(parts))
    every = every.reshape(every.shape[0], len(orders), 2, positions.size)
    owner = np.argmax(every[:, :, 1], axis=0)
    return np.take_along_axis(every[:, :, 0], owner[None], axis=0)[0]


PROBES = 1024
"""Positions a rank looks at per gather in :func:`_leading` (about log(count) / log(PROBES) gathers)."""


def _leading(count, holds):
    """The number of positions j < count at which `holds` is True, given that it holds on a prefix of them.

    ``holds(positions)`` takes ascending positions (alike on every rank) and
    returns a bool per position; each call looks at up to :data:`PROBES`
    positions spread over the interval still open.
    """
    lo, hi = 0, count   # holds below lo, fails at hi (if hi < count)
    while lo < hi:
        probes = min(PROBES, hi - lo)
        positions = lo + (np.arange(probes, dtype=np.int64) * (hi - lo)) // probes
        failing = np.flatnonzero(~holds(positions))
        if failing.size == 0:
            lo = int(positions[-1]) + 1
        else:
            hi = int(positions[failing[0]])
            lo = int(positions[failing[0] - 1]) + 1 if failing[0] else lo
    return lo


class ScoreOrder:
    """The global order of per-example keys over all ranks, by a sample sort: no rank holds every key.

    Collective. The order is by key, then by tag: by default the global
    position of the key (its rank, then its place in the rank's array), else
    the given int64 tags (distinct over all ranks). Keys travel as order
    keys (:func:`prbmrm.kernels.order.order_keys`: -0.0 equals 0.0, NaN
    comes last). Every rank picks the same P - 1 splitters from samples of
    all ranks (:data:`SORT_SAMPLES` per rank and rank of the job), sends each
    key, with its payload (and tag), to the rank owning its range ("owner",
    one Alltoallv of int64 rows), and the owner sorts what it received
    (:func:`prbmrm.kernels.order.sorted_order`). Only keys, tags and a
    payload travel (8 bytes each), never features; every rank holds and
    sorts about m / P of them, whatever the ties. The owner computes a value
    per owned key and :meth:`back` returns each key's value to the rank it
    came from.

    Parameters
    ----------
    comm : prbmrm.distributed.comm.SerialComm or MPIComm, or None
        None: every key is here (one process, no communicator).
    keys : ndarray of float64, shape (n,)
        The keys, or their order keys (uint64, :func:`prbmrm.kernels.order.order_keys`).
    payload : ndarray of int64, shape (n,)
        Carried with each key (e.g. its class).
    tags : ndarray of int64, shape (n,), optional
        Ties of keys in tag order instead of global position.
    counts : ndarray of int64, shape (P,), optional
        The number of keys of every rank, if known (else gathered).
    work : prbmrm.kernels.order.Workspace, optional
        Where the order keeps its arrays (and those of :meth:`back`): valid until the next order made
        with the same `work`.

    Attributes
    ----------
    arrived_payload : ndarray of int64
        The payloads of this rank's range, in the order they arrived.
    order : ndarray of intp
        The arrived keys in global order: ``arrived_payload[order]`` is :attr:`owned_payload`.
    owned_before : int
        The number of keys in the ranges of the lower ranks: the global position of the first owned key.
    """

    def __init__(self, comm, keys, payload, tags=None, counts=None, work=None):
        self._comm = comm if comm is not None and comm.size > 1 else None
        self._work = work = Workspace() if work is None else work
        if np.asarray(keys).dtype != np.uint64:
            values = np.ascontiguousarray(keys, dtype=np.float64).ravel()
            keys = np.empty(values.size, dtype=np.uint64)
            order_keys(values, keys)
        payload = np.ascontiguousarray(payload, dtype=np.int64)
        tags = None if tags is None else np.ascontiguousarray(tags, dtype=np.int64)
        self.owned_before = 0
        if self._comm is not None:
            counts = comm.gather_counts(keys.size) if counts is None else np.asarray(counts, dtype=np.int64)
            first = int(counts[:comm.rank].sum())
            split_keys, split_tags = self._splitters(keys, tags, first, counts)
            # One exchange of rows (key, payload[, tag]), range by range, each range's keys in their order here.
            rows = work.array("order rows", (keys.size, 2 if tags is None else 3), np.int64)
            self._local = work.array("order local", keys.size, np.intp)
            self._send = np.empty(comm.size, dtype=np.int64)
            split_ranges(keys, payload, tags, first, split_keys, split_tags, rows, self._local, self._send)
            rows, matrix = comm.alltoallv_array(rows, self._send, int(counts.sum()),
                                                allocate=lambda shape, dtype: work.array("order arrived", shape, dtype))
            self._received = matrix[:, comm.rank]
            self.owned_before = int(matrix[:, :comm.rank].sum())
            keys, payload = rows[:, 0].view(np.uint64), rows[:, 1]
            tags = None if tags is None else rows[:, 2]
        # What arrived from the ranks in order, each part in its own order: ties by arrival are
        # ties by global position.
        self.order = sorted_order(keys, tags, work)
        self.arrived_payload = payload
        self._keys = keys

    def _splitters(self, keys, tags, first, counts):
        """The P - 1 splitters (order keys and tags, ascending), alike on every rank."""
        comm = self._comm
        limit = SORT_SAMPLES * comm.size
        samples = np.minimum(counts, limit)
        positions = (np.arange(samples[comm.rank]) * keys.size) // max(samples[comm.rank], 1)
        # One gather: each rank's sampled keys (their bits), then their tags.
        gathered = comm.allgatherv_array(np.concatenate([keys[positions].view(np.int64),
                                                         first + positions if tags is None else tags[positions]]),
                                         2 * limit * comm.size)
        first = 2 * np.repeat(np.cumsum(samples) - samples, samples)
        within = np.arange(samples.sum()) - np.repeat(np.cumsum(samples) - samples, samples)
        sample_keys = gathered[first + within].view(np.uint64)
        sample_tags = gathered[first + samples.repeat(samples) + within]
        if sample_keys.size == 0:
            # No key anywhere: splitters above every key.
            return np.full(comm.size - 1, np.iinfo(np.uint64).max), np.full(comm.size - 1, np.iinfo(np.int64).max)
        # Each sample stands for counts / samples keys of its rank.
        weights = np.repeat(counts / np.maximum(samples, 1), samples)
        by_key = np.lexsort((sample_tags, sample_keys))
        reach = np.cumsum(weights[by_key])
        chosen = by_key[np.minimum(np.searchsorted(reach, reach[-1] * np.arange(1, comm.size) / comm.size),
                                   by_key.size - 1)]
        return np.ascontiguousarray(sample_keys[chosen]), np.ascontiguousarray(sample_tags[chosen])

    @property
    def owned_keys(self):
        """ndarray of float64: the keys of this rank's range, in global order (-0.0 as 0.0)."""
        values = np.empty(self.order.size)
        order_values(np.ascontiguousarray(self._keys[self.order]), values)
        return values

    @property
    def owned_payload(self):
        """ndarray of int64: the payloads of this rank's range, in global order."""
        return self.arrived_payload[self.order]

    def exclusive(self, count):
        """The sum of the integer `count` over the lower ranks (every rank passes its own)."""
        return _lower_ranks_sum(self._comm, count)

    def back(self, values, arrived=False):
        """Return, in this rank's local order, the values the owners computed for its keys.

        Parameters
        ----------
        values : ndarray of float64 or int64, shape (len(order),) (rows of 2-D arrays travel whole)
            One value per owned key, in global order (in the order of arrival if `arrived`).
        arrived : bool
            Whether `values` are in the order the keys arrived (as :attr:`arrived_payload`).
        """
        values = np.asarray(values)
        work = self._work
        if not arrived:
            values, ordered = work.array("back arrived", values.shape, values.dtype), values
            values[self.order] = ordered
        if self._comm is None:
            return values
        returned, _ = self._comm.alltoallv_array(values, self._received, 0, received_counts=self._send,
                                                 allocate=lambda shape, dtype: work.array("back returned", shape,
                                                                                          dtype))
        out = work.array("back", returned.shape, returned.dtype)
        out[self._local] = returned
        return out

# --------------------------------------------------------------------------
# ROC area (Alg. 7) and ordinal regression (Alg. 8)
# --------------------------------------------------------------------------

class RocArea(MultivariateLoss):
    """ROC-area risk, eq. (27): ``1/(m+ m-) sum_{y_i=-1, y_j=+1} max(0, 1 + f_i - f_j)``.

    Computed as in Algorithm 7: with ``c = f - y/2``, sort c once (equal values
    in example order); a negative example enters with weight (number of
    positives before it), a positive one with minus (number of negatives after
    it); ``R = <l, c> / (m+ m-)`` and ``dR/df = l / (m+ m-)``. O(m log m).
    Across ranks the sort is a :class:`ScoreOrder`: every rank counts the
    examples of its range of c and gets back the weights l of its own examples
    (integers, so the same on any number of ranks); ``<l, c>`` is summed per
    block. Labels +-1; the risk ignores a constant offset of the scores.
    Measure: the ROC area (AUC) of the scores.
    """

    name = "roc_area"
    task = "ranking"
    spread = True

    def check_labels(self, classes, label_kind):
        return _check_plus_minus(self.name, classes, label_kind)

    def local_coefficients(self, f, y, comm, bounds, qid=None, work=None):
        f = np.ascontiguousarray(f, dtype=np.float64).ravel()
        work = Workspace() if work is None else work
        c, keys = work.array("roc c", f.size, np.float64), work.array("roc keys", f.size, np.uint64)
        positive = work.array("roc class", f.size, np.int64)
        positives = roc_keys(f, np.ascontiguousarray(y, dtype=np.float64).ravel(), c, keys, positive)
        counts = _rank_counts(comm, [f.size, positives])
        m, m_pos = (int(v) for v in counts.sum(axis=0))
        m_neg = m - m_pos
        _require_both_classes(self.name, m_pos, m_neg)
        order = ScoreOrder(comm, keys, positive, counts=counts[:, 0], work=work)
        is_pos = work.array("roc arrived class", order.arrived_payload.size, np.int8)
        is_pos[:] = order.arrived_payload
        l = work.array("roc arrived weights", is_pos.size, np.float64)
        roc_weights(is_pos, order.order, order.exclusive(int(np.count_nonzero(is_pos))), order.owned_before,
                    m_neg, l)
        l = order.back(l, arrived=True)
        scale = m / (float(m_pos) * m_neg)
        risks = _block_risks(l, c, bounds, scale)
        return risks, np.multiply(l, scale, out=l)

    def shared_metrics(self, f, y, qid, comm):
        """The ROC area over all ranks: the pairs a positive scores above, plus half those it ties with.

        Two sorts of the scores across ranks (:class:`ScoreOrder`), equal
        scores with the positives first and then last: the negatives before
        each positive count the pairs it wins without and with the ties.
        """
        positive = np.asarray(y).ravel() > 0
        f = np.asarray(f, dtype=np.float64).ravel()
        counts = _rank_counts(comm, [positive.size, np.count_nonzero(positive)])
        (m, m_pos), offset = counts.sum(axis=0), int(counts[:comm.rank if comm else 0, 0].sum())
        if m_pos in (0, m):
            return {"roc_area": float("nan")}
        index = offset + np.arange(f.size, dtype=np.int64)
        wins = 0
        for last in (positive, ~positive):
            # Ties by tag: the class put last, then the example's index.
            order = ScoreOrder(comm, f, positive.astype(np.int64), last * np.int64(m) + index, counts[:, 0])
            is_pos = order.owned_payload
            negatives_before = (order.owned_before - order.exclusive(np.count_nonzero(is_pos))
                                + np.arange(is_pos.size) - (np.cumsum(is_pos) - is_pos))
            wins += int(np.sum(negatives_before[is_pos == 1]))
        wins = int(_rank_counts(comm, [wins]).sum())
        return {"roc_area": wins / (2.0 * m_pos * (m - m_pos))}

    def metrics(self, f, y, qid=None):
        from sklearn.metrics import roc_auc_score

        f = np.asarray(f).ravel()
        if np.unique(y).size < 2:
            return {"roc_area": float("nan")}
        return {"roc_area": float(roc_auc_score(np.asarray(y).ravel() > 0, f))}


class Ordinal(MultivariateLoss):
    """Ordinal regression, Algorithm 8: ``1/M sum_{y_i < y_j} C(y_i, y_j) max(0, 1 + f_i - f_j)``.

    ``M = (m^2 - sum_k m_k^2) / 2`` is the number of pairs with different
    labels (m_k examples have the k-th label value); the cost ``C`` is 1
    (``cost=constant``, Joachims 2006) or ``y_j - y_i`` (``cost=linear``, in
    label units). With ``u = f + 1/2`` and ``v = f - 1/2`` a pair is active
    when ``u_i > v_j``; the counts and label sums over the active partners of
    every example come from one sort of the 2m values u, v and, per bit of the
    level number, a radix sort of group numbers and prefix sums (see
    ``_pair_sums``): O(m log m + m log n) for n levels, no loop over examples.
    Integer labels.
    Measures: Kendall's tau (tau-b) and the pairwise accuracy (ties count 1/2).
    """

    name = "ordinal"
    task = "ranking"
    params = {"cost": "constant"}
    spread = True

    def check_params(self):
        self._require("cost", self.cost in ("constant", "linear"), "'constant' or 'linear'")

    def check_labels(self, classes, label_kind):
        if label_kind not in ("binary", "integer") or classes is None or len(classes) < 2:
            shown = ("real values" if label_kind == "real" else "multilabel data"
                     if label_kind == "multilabel" else _format_labels(classes))
            return f"loss {self.name!r} needs integer labels with at least two values, the data has {shown}"
        return None

    def local_coefficients(self, f, y, comm, bounds, qid=None, work=None):
        y = np.asarray(y, dtype=np.float64).ravel()
        # The label values of all ranks, numbered alike everywhere.
        values = np.unique(y)
        if comm is not None:
            values = np.unique(comm.allgatherv_array(values, _rank_counts(comm, [y.size]).sum()))
        level = np.searchsorted(values, y).astype(np.int64)
        per_rank = _rank_counts(comm, np.bincount(level, minlength=values.size))
        counts = per_rank.sum(axis=0).astype(np.float64)
        m = int(counts.sum())
        pairs = (float(m) ** 2 - float(np.sum(counts ** 2))) / 2
        if pairs == 0:
            raise InputError(f"loss {self.name!r}: all {m} labels are equal: no pair to order")
        u, v = f + 0.5, f - 0.5
        # The 2n events of this rank's examples (low keys u, then high keys v), in the order of
        # (key, low before high, example): tags low 0..m-1, high m..2m-1 by global index.
        index = np.arange(y.size, dtype=np.int64) + int(per_rank[:comm.rank if comm else 0].sum())
        order = ScoreOrder(comm, np.concatenate([u, v]), np.concatenate([2 * level, 2 * level + 1]),
                           np.concatenate([index, m + index]), 2 * per_rank.sum(axis=1), work)
        is_low = order.owned_payload % 2 == 0
        event_level = order.owned_payload // 2
        columns = [np.ones(is_low.size)] + [values[event_level]] * (self.cost == "linear")
        low_weights = [np.where(is_low, column, 0.0) for column in columns]
        high_weights = [np.where(is_low, 0.0, column) for column in columns]
        low_out, high_out = _event_pair_sums(is_low, event_level, low_weights, high_weights)
        # The partners on other ranges: high events of lower ranges, low events of higher ones, by
        # level (integer-valued sums: exact, the same on any number of ranks).
        histograms = np.stack([np.bincount(event_level, weights, minlength=values.size)
                               for weights in high_weights + low_weights])
        every = histograms[None] if comm is None else comm.allgather_array(histograms.ravel()).reshape(
            (comm.size,) + histograms.shape)
        rank = 0 if comm is None else comm.rank
        below_high = every[:rank, :len(columns)].sum(axis=0)
        above_low = every[rank + 1:, len(columns):].sum(axis=0)
        # Higher levels than each low event's, lower than each high event's.
        higher = np.cumsum(below_high[:, ::-1], axis=1)[:, ::-1] - below_high
        lower = np.cumsum(above_low, axis=1) - above_low
        sums = np.where(is_low[:, None], np.column_stack(low_out) + higher[:, event_level].T,
                        np.column_stack(high_out) + lower[:, event_level].T)
        sums = order.back(sums)
        low, high = sums[:y.size], sums[y.size:]
        if self.cost == "constant":
            as_low, as_high = low[:, 0], high[:, 0]
        else:
            # C = y_j - y_i: sum over partners of y_j - y_i = (sum of y_j) - y_i * count, etc.
            as_low = low[:, 1] - y * low[:, 0]
            as_high = y * high[:, 0] - high[:, 1]
        scale = m / pairs
        risks = _block_risks(np.ones(y.size), u * as_low - v * as_high, bounds, scale)
        return risks, (as_low - as_high) * scale

    def metrics(self, f, y, qid=None):
        from scipy.stats import kendalltau

        f = np.asarray(f, dtype=np.float64).ravel()
        y = np.asarray(y, dtype=np.float64).ravel()
        tau = float(kendalltau(y, f).statistic) if np.unique(y).size > 1 else float("nan")
        return {"kendall_tau": tau, "pairwise_accuracy": pairwise_accuracy(f, y)}


# --------------------------------------------------------------------------
# Preference relations (Alg. 9)
# --------------------------------------------------------------------------

def read_pairs(path):
    """Read a preference file: one ``i j [cost]`` line per preference "j above i".

    Indices are 0-based global example numbers; the cost defaults to 1. Blank
    lines and text after ``#`` are ignored.

    Returns
    -------
    lower, upper : ndarray of int64
        i and j of every pair.
    cost : ndarray of float64
    line : ndarray of int64
        The 1-based line number of every pair (for messages).

    Raises
    ------
    InputError
        Naming the file and the line, for anything but the format above.
    """
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except FileNotFoundError:
        raise InputError(f"{path}: no such preference pairs file") from None
    except (OSError, UnicodeDecodeError) as problem:
        raise InputError(f"{path}: cannot read the preference pairs file ({problem})") from None
    lower, upper, cost, lines = [], [], [], []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) not in (2, 3):
            raise InputError(f"{path}: line {number}: expected 'i j' or 'i j cost' (j preferred "
                             f"to i), got {raw.strip()!r}")
        index = []
        for token in fields[:2]:
            try:
                value = float(token)
            except ValueError:
                value = float("nan")
            if not (math.isfinite(value) and value >= 0 and value == int(value) and value < 2**53):
                raise InputError(f"{path}: line {number}: {token!r} is not an example index "
                                 "(a 0-based integer >= 0)")
            index.append(int(value))
        if index[0] == index[1]:
            raise InputError(f"{path}: line {number}: example {index[0]} is preferred to itself")
        weight = 1.0
        if len(fields) == 3:
            try:
                weight = float(fields[2])
            except ValueError:
                weight = float("nan")
            if not (math.isfinite(weight) and weight >= 0):
                raise InputError(f"{path}: line {number}: cost {fields[2]!r} is not a finite number >= 0")
        lower.append(index[0])
        upper.append(index[1])
        cost.append(weight)
        lines.append(number)
    if not lower:
        raise InputError(f"{path}: the preference pairs file has no pairs")
    return (np.array(lower, dtype=np.int64), np.array(upper, dtype=np.int64),
            np.array(cost, dtype=np.float64), np.array(lines, dtype=np.int64))


class Preference(MultivariateLoss):
    """Preference relations, Algorithm 9: ``1/|P| sum_{(i,j) in P} C_ij max(0, 1 + f_i - f_j)``.

    ``pairs=FILE`` lists the preferences, one ``i j [cost]`` line each: example
    j (0-based, global order of the data) should score above example i, at
    cost ``C_ij`` (default 1). The file is read on rank 0 at the first risk
    evaluation (or by :meth:`metrics`); an index beyond the data is an error
    naming the file and line. Labels are not used. Measure: the fraction of
    preferences satisfied (f_j > f_i; equal scores count 1/2).
    """

    name = "preference"
    task = "ranking"
    params = {"pairs": ""}

    def check_params(self):
        self._require("pairs", bool(self.pairs), "a file of preference pairs ('i j [cost]' per line)")
        self._pairs = None

    def pair_arrays(self, m):
        """Return ``(i, j, cost)`` of the pairs file, checked against m examples."""
        if self._pairs is None:
            self._pairs = read_pairs(self.pairs)
        lower, upper, cost, line = self._pairs
        bad = (lower >= m) | (upper >= m)
        if bad.any():
            k = int(np.argmax(bad))
            index = int(lower[k]) if lower[k] >= m else int(upper[k])
            raise InputError(f"{self.pairs}: line {int(line[k])}: example index {index} is out of "
                             f"range: the data has {m} examples (0-based indices 0..{m - 1})")
        return lower, upper, cost

    def coefficients(self, f, y, qid=None):
        m = f.size
        lower, upper, cost = self.pair_arrays(m)
        margin = 1.0 + f[lower] - f[upper]
        weight = cost * (margin > 0)
        scale = m / lower.size
        risk = float(weight @ margin) * scale
        c = (np.bincount(lower, weight, minlength=m) - np.bincount(upper, weight, minlength=m)) * scale
        return risk, c

    def metrics(self, f, y, qid=None):
        f = np.asarray(f, dtype=np.float64).ravel()
        lower, upper, _ = self.pair_arrays(f.size)
        satisfied = (f[upper] > f[lower]) + 0.5 * (f[upper] == f[lower])
        return {"preferences_satisfied": float(np.mean(satisfied))}


# --------------------------------------------------------------------------
# Contingency-table scores: F-beta (Alg. 11) and PRBEP (paper 004)
# --------------------------------------------------------------------------

def _sorted_class_scores(f, positive):
    """Positives ascending and negatives descending by score (stable), as index arrays."""
    pos = np.flatnonzero(positive)
    neg = np.flatnonzero(~positive)
    pos = pos[np.argsort(f[pos], kind="stable")]
    neg = neg[np.argsort(-f[neg], kind="stable")]
    return pos, neg


def _labeling(y, pos, neg, false_negatives, false_positives):
    """``y' - y`` of the labeling flipping the lowest positives and the highest negatives."""
    c = np.zeros(y.size)
    c[pos[:false_negatives]] = -2.0
    c[neg[:false_positives]] = 2.0
    return c


def shared_break_even(f, y, comm):
    """:func:`precision_recall_break_even` of the examples of all ranks, each rank passing its own (collective).

    One sample sort of the scores over the ranks (:class:`ScoreOrder`, highest
    first) gives the m+-th highest score; then counts above it and at it.
    """
    f = np.ascontiguousarray(f, dtype=np.float64).ravel()
    positive = np.asarray(y).ravel() > 0
    counts = _rank_counts(comm, [f.size, np.count_nonzero(positive)])
    m_pos = int(counts[:, 1].sum())
    if m_pos == 0:
        return float("nan")
    highest = ScoreOrder(comm, -f, np.zeros(f.size, dtype=np.int64), counts=counts[:, 0])
    threshold = -_owned_at(comm, (highest,), [highest.owned_keys], np.array([m_pos - 1]))[0, 0]
    above, tied = f > threshold, f == threshold
    above, above_pos, tied, tied_pos = (int(v) for v in _rank_counts(comm, [
        np.count_nonzero(above), np.count_nonzero(above & positive), np.count_nonzero(tied),
        np.count_nonzero(tied & positive)]).sum(axis=0))
    # The formula of precision_recall_break_even, on the same integers.
    return float((above_pos + (m_pos - above) * (tied_pos / tied)) / m_pos)


class FBeta(MultivariateLoss):
    """F-beta structured risk (Joachims 2005; paper 000, Alg. 11, normalized as paper 004 eq. 2).

    ``R = max_{y'} [Delta(y', y) + (1/m) sum_i (y'_i - y_i) f_i]`` with
    ``Delta = 1 - F_beta = 1 - (1 + beta^2) TP / (TP + FP + beta^2 m+)``. For a
    table (TP, FP) the best y' flips the m+ - TP lowest-scored positives and the
    FP highest-scored negatives; for each TP the value is concave in FP (both
    Delta and the sum of the FP largest negative scores are), so the best FP
    is found by a vectorised bisection: O(m log m) instead of the paper's
    O(m^2). ``dR/df = (y' - y) / m``. Labels +-1; ``beta`` > 0 (default 1).
    Predicts ``sign(f)``. Measures: F-beta of sign(f) and the PRBEP.
    """

    name = "fbeta"
    task = "classification"
    params = {"beta": 1.0}

    def check_params(self):
        self._require("beta", math.isfinite(self.beta) and self.beta > 0, "a finite number > 0")

    def check_labels(self, classes, label_kind):
        return _check_plus_minus(self.name, classes, label_kind)

    def delta(self, true_positives, false_positives, m_pos):
        """``1 - F_beta`` of a table with the given TP and FP counts and m+ positives."""
        b2 = self.beta ** 2
        return 1.0 - (1.0 + b2) * true_positives / (true_positives + false_positives + b2 * m_pos)

    def coefficients(self, f, y, qid=None):
        m = y.size
        positive, m_pos, m_neg = _plus_minus_counts(self.name, y)
        pos, neg = _sorted_class_scores(f, positive)
        # low_pos[k]: sum of the k lowest positive scores; high_neg[k]: of the k highest negative ones.
        low_pos = np.concatenate([[0.0], np.cumsum(f[pos])])
        high_neg = np.concatenate([[0.0], np.cumsum(f[neg])])
        true_pos = np.arange(m_pos + 1, dtype=np.float64)

        def value(tp, fp):
            return self.delta(tp, fp, m_pos) + (2.0 / m) * high_neg[fp]

        # For each TP, bisect for the first FP whose increment is <= 0 (increments decrease).
        lo = np.zeros(m_pos + 1, dtype=np.int64)
        hi = np.full(m_pos + 1, m_neg, dtype=np.int64)
        while np.any(lo < hi):
            open_ = lo < hi
            mid = (lo + hi) // 2
            rising = open_ & (value(true_pos, np.minimum(mid + 1, m_neg)) > value(true_pos, mid))
            lo, hi = np.where(rising, mid + 1, lo), np.where(open_ & ~rising, mid, hi)
        best_fp = lo
        total = value(true_pos, best_fp) - (2.0 / m) * low_pos[m_pos - true_pos.astype(np.int64)]
        tp = int(np.argmax(total))
        risk = float(total[tp])
        c = _labeling(y, pos, neg, m_pos - tp, int(best_fp[tp]))
        return risk * m, c

    def metrics(self, f, y, qid=None):
        from sklearn.metrics import fbeta_score

        f = np.asarray(f, dtype=np.float64).ravel()
        y = np.asarray(y).ravel()
        score = fbeta_score(y > 0, f >= 0, beta=self.beta, zero_division=0.0)
        return {"f_beta": float(score), "prbep": precision_recall_break_even(f, y)}

    def shared_metrics(self, f, y, qid, comm):
        """:meth:`metrics` over all ranks: F-beta from the summed counts of the table, the PRBEP by
        :func:`shared_break_even`; no rank gathers the scores."""
        f = np.asarray(f, dtype=np.float64).ravel()
        positive, predicted = np.asarray(y).ravel() > 0, f >= 0
        tp, fp, fn = (int(v) for v in _rank_counts(comm, [np.count_nonzero(predicted & positive),
                                                           np.count_nonzero(predicted & ~positive),
                                                           np.count_nonzero(~predicted & positive)]).sum(axis=0))
        b2 = self.beta ** 2
        score = (1 + b2) * tp / ((1 + b2) * tp + b2 * fn + fp) if tp else 0.0
        return {"f_beta": float(score), "prbep": shared_break_even(f, y, comm)}


def prbep_totals(lowest_positive, highest_negative, m_pos, m):
    """The PRBEP objective of the tables with k = 0, 1, ... flips in each class.

    ``total[k] = k/m+ + (2/m) (sum of the k highest negative - sum of the k lowest positive scores)``,
    given the lowest positive scores ascending and the highest negative ones
    descending (as many of each); the risk is the largest total.
    """
    flips = np.arange(len(lowest_positive) + 1)
    low_pos = np.concatenate([[0.0], np.cumsum(lowest_positive)])
    high_neg = np.concatenate([[0.0], np.cumsum(highest_negative)])
    return flips / m_pos + (2.0 / m) * (high_neg - low_pos)


class Prbep(MultivariateLoss):
    """Precision/recall break-even risk in the contingency-table form (paper 004, eq. 2).

    ``R = max_{y'} [Delta(y', y) + (1/m) sum_i (y'_i - y_i) f_i]`` with
    ``Delta = b / m+`` if b = c and -inf otherwise (b false negatives, c false
    positives; Joachims 2005). The tables with b = c = k flip the k
    lowest-scored positives and the k highest-scored negatives, so
    ``R = max_k [k/m+ + (2/m)(sum of k highest negative - sum of k lowest positive scores)]``.
    The increments in k fall, so the best k is the number of k at which the
    k-th highest negative and k-th lowest positive score still raise the
    total: two sample sorts over the ranks (:class:`ScoreOrder`, the
    positives ascending and the negatives descending, ties in example
    order), then a search of that k by gathers of :data:`PROBES` positions
    (two for a million examples); each rank gets back the flips of its
    examples and sums ``m R = m k/m+ + sum_i c_i f_i`` over its blocks: the
    same bits on any number of ranks, and no rank handles all m scores.
    ``dR/df = (y' - y) / m``. Labels +-1; the risk ignores a constant offset
    of the scores. Measure: the PRBEP of the scores.
    """

    name = "prbep"
    task = "ranking"
    spread = True

    def check_labels(self, classes, label_kind):
        return _check_plus_minus(self.name, classes, label_kind)

    def local_coefficients(self, f, y, comm, bounds, qid=None, work=None):
        f = np.ascontiguousarray(f, dtype=np.float64).ravel()
        positive = np.asarray(y).ravel() > 0
        counts = _rank_counts(comm, [f.size, np.count_nonzero(positive)])
        m, m_pos = (int(v) for v in counts.sum(axis=0))
        _require_both_classes(self.name, m_pos, m - m_pos)
        pos, neg = np.flatnonzero(positive), np.flatnonzero(~positive)
        work = Workspace() if work is None else work
        # Positives by ascending and negatives by descending score, ties in example order: two sample sorts.
        lowest = ScoreOrder(comm, f[pos], np.zeros(pos.size, dtype=np.int64), counts=counts[:, 1],
                            work=work.nested("prbep lowest"))
        highest = ScoreOrder(comm, -f[neg], np.zeros(neg.size, dtype=np.int64), counts=counts[:, 0] - counts[:, 1],
                             work=work.nested("prbep highest"))
        owned = [lowest.owned_keys, -highest.owned_keys]

        def rising(positions):
            # total[k + 1] - total[k] > 0 (prbep_totals): the increments fall as k grows.
            low, high = _owned_at(comm, (lowest, highest), owned, positions)
            return (2.0 / m) * (high - low) + 1.0 / m_pos > 0

        flips = _leading(min(m_pos, m - m_pos), rising)
        c = np.zeros(f.size)
        for order, sign, rows in ((lowest, -2.0, pos), (highest, 2.0, neg)):
            flipped = order.owned_before + np.arange(order.order.size) < flips
            c[rows] = sign * order.back(flipped.astype(np.float64))
        # m R = m flips / m+ + sum_i c_i f_i, per block.
        risks = _block_risks(c, f, bounds, 1.0) + np.diff(bounds) * (flips / m_pos)
        return risks, c

    def metrics(self, f, y, qid=None):
        return {"prbep": precision_recall_break_even(f, y)}

    def shared_metrics(self, f, y, qid, comm):
        """:meth:`metrics` over all ranks (:func:`shared_break_even`): no rank gathers the scores."""
        return {"prbep": shared_break_even(f, y, comm)}


# --------------------------------------------------------------------------
# Ranking: NDCG@k by linear assignment (Alg. 10), per query
# --------------------------------------------------------------------------

class Ndcg(Loss):
    """Structured NDCG@k ranking loss of Le and Smola (2007), Algorithm 10, per query.

    For a query with relevances r (integers >= 0), gains ``g = (2^r - 1) /
    IDCG@k`` and discounts ``a_p = 1/log2(p + 2)`` for positions p < k (0
    beyond), a ranking pi (pi(p) = the document at position p) has
    ``NDCG@k(pi) = sum_p a_p g_pi(p)``. With the decreasing weights
    ``c_p = max(k + 1 - p, 0)`` (those of BMRM 2.1), ::

        l_q = max_pi [1 - NDCG@k(pi) + sum_p c_p f_pi(p)] - sum_j c_bar_j f_j

    where ``c_bar_j`` is the mean of c over the positions that j's relevance
    group occupies in the ideal ranking (the average of ``sum_p c_p f_pi(p)``
    over every ranking sorted by relevance, so the loss does not depend on how
    tied documents are listed; it is >= 0). The maximum is a linear assignment
    of the top k + 1 positions to documents, solved by
    ``scipy.optimize.linear_sum_assignment``; ``dl/df_j = c_(position of j) -
    c_bar_j``. Queries without a relevant document (NDCG undefined) add 0.
    ``R = (1/m) sum_q l_q`` over the m documents. Needs query ids;
    ``k`` >= 1 (default 10). Measures: mean NDCG@k and MAP over the queries
    with a relevant document.
    """

    name = "ndcg"
    task = "ranking"
    params = {"k": 10}
    needs_qid = True

    def check_params(self):
        self._require("k", self.k >= 1, "an integer >= 1")

    def check_labels(self, classes, label_kind):
        if (label_kind not in ("binary", "integer") or classes is None or len(classes) == 0
                or classes[0] < 0):
            shown = ("real values" if label_kind == "real" else "multilabel data"
                     if label_kind == "multilabel" else _format_labels(classes))
            return f"loss {self.name!r} needs integer relevance labels >= 0, the data has {shown}"
        return None

    def query_loss(self, f, r):
        """Return ``(l_q, dl_q/df)`` of one query with scores f and relevances r."""
        return self._losses(np.asarray(f, dtype=np.float64), np.asarray(r, dtype=np.float64),
                            np.zeros(len(f), dtype=np.int64))

    def _losses(self, f, y, qid):
        """Sum of the query losses of one block and their derivatives with respect to f."""
        k = self.k
        # Sorted by query, then by decreasing relevance (ties in listing order): each
        # query's ideal ranking, and the position p of every document in it.
        order = np.lexsort((-y, qid))
        q, r = qid[order], y[order]
        new_query = np.r_[True, q[1:] != q[:-1]]
        starts = np.flatnonzero(new_query)
        ends = np.r_[starts[1:], q.size]
        query_start = np.repeat(starts, ends - starts)
        p = np.arange(q.size) - query_start
        discount = np.where(p < k, 1.0 / np.log2(np.minimum(p, k) + 2.0), 0.0)
        gain = np.exp2(r) - 1.0
        ideal_dcg = np.add.reduceat(gain * discount, starts)
        c = np.maximum(k + 1.0 - p, 0.0)
        # c averaged over the positions of each run of equal relevance within a query.
        run_start = np.flatnonzero(new_query | np.r_[True, r[1:] != r[:-1]])
        run_size = np.diff(np.r_[run_start, q.size])
        c_bar = np.repeat(np.add.reduceat(c, run_start) / run_size, run_size)
        from scipy.optimize import linear_sum_assignment

        total = 0.0
        coefficient = np.zeros(f.size)
        for start, end, best in zip(starts, ends, ideal_dcg):
            if best <= 0 or end - start < 2:
                continue  # no relevant document (NDCG undefined), or nothing to order
            rows = min(end - start, k + 1)   # positions beyond k have c = a = 0
            documents = order[start:end]
            fq = f[documents]
            cq, aq = c[start:start + rows], discount[start:start + rows]
            profit = cq[:, None] * fq - aq[:, None] * (gain[start:end] / best)
            position, column = linear_sum_assignment(profit, maximize=True)
            total += 1.0 + float(profit[position, column].sum()) - float(c_bar[start:end] @ fq)
            # gain[start:end] is in ideal order, as are the columns: column j is documents[j].
            coefficient[documents] = -c_bar[start:end]
            coefficient[documents[column]] += cq[position]
        return total, coefficient

    def loss_gradient(self, w, X, y, qid=None):
        if qid is None:
            raise InputError(f"loss {self.name!r} needs query ids (qid: in the input files)")
        f = np.asarray(X @ w, dtype=np.float64).ravel()
        total, coefficient = self._losses(f, np.asarray(y, dtype=np.float64), np.asarray(qid))
        return total, np.asarray(X.T @ coefficient, dtype=np.float64)

    def metrics(self, f, y, qid=None):
        from sklearn.metrics import average_precision_score, ndcg_score

        if qid is None:
            raise InputError(f"loss {self.name!r}: NDCG and MAP are per-query measures; the data has "
                             "no query ids (qid:)")
        f = np.asarray(f, dtype=np.float64).ravel()
        y = np.asarray(y, dtype=np.float64).ravel()
        ndcgs, precisions = [], []
        for rows in query_rows(np.asarray(qid)):
            r, s = y[rows], f[rows]
            if not np.any(r > 0):
                continue
            gain = np.exp2(r) - 1.0
            ndcgs.append(1.0 if rows.size == 1 else float(ndcg_score([gain], [s], k=self.k)))
            precisions.append(float(average_precision_score(r > 0, s)))
        nan = float("nan")
        return {f"ndcg@{self.k}": float(np.mean(ndcgs)) if ndcgs else nan,
                "map": float(np.mean(precisions)) if precisions else nan}


def query_rows(qid):
    """Row indices of each query (in order of first appearance of the query id)."""
    qid = np.asarray(qid).ravel()
    if qid.size == 0:
        return []
    order = np.argsort(qid, kind="stable")
    bounds = np.flatnonzero(np.diff(qid[order])) + 1
    groups = np.split(order, bounds)
    groups.sort(key=lambda rows: rows[0])
    return groups


MULTIVARIATE_LOSSES = (RocArea, Ordinal, Preference, FBeta, Prbep, Ndcg)
