"""Arrays in and out of the shard format: finiteness checks, label kinds and mappings, balanced blocks of rows.

The checks and conversions that the readers (:mod:`prbmrm.io.readers`), the shard
writer (:mod:`prbmrm.io.shards`) and the loader (:mod:`prbmrm.io.loader`) share.
Every problem is an :class:`prbmrm.errors.InputError` naming the file or array.

Imports: numpy, scipy and :mod:`prbmrm.errors` only.
"""

import itertools

import numpy as np
import scipy.sparse as sp

from ..errors import InputError

LABEL_KINDS = ("binary", "integer", "real", "multilabel", "multioutput")
STRUCTURED = "structured"
"""The label kind of ragged examples (:mod:`prbmrm.structured.data`), kept apart from :data:`LABEL_KINDS`:
their labels are not an array of rows."""

_INDEX_LIMIT = 2**31  # int32 indices and indptr below this

# ---- Checks and conversions shared by the readers and writers ----------

def check_finite(A, where, what="feature value", indptr=None, row_offset=0, line_of_row=None):
    """Raise naming the first row of `A` with a non-finite value.

    `A` is a matrix (sparse or 2-D), one value per row (1-D), or with `indptr`
    the flat values of rows ``indptr[i]:indptr[i + 1]``.
    """
    if sp.issparse(A):
        A, indptr = A.data, A.indptr
    ok = np.isfinite(A)
    if ok.all():
        return
    row = int(np.argmin(ok.all(axis=1) if ok.ndim == 2 else ok))
    if indptr is not None:
        row = int(np.searchsorted(indptr, row, side="right")) - 1
    row += row_offset
    line = line_of_row(row) if line_of_row else None
    at = f"row {row + 1}" + (f" (line {line})" if line is not None else "")
    raise InputError(f"{where}: {at} has a non-finite {what}")


def _is_indicator(Y):
    return bool(np.isin(Y, (0, 1)).all())


def _check_indicator(Y, where):
    if Y.size and not _is_indicator(Y):
        raise InputError(f"{where}: a multilabel indicator must hold only 0 and 1")


def _as_array(a, ndim, where, what):
    """`a` as a C-contiguous float64 array of `ndim` dimensions."""
    try:
        a = np.ascontiguousarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {what} are not numeric") from None
    if a.ndim != ndim:
        raise InputError(f"{where}: {what} must be a {ndim}-D array, got shape {a.shape}")
    return a


def _label_sets(y, where, line_of_row=None):
    """Multilabel labels as (list of tuples, all their label ids flat), checked finite."""
    try:
        sets = [tuple(s) for s in y]
        flat = np.fromiter(itertools.chain.from_iterable(sets), dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: multilabel labels must be sequences of numeric "
                         "label ids") from None
    indptr = np.r_[0, np.cumsum([len(s) for s in sets], dtype=np.int64)]
    check_finite(flat, where, "label", indptr, line_of_row=line_of_row)
    return sets, flat


def _as_matrix(X, where):
    """X as float64 CSR (canonical) or a C-contiguous 2-D float64 array."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
        return X
    return _as_array(X, 2, where, "features")


def _as_qid(qid, n, where):
    if qid is None:
        return None
    q = np.asarray(qid)
    if q.shape != (n,):
        raise InputError(f"{where}: qid has shape {q.shape}, expected ({n},)")
    if not np.issubdtype(q.dtype, np.integer):
        try:
            q = q.astype(np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{where}: query ids are not numeric") from None
        if not (np.isfinite(q).all() and np.all(q == np.round(q))):
            raise InputError(f"{where}: query ids must be integers")
    return q.astype(np.int64)


def _with_bias(X, bias):
    """X with a constant-1 column appended if `bias`; sparse X with int32 indices if they fit."""
    if not sp.issparse(X):
        return np.hstack([X, np.ones((X.shape[0], 1))]) if bias else np.ascontiguousarray(X)
    if bias:  # a 1 at the end of every row (np.insert copies once; sp.hstack thrice)
        (n, d), at = X.shape, X.indptr[1:]
        X = sp.csr_matrix((np.insert(X.data, at, 1.0), np.insert(X.indices, at, d),
                           X.indptr + np.arange(n + 1)), shape=(n, d + 1))
    # scipy picks index dtypes of its own; mixed int32/int64 index arrays make
    # its matvec several times slower, so set both.
    idx = np.int32 if max(X.nnz, X.shape[1]) < _INDEX_LIMIT else np.int64
    X.indices, X.indptr = X.indices.astype(idx, copy=False), X.indptr.astype(idx, copy=False)
    return X


def _fmt_num(v):
    v = float(v)
    return str(int(v)) if v == round(v) and abs(v) < 1e15 else repr(v)


def _fmt_values(values, limit=10):
    values = list(values)
    shown = ", ".join(_fmt_num(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} values)" if len(values) > limit else "")


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


# ---- Labels -------------------------------------------------------------

def infer_label_kind(y, multilabel=False):
    """Classify labels and find their distinct values.

    Parameters
    ----------
    y : array_like
        Labels of *all* examples: a 1-D numeric array; for multilabel data
        a sequence of label sets (tuples of label ids, as from
        ``sklearn.datasets.load_svmlight_file(..., multilabel=True)``) or a
        2-D 0/1 indicator array; for multioutput data a 2-D array of targets.
    multilabel : bool, default False
        Treat `y` as multilabel. A 2-D array is multilabel if it holds only
        0 and 1, multioutput otherwise.

    Returns
    -------
    label_kind : str
        ``"multilabel"``; ``"multioutput"``; ``"real"`` if some value is not an integer;
        ``"binary"`` for exactly two distinct integer values; ``"integer"``
        otherwise (including a single value).
    classes : numpy.ndarray or None
        Sorted distinct values as float64 (label ids for multilabel data,
        ``0..k-1`` for a 2-D array); None for ``"real"``.

    Raises
    ------
    InputError
        If the labels are not numeric or not finite.
    """
    if isinstance(y, np.ndarray) and y.ndim == 2:
        kind = "multilabel" if multilabel or _is_indicator(y) else "multioutput"
        return _prepare_labels(y, y.shape[0], "labels", label_kind=kind)[1:]
    if multilabel:
        return "multilabel", np.unique(_label_sets(y, "labels")[1])
    y = _as_array(y, 1, "labels", "labels")
    check_finite(y, "labels", "label")
    values = np.unique(y)
    if np.any(values != np.round(values)):
        return "real", None
    return ("binary" if values.size == 2 else "integer"), values


def negative_label(classes, positive):
    """The one label other than `positive` among two raw `classes`, else None (a one-vs-rest mapping)."""
    others = [] if positive is None or classes is None else np.setdiff1d(classes, [positive])
    return float(others[0]) if len(others) == 1 and len(classes) == 2 else None


def _raw_negative(y, positive):
    """:func:`negative_label` of 1-D raw labels `y` (None for label sets and 2-D labels)."""
    if positive is None or not isinstance(y, np.ndarray) or y.ndim != 1:
        return None
    return negative_label(np.unique(y), positive)


def _prepare_labels(y, n, where, *, multilabel=False, multioutput=False, positive=None,
                    label_kind=None, classes=None):
    """Return (y as stored, label_kind, classes).

    A 2-D `y` is multilabel (an indicator) if it holds only 0 and 1 and
    multioutput (real targets) otherwise, unless `multilabel`, `multioutput`
    or `label_kind` says which.
    """
    is_2d = isinstance(y, np.ndarray) and y.ndim == 2
    if multioutput or label_kind == "multioutput" or (
            is_2d and not multilabel and label_kind is None and not _is_indicator(y)):
        if positive is not None:
            raise InputError(f"{where}: positive= (one-vs-rest) does not apply to multioutput data")
        Y = _as_array(y, 2, where, "targets")
        if Y.shape[0] != n:
            raise InputError(f"{where}: {Y.shape[0]} rows of targets for {n} rows")
        check_finite(Y, where, "target")
        classes = np.asarray(np.arange(Y.shape[1]) if classes is None else classes, np.float64)
        if classes.shape != (Y.shape[1],):
            raise InputError(f"{where}: {classes.size} target ids for {Y.shape[1]} target columns")
        return Y, "multioutput", classes
    if multilabel or is_2d or label_kind == "multilabel":
        if positive is not None:
            raise InputError(f"{where}: positive= (one-vs-rest) does not apply to multilabel data")
        if is_2d:
            _check_indicator(y, where)
            Y = y.astype(np.int8)
        elif len(y) != n:
            raise InputError(f"{where}: {len(y)} label sets for {n} rows")
        else:
            from sklearn.preprocessing import MultiLabelBinarizer

            sets, flat = _label_sets(y, where)
            classes = np.unique(flat) if classes is None else classes
            Y = MultiLabelBinarizer(classes=classes).fit_transform(sets).astype(np.int8)
        classes = np.asarray(np.arange(Y.shape[1]) if classes is None else classes, np.float64)
        if Y.shape != (n, classes.size):
            raise InputError(f"{where}: multilabel indicator has shape {Y.shape}, "
                             f"expected ({n}, {classes.size})")
        return Y, "multilabel", classes
    y = _as_array(y, 1, where, "labels")
    if y.shape[0] != n:
        raise InputError(f"{where}: {y.shape[0]} labels for {n} rows")
    check_finite(y, where, "label")
    if positive is not None:
        hit = y == float(positive)
        if not hit.any():
            raise InputError(f"{where}: the positive label {_fmt_num(positive)} does not "
                             f"occur in the data (labels: {_fmt_values(np.unique(y))})")
        return np.where(hit, 1.0, -1.0), "binary", np.array([-1.0, 1.0])
    if label_kind is None:
        label_kind = infer_label_kind(y)[0]
    elif label_kind not in LABEL_KINDS:
        raise InputError(f"{where}: unknown label kind {label_kind!r} "
                         f"(one of {', '.join(LABEL_KINDS)})")
    if label_kind == "real":
        return y, label_kind, None
    return y, label_kind, np.asarray(np.unique(y) if classes is None else classes, np.float64)


# ---- Balanced contiguous blocks of rows ---------------------------------

def _row_costs(X, dense_out):
    """Cost of each row: its stored values + 1 (a dense row stores all d values)."""
    n, d = X.shape
    if dense_out:
        return np.full(n, d + 1, dtype=np.int64)
    nnz = np.diff(X.indptr) if sp.issparse(X) else np.count_nonzero(X, axis=1)
    return nnz.astype(np.int64) + 1


def _query_starts(qid, where):
    """Row indices where a run of equal qid starts; error if a qid has two runs."""
    starts = np.flatnonzero(np.r_[True, qid[1:] != qid[:-1]])
    run_ids = qid[starts]
    order = np.argsort(run_ids, kind="stable")
    dup = np.flatnonzero(run_ids[order][1:] == run_ids[order][:-1])
    if dup.size:
        a, b = order[dup[0]], order[dup[0] + 1]
        ends = np.r_[starts[1:], qid.size]
        raise InputError(
            f"{where}: qid {int(run_ids[a])} appears in two separate runs of rows "
            f"(rows {starts[a] + 1}-{ends[a]} and {starts[b] + 1}-{ends[b]}); "
            "the rows of a query must be contiguous")
    return starts


def row_bounds(costs, qid, parts, where, what="parts", unit=("row", "rows")):
    """Boundaries (parts + 1 row indices) of `parts` contiguous, balanced blocks.

    Each block is a run of whole units (rows, or queries when `qid` is given;
    `unit` names a row in messages, singular and plural); boundary k sits
    where the cumulative cost is closest to k/parts of the total.
    """
    n = costs.shape[0]
    starts = np.arange(n) if qid is None else _query_starts(qid, where)
    n_units = starts.size
    if parts < 1:
        raise InputError(f"{where}: the number of parts must be at least 1, got {parts}")
    if parts > n_units:
        one, many = ("query", "queries") if qid is not None else unit
        raise InputError(f"{where}: cannot split {n_units} {many} into {parts} {what}: "
                         f"each needs at least one {one}")
    cum = np.r_[0, np.cumsum(np.add.reduceat(costs, starts))].astype(np.float64)
    cuts = [0]
    for k in range(1, parts):
        target = cum[-1] * k / parts
        j = int(np.searchsorted(cum, target))  # cum[j - 1] < target <= cum[j]
        if j > 0 and target - cum[j - 1] <= cum[j] - target:
            j -= 1
        cuts.append(min(max(j, cuts[-1] + 1), n_units - (parts - k)))
    cuts.append(n_units)
    return [int(r) for r in np.r_[starts, n][cuts]]


def _rows(X, a, b):
    """Rows a:b of X as a view (scipy's X[a:b] of a CSR matrix is a slower copy)."""
    if not sp.issparse(X):
        return X[a:b]
    lo, hi = X.indptr[a], X.indptr[b]
    return sp.csr_matrix((X.data[lo:hi], X.indices[lo:hi], X.indptr[a:b + 1] - lo),
                         shape=(b - a, X.shape[1]), copy=False)
