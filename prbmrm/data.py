"""Data: the HDF5 shard format, conversion from text and arrays, validation, loading.

This module knows nothing of solvers or MPI. The functions that run on every
rank (:func:`load_local`, :func:`split_local`) are handed a communicator
(:class:`prbmrm.comm.SerialComm` or :class:`prbmrm.comm.MPIComm`) and use only
its ``rank``, ``size``, ``check``, ``bcast_object`` and ``gather_counts``.
Every problem with the input is reported as an :class:`prbmrm.errors.InputError`
with one line naming the file and the problem; on several ranks it becomes the
same :class:`prbmrm.errors.CollectiveError` on every rank.

Shard file format (version 1)
-----------------------------
One HDF5 file per shard, named ``part-00000.h5``, ``part-00001.h5``, ...

Root attributes
    ``format`` = ``"prbmrm-shard"``, ``format_version`` = 1, ``n_features``,
    ``n_examples`` (rows in this shard), ``n_examples_total`` (rows over all
    shards), ``shard_index``, ``shard_count``, ``label_kind`` (one of
    ``"binary"``, ``"integer"``, ``"real"``, ``"multilabel"``, ``"multioutput"``;
    ``"structured"`` marks the ragged layout of :mod:`prbmrm.structured.data`),
    ``classes`` (float64, the sorted distinct label values over *all* shards,
    the label ids for multilabel data, the target ids 0..k-1 for multioutput
    data; absent for ``"real"``), ``source`` (the input
    file names) and, when the labels were mapped one-vs-rest, ``positive``.
``/X``
    Either a group in the anndata CSR convention (attributes
    ``encoding-type`` = ``"csr_matrix"``, ``encoding-version`` = ``"0.1.0"``,
    ``shape`` = (n, d); datasets ``data`` float64, ``indices`` int32 (int64
    when d >= 2**31), ``indptr`` int64) or a dense (n, d) float64 dataset;
    the values may be stored as float32 instead (``prbmrm.shard --float32``:
    half the bytes of ``data``), and are read into float64 all the same.
    All the shards of a set share one layout.
``/y``
    float64 (n,) labels; for multilabel data an int8 (n, k) 0/1 indicator
    whose columns follow ``classes``; for multioutput data (several real
    targets per example, e.g. multivariate regression) a float64 (n, k) array.
``/qid``
    int64 (n,) query ids, present when the input has them.

Datasets are stored contiguous and uncompressed: reading speed matters more
than size on disk.
"""

import bz2
import contextlib
import functools
import glob
import gzip
import io
import itertools
import lzma
import os
import re
import zipfile
from dataclasses import dataclass, field

import h5py
import numpy as np
import scipy.sparse as sp

from .errors import CollectiveError, InputError

__all__ = ["FORMAT", "FORMAT_VERSION", "LABEL_KINDS", "STRUCTURED", "LocalData", "infer_label_kind",
           "list_shards", "load_local", "read_input", "split_local", "write_shards"]

FORMAT = "prbmrm-shard"
FORMAT_VERSION = 1
LABEL_KINDS = ("binary", "integer", "real", "multilabel", "multioutput")
STRUCTURED = "structured"
"""The label kind of ragged examples (:mod:`prbmrm.structured.data`), kept apart from :data:`LABEL_KINDS`:
their labels are not an array of rows."""

_INDEX_LIMIT = 2**31  # int32 indices and indptr below this
# Canonical blocks of in-memory data (split_local): at most 64, at least 8, and otherwise one
# per 2**14 stored values, so that on small data (scikit-learn's digits: 1,797 x 64) the
# per-block call of the loss does not cost more than the block's arithmetic.
_SPLIT_BLOCKS, _SPLIT_MIN_BLOCKS, _SPLIT_BLOCK_COST = 64, 8, 2**14
_SHARD_BLOCKS = 16  # at least this many canonical blocks over a shard set (fewer files are cut)
_PARTIALS_BUDGET = 2**23  # floats of per-block partial sums a shard set's blocks may need (64 MiB)
_DENSE_READ = 2**20  # entries of the dense array filled per read of a CSR shard (a few MB at a time)

DENSE_DENSITY = 0.4
"""CSR data at least this dense (nonzeros / (rows x features) over the whole
set) is held in memory as a dense C-contiguous array, multiplied by BLAS:
a dense pass reads 8 bytes per entry at about twice the speed per byte of
scipy's CSR kernel, which reads 12 per nonzero (value and int32 index), so
dense is the faster above a density of about 1/3, and at 0.4 costs at most
1.7x the memory of CSR (at 2/3 and above, less). :func:`load_local` and
:func:`split_local` take ``dense=True`` or ``False`` to force either; the
shard files keep their layout (``python -m prbmrm.shard --dense`` writes
dense ones)."""
_SHARD_RE = re.compile(r"^part-(\d+)\.h5$")
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError)


@dataclass
class LocalData:
    """The rows of the data set held by one rank.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix, numpy.ndarray or prbmrm.structured.RaggedExamples
        Local features, float64: CSR with int32 ``indices`` and ``indptr``
        where the sizes allow (int64 otherwise), or a C-contiguous array
        (dense shards, and CSR ones of density at least :data:`DENSE_DENSITY`).
        With `bias` the last column is a constant 1. For structured data
        (label kind ``"structured"``) the ragged examples with their labels.
    y : numpy.ndarray or None
        float64 (n_local,) labels, float64 (n_local, k) targets for
        multioutput data, or for multilabel data an int8
        (n_local, k) 0/1 indicator whose columns follow `classes`; None
        for structured data.
    qid : numpy.ndarray or None
        int64 (n_local,) query ids, or None when the data has none.
    n_features : int
        Number of features, *without* the bias column.
    n_examples_total : int
        Number of rows over all ranks.
    label_kind : str
        One of :data:`LABEL_KINDS`.
    classes : numpy.ndarray or None
        Sorted distinct labels over all ranks (label ids for multilabel
        data); None for real labels.
    files : list of str
        The shard files this rank read (empty for in-memory data).
    bias : bool
        Whether a constant-1 column was appended to `X`.
    row_offset : int
        Global index of the first local row (ranks hold contiguous blocks
        in rank order).
    positive : float or None
        The label mapped to +1 (all others to -1) when the labels were
        mapped one-vs-rest (``--positive``), else None.
    negative : float or None
        With `positive`, the one other label when the raw labels were exactly two.
    exact_width : bool
        Whether `n_features` is the data's true width (dense or CSV input,
        or ``--n-features``) rather than the largest SVMlight feature index.
    blocks : list of int
        Local row boundaries ``[0, n_1, ..., n_local]`` of the canonical
        blocks of rows held here: one per shard file, or for
        :func:`split_local` blocks that do not depend on the number of
        ranks. Summing per block makes results independent of the rank count.
    """

    X: object
    y: np.ndarray
    qid: object
    n_features: int
    n_examples_total: int
    label_kind: str
    classes: object
    files: list = field(default_factory=list)
    bias: bool = False
    row_offset: int = 0
    blocks: list = None
    positive: object = None
    exact_width: bool = True
    negative: object = None

    def __post_init__(self):
        if self.blocks is None:
            self.blocks = [0, self.n_local]

    @property
    def n_local(self):
        """int: Number of rows held by this rank."""
        return int(self.X.shape[0])


# ---- Checks and conversions shared by the readers and writers ----------

def _check_finite(A, where, what="feature value", indptr=None, row_offset=0, line_of_row=None):
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
    _check_finite(flat, where, "label", indptr, line_of_row=line_of_row)
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
    _check_finite(y, "labels", "label")
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
        _check_finite(Y, where, "target")
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
    _check_finite(y, where, "label")
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


def _row_bounds(costs, qid, parts, where, what="parts", unit=("row", "rows")):
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


# ---- Reading input files ------------------------------------------------

def _compression(path):
    """The compression suffix of `path` (``""`` if none)."""
    return next((s for s in _OPENERS if path.lower().endswith(s)), "")


def _open_binary(path):
    return _OPENERS.get(_compression(path), open)(path, "rb")


def _content_lines(path):
    """Yield (line number, line) of the lines of `path` that are not blank or a comment."""
    with _open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            if line.split(b"#", 1)[0].strip():
                yield lineno, line


def read_input(path, *, multilabel=False, multioutput=False, n_features=None, label_column=0, info=None):
    """Read examples from SVMlight/LIBSVM text, ``.npz`` or ``.csv`` files.

    Parameters
    ----------
    path : str, os.PathLike or sequence of them
        Input file(s), concatenated in order with a common number of features
        (the largest). The format follows the name:

        - ``*.npz``: ``X`` (dense) or ``data``, ``indices``, ``indptr``,
          ``shape`` (the :func:`scipy.sparse.save_npz` layout, CSR or CSC),
          with ``y`` and optionally ``qid``; a 2-D ``y`` is a multilabel 0/1
          indicator (optional ``classes`` naming its columns) or, if it holds
          other values or `multioutput` is set, real targets.
        - ``*.csv`` (also ``.gz``, ``.bz2``, ``.xz``): numeric values, the
          label in column `label_column` (several columns: multioutput
          targets); a first line that is not numeric is a header.
        - anything else: SVMlight/LIBSVM text, possibly compressed, read with
          :func:`sklearn.datasets.load_svmlight_file`. Feature indices are
          one-based unless some file uses index 0.
    multilabel : bool, default False
        Labels are comma-separated label sets (SVMlight), or a 2-D indicator
        (``.npz``).
    multioutput : bool, default False
        A 2-D ``y`` in ``.npz`` input holds real targets even if they are all 0 or 1.
    n_features : int, optional
        Number of features; at least the largest feature index found.
    label_column : int, str or sequence of them, default 0
        Column of the label in CSV input (negative counts from the end, or
        the header's name of the column); several columns give an (n, k)
        array of targets.
    info : dict, optional
        Filled with ``notes`` (lines to show the user: a CSV's header and
        label column) and ``exact_width`` (False when the width is only the
        largest SVMlight feature index).

    Returns
    -------
    X : scipy.sparse.csr_matrix or numpy.ndarray
        float64 features: sparse if any input is (SVMlight always is).
    y : numpy.ndarray or list of tuple
        float64 labels (n,) or targets (n, k), or for multilabel data a list
        of label-id tuples.
    qid : numpy.ndarray or None
        int64 query ids if the input has them (then every row must have one).

    Raises
    ------
    InputError
        On a missing, empty, unreadable or malformed file, non-numeric labels,
        non-finite values, or inconsistent inputs (naming the file and, where
        known, the line or row).
    """
    paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
    if not paths:
        raise InputError("no input files given")
    if n_features is not None and (int(n_features) != n_features or n_features < 1):
        raise InputError(f"n_features must be a positive integer, got {n_features!r}")
    pieces = []
    for p in map(os.fspath, paths):
        if not os.path.exists(p):
            raise InputError(f"{p}: no such file")
        if os.path.isdir(p):
            raise InputError(f"{p}: is a directory, not an input file")
        if p.lower().endswith(".npz"):
            pieces.append(_read_npz(p, multilabel, multioutput))
        elif p.lower()[:len(p) - len(_compression(p))].endswith(".csv"):
            if multilabel:
                raise InputError(f"{p}: multilabel input must be SVMlight or .npz, not CSV")
            pieces.append(_read_csv(p, label_column))
        else:
            pieces.append(_read_svmlight(p, multilabel))
    if info is not None:
        info["notes"] = [piece["note"] for piece in pieces if piece.get("note")]
        info["exact_width"] = n_features is not None or not any(piece["svmlight"] for piece in pieces)
    return _combine(pieces, n_features)


def _read_svmlight(path, multilabel):
    from sklearn.datasets import load_svmlight_file

    try:
        with _open_binary(path) as f:
            X, y, qid = load_svmlight_file(f, dtype=np.float64, multilabel=multilabel,
                                           zero_based=True, query_id=True)
    except ValueError as exc:
        raise _svmlight_error(path, exc, multilabel) from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    line_of_row = functools.partial(_svmlight_line, path)  # error path only
    _check_finite(X, path, line_of_row=line_of_row)
    if multilabel:
        y = _label_sets(y, path, line_of_row)[0]
    else:
        _check_finite(y, path, "label", line_of_row=line_of_row)
    if qid.size and qid.size != n:
        raise InputError(f"{path}: {qid.size} of {n} rows have a query id (qid:); "
                         "either every row or none must have one")
    return dict(path=path, X=X, y=y, qid=qid.astype(np.int64) if qid.size else None,
                svmlight=True)


def _svmlight_line(path, row):
    """Line number of data row `row` (from 0) of an SVMlight file, or None."""
    try:
        return next(itertools.islice(_content_lines(path), row, None), (None,))[0]
    except _READ_ERRORS:
        return None


def _svmlight_error(path, exc, multilabel):
    """InputError for a parse failure, with the line number if it can be found."""
    found = _locate_svmlight_error(path, multilabel)
    if found is None:
        return InputError(f"{path}: malformed SVMlight input: {exc}")
    lineno, line, message = found
    tokens = line.split(b"#", 1)[0].split()
    label = tokens[0].decode("utf-8", "replace") if tokens else ""
    if label and not (multilabel and ":" in label):
        parts = label.split(",")
        numeric = all(_is_number(p) for p in parts)
        if numeric and len(parts) > 1 and not multilabel:
            return InputError(f"{path}: line {lineno}: label {label!r} is a label set; "
                              "read multilabel data with --multilabel (multilabel=True)")
        if not numeric:
            return InputError(f"{path}: line {lineno}: non-numeric label {label!r}")
    return InputError(f"{path}: malformed SVMlight input at line {lineno}: {message}")


def _locate_svmlight_error(path, multilabel, chunk=4096):
    """(line number, line, message) of the first line sklearn rejects, or None.

    Re-parses `path` in chunks of lines, then the failing chunk line by line.
    """
    from sklearn.datasets import load_svmlight_file

    def error(lines):
        try:
            load_svmlight_file(io.BytesIO(b"".join(lines)), multilabel=multilabel,
                               zero_based=True, query_id=True)
        except ValueError as exc:
            return str(exc)
        return None

    try:
        lines = _content_lines(path)
        while block := list(itertools.islice(lines, chunk)):
            if error([line for _, line in block]) is not None:
                failing = ((lineno, line, error([line])) for lineno, line in block)
                return next((hit for hit in failing if hit[2] is not None), None)
    except _READ_ERRORS:
        return None  # the file cannot be re-read: the caller keeps sklearn's message
    return None


def _read_csv(path, label_column):
    header = None
    try:
        with _open_binary(path) as f:
            lines = io.TextIOWrapper(f, encoding="utf-8")
            skip = 0  # lines before the data
            for first in lines:
                if first.split("#", 1)[0].strip():
                    break
                skip += 1
            else:
                raise InputError(f"{path}: empty file (no data rows)")
            if all(_is_number(v) for v in first.split("#", 1)[0].split(",")):
                lines = itertools.chain([first], lines)
            else:
                skip += 1  # the first line is a header
                header = [name.strip() for name in first.split("#", 1)[0].strip().split(",")]
            label_column = _label_columns(path, label_column, header)
            A = np.loadtxt(lines, delimiter=",", ndmin=2, dtype=np.float64, comments="#")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file: {exc}") from None
    except ValueError as exc:
        raise _csv_error(path, exc, skip, label_column) from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    n, ncol = A.shape
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    if ncol < 2:
        raise InputError(f"{path}: needs a label column and at least one feature column, "
                         f"found {ncol} column")
    columns = np.atleast_1d(label_column)
    for c in columns:
        if not -ncol <= c < ncol:
            raise InputError(f"{path}: label column {c} does not exist ({ncol} columns)")
    if len(set(columns % ncol)) != len(columns) or len(columns) >= ncol:
        raise InputError(f"{path}: label columns {list(columns)} must be distinct and leave "
                         f"at least one of the {ncol} columns for features")
    y = np.ascontiguousarray(A[:, label_column])
    X = np.delete(A, columns % ncol, axis=1)
    _check_finite(X, path)
    _check_finite(y, path, "label")
    names = "" if header is None or len(header) != ncol else f" ({', '.join(header[c] for c in columns)})"
    note = (f"{path}: {'header line ' + ','.join(header) if header else 'no header line'}; "
            f"label column {', '.join(str(c % ncol) for c in columns)}{names} of {ncol} (from 0); "
            f"{ncol - len(columns)} feature columns")
    return dict(path=path, X=X, y=y, qid=None, svmlight=False, note=note)


def _label_columns(path, label_column, header):
    """`label_column` with header names (quoted or not) replaced by their column numbers."""
    def number(column):
        if not isinstance(column, str):
            return column
        names = [name.strip('"\'') for name in header or ()]
        if column.strip('"\'') not in names:
            raise InputError(f"{path}: no column named {column!r} in the header "
                             f"({', '.join(header) if header else 'the file has no header line'})")
        return names.index(column.strip('"\''))

    return [number(c) for c in label_column] if isinstance(label_column, list) else number(label_column)


def _csv_error(path, exc, skip, label_column):
    """Find the first bad field of a CSV file for a one-line message."""
    width = None
    try:
        for lineno, line in _content_lines(path):
            fields = line.decode("utf-8", "replace").split("#", 1)[0].strip().split(",")
            if lineno <= skip:
                continue
            width = width or len(fields)
            if len(fields) != width:
                return InputError(f"{path}: line {lineno} has {len(fields)} columns, "
                                  f"expected {width}")
            bad = next((c for c, v in enumerate(fields) if not _is_number(v)), None)
            if bad is not None:
                what = ("non-numeric label" if bad in np.atleast_1d(label_column) % width
                        else f"non-numeric value in column {bad + 1}")
                return InputError(f"{path}: line {lineno}: {what} {fields[bad].strip()!r}")
    except _READ_ERRORS:
        pass  # the file cannot be re-read: fall back to the parser's own message
    return InputError(f"{path}: malformed CSV input: {exc}")


def _read_npz(path, multilabel, multioutput):
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError):
        raise InputError(f"{path}: not a readable .npz file (truncated or corrupt)") from None
    except ValueError as exc:
        raise InputError(f"{path}: .npz arrays must be plain numeric arrays "
                         f"(no Python objects): {exc}") from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if "y" not in arrays:
        raise InputError(f"{path}: no 'y' array (an .npz input holds 'X' or "
                         "'data'/'indices'/'indptr'/'shape', plus 'y' and optional 'qid')")
    if "X" in arrays:
        X = arrays["X"]
    elif {"data", "indices", "indptr", "shape"} <= arrays.keys():
        fmt = np.asarray(arrays.get("format", "csr")).astype(str).item()
        if fmt not in ("csr", "csc"):
            raise InputError(f"{path}: sparse format {fmt!r} is not supported (csr or csc)")
        try:
            X = (sp.csr_matrix if fmt == "csr" else sp.csc_matrix)(
                (arrays["data"], arrays["indices"], arrays["indptr"]),
                shape=tuple(int(s) for s in arrays["shape"]))
            X.check_format(full_check=True)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{path}: invalid sparse matrix: {exc}") from None
    else:
        raise InputError(f"{path}: no feature arrays: expected 'X' (dense) or "
                         "'data', 'indices', 'indptr', 'shape' (sparse)")
    X, y = _as_matrix(X, path), arrays["y"]
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    if y.ndim == 2 and (multioutput or not (multilabel or _is_indicator(y))):
        y = _as_array(y, 2, path, "targets")
        if y.shape[0] != n:
            raise InputError(f"{path}: 'y' has {y.shape[0]} rows but X has {n}")
        _check_finite(y, path, "target")
    elif y.ndim == 2 or multilabel:
        if y.ndim != 2:
            raise InputError(f"{path}: multilabel 'y' must be a 2-D 0/1 indicator array")
        if y.shape[0] != n:
            raise InputError(f"{path}: 'y' has {y.shape[0]} rows but X has {n}")
        _check_indicator(y, path)
        classes = np.asarray(arrays.get("classes", np.arange(y.shape[1])), dtype=np.float64)
        if classes.shape != (y.shape[1],):
            raise InputError(f"{path}: 'classes' has {classes.size} entries for "
                             f"{y.shape[1]} indicator columns")
        y = [tuple(classes[np.flatnonzero(row)]) for row in y]
    else:
        y = _as_array(y, 1, path, "labels")
        if y.shape[0] != n:
            raise InputError(f"{path}: 'y' has {y.shape[0]} labels but X has {n} rows")
        _check_finite(y, path, "label")
    _check_finite(X, path)
    qid = _as_qid(arrays["qid"], n, path) if "qid" in arrays else None
    return dict(path=path, X=X, y=y, qid=qid, svmlight=False)


def _combine(pieces, n_features):
    with_q = [p for p in pieces if p["qid"] is not None]
    if with_q and len(with_q) != len(pieces):
        without = next(p for p in pieces if p["qid"] is None)
        raise InputError(f"{without['path']}: has no query ids (qid:) but "
                         f"{with_q[0]['path']} has; give all inputs query ids or none")
    # sklearn's zero_based="auto" over all SVMlight files together: one-based
    # unless some file uses feature index 0; such a file is as wide as its
    # largest index.
    svm = [p["X"] for p in pieces if p["svmlight"]]
    shift = 0 if any(X.nnz and X.indices.min() == 0 for X in svm) else 1
    widths = [(int(p["X"].indices.max()) + 1 - shift if p["X"].nnz else 0) if p["svmlight"]
              else p["X"].shape[1] for p in pieces]
    d = max(widths)
    if n_features is not None:
        if n_features < d:
            raise InputError(f"{pieces[int(np.argmax(widths))]['path']}: has {d} features, "
                             f"more than n_features={n_features}")
        d = int(n_features)
    if d == 0:
        raise InputError(f"{pieces[0]['path']}: no feature values at all")
    blocks = []
    for p in pieces:  # all d columns wide
        X = p["X"]
        if sp.issparse(X):
            indices = X.indices - 1 if p["svmlight"] and shift else X.indices
            X = sp.csr_matrix((X.data, indices, X.indptr), shape=(X.shape[0], d))
        blocks.append(np.pad(X, ((0, 0), (0, d - X.shape[1]))) if X.shape[1] < d else X)
    if len(blocks) == 1:
        X = blocks[0]
    else:
        X = (sp.vstack(blocks, format="csr") if any(sp.issparse(B) for B in blocks)
             else np.vstack(blocks))
    if any(isinstance(p["y"], list) for p in pieces):
        y = list(itertools.chain.from_iterable(p["y"] for p in pieces))
    elif len({p["y"].shape[1:] for p in pieces}) > 1:
        odd = next(p for p in pieces if p["y"].shape[1:] != pieces[0]["y"].shape[1:])
        raise InputError(f"{odd['path']}: labels of shape {odd['y'].shape[1:]} per row do not "
                         f"match {pieces[0]['path']}'s {pieces[0]['y'].shape[1:]}")
    else:
        y = np.concatenate([p["y"] for p in pieces])
    qid = np.concatenate([p["qid"] for p in pieces]) if with_q else None
    return X, y, qid


# ---- Writing shards -----------------------------------------------------

def _shard_name(i):
    return f"part-{i:05d}.h5"


def _shard_sort_key(path):
    m = _SHARD_RE.match(os.path.basename(path))
    return (os.path.dirname(path), int(m.group(1)) if m else float("inf"),
            os.path.basename(path))


def _existing_parts(out_dir):
    return sorted((p for p in glob.glob(os.path.join(glob.escape(out_dir), "part-*.h5"))
                   if os.path.isfile(p)), key=_shard_sort_key)


def write_shards(X, y, out_dir, parts, *, qid=None, source="", dense=None,
                 multilabel=False, multioutput=False, positive=None, overwrite=False, exact_width=True,
                 float32=False):
    """Split examples into `parts` HDF5 shard files of contiguous rows.

    The blocks are balanced by nonzeros + 1 per row (a dense row costs its
    width + 1) and never split a query.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n, d)
        Features.
    y : array_like
        Labels (n,); multilabel data as label-id tuples or a 2-D 0/1
        indicator; several real targets per row as a 2-D array.
    out_dir : str or os.PathLike
        Output directory, created if needed; receives ``part-00000.h5``, ...
    parts : int
        Number of shard files, at most the number of rows (queries, with `qid`).
    qid : array_like, optional
        Query ids (n,); the rows of each query must be contiguous.
    source : str, optional
        Input file names, stored in the ``source`` attribute and used in messages.
    dense : bool, optional
        Store ``/X`` dense (True) or sparse (False); by default as `X` is.
    multilabel : bool, default False
        `y` holds label sets (implied by a 2-D 0/1 `y`).
    multioutput : bool, default False
        A 2-D `y` holds real targets (implied unless it holds only 0 and 1).
    positive : float, optional
        One-vs-rest: this label becomes +1 and every other label -1.
    overwrite : bool, default False
        Replace existing ``part-*.h5`` files in `out_dir` (and remove those
        beyond the new count) instead of refusing.
    exact_width : bool, default True
        Whether d is the data's true width; False for the largest feature
        index of SVMlight input (stored as the ``exact_width`` attribute, so
        prediction accepts narrower SVMlight test sets only).
    float32 : bool, default False
        Store the feature values as float32 (rounded to 24 bits; computation
        stays float64): for data whose values need no more, e.g. counts or
        tf-idf weights, half the bytes on disk.

    Returns
    -------
    list of str
        Paths of the written shard files, in order.

    Raises
    ------
    InputError
        On inconsistent or non-finite input, a query split over two runs of
        rows, more parts than rows or queries, existing shard files without
        `overwrite`, or a failure to write (which leaves nothing behind).
    """
    where = source or "input arrays"
    X = _as_matrix(X, where)
    n, d = X.shape
    if n == 0:
        raise InputError(f"{where}: no rows to write")
    parts = _parts_count(parts, where)
    Y, label_kind, classes = _prepare_labels(y, n, where, multilabel=multilabel,
                                             multioutput=multioutput, positive=positive)
    qid = _as_qid(qid, n, where)
    _check_finite(X, where)
    if float32:
        values = X.data if sp.issparse(X) else X
        if np.abs(values).max(initial=0.0) > np.finfo(np.float32).max:
            raise InputError(f"{where}: a feature value is beyond the float32 range (+-3.4e38): "
                             "store it as float64 (without --float32)")
    dense_out = not sp.issparse(X) if dense is None else bool(dense)
    bounds = _row_bounds(_row_costs(X, dense_out), qid, parts, where)

    attrs = _shard_attrs(n, d, parts, label_kind, source)
    if classes is not None:
        attrs["classes"] = classes
    if positive is not None:
        attrs["positive"] = np.float64(positive)
        if _raw_negative(y, positive) is not None:
            attrs["negative"] = np.float64(_raw_negative(y, positive))
    attrs["exact_width"] = bool(exact_width)

    def write(i, path):
        a, b = bounds[i], bounds[i + 1]
        _write_one(path, _rows(X, a, b), dense_out, Y[a:b], None if qid is None else qid[a:b],
                   dict(attrs, n_examples=np.int64(b - a), shard_index=np.int64(i)),
                   np.float32 if float32 else np.float64)

    return _write_all(out_dir, parts, write, overwrite)


def _parts_count(parts, where):
    """`parts` as an int, or InputError if it is not an integer."""
    if isinstance(parts, bool) or int(parts) != parts:
        raise InputError(f"{where}: the number of parts must be an integer, got {parts!r}")
    return int(parts)


def _shard_attrs(n, d, parts, label_kind, source):
    """The root attributes every shard of a set shares."""
    return dict(format=FORMAT, format_version=np.int64(FORMAT_VERSION), n_features=np.int64(d),
                n_examples_total=np.int64(n), shard_count=np.int64(parts), label_kind=label_kind,
                source=str(source))


def _write_all(out_dir, parts, write, overwrite):
    """Write `out_dir`'s shard files 0..parts-1 by ``write(i, path)``, all or none; return their paths.

    Every shard goes to a temporary name first and all are renamed at the
    end, so a failure leaves nothing behind; shard files beyond the new
    count are removed after success.
    """
    out_dir = os.fspath(out_dir)
    try:
        created = not os.path.exists(out_dir)
        if created:
            os.makedirs(out_dir)
        elif not os.path.isdir(out_dir):
            raise InputError(f"{out_dir}: exists and is not a directory")
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create the output directory: "
                         f"{exc.strerror or exc}") from None
    existing = _existing_parts(out_dir)
    if existing and not overwrite:
        raise InputError(f"{out_dir}: already holds shard files "
                         f"({os.path.basename(existing[0])}, ...); pass --overwrite "
                         "(overwrite=True) to replace them")
    finals = [os.path.join(out_dir, _shard_name(i)) for i in range(parts)]
    temps = [os.path.join(out_dir, f".{_shard_name(i)}.tmp-{os.getpid()}") for i in range(parts)]
    try:
        for i, temp in enumerate(temps):
            write(i, temp)
        for tmp, final in zip(temps, finals):
            os.replace(tmp, final)
    except BaseException as exc:
        for p in temps + [f for f in finals if f not in existing]:
            with contextlib.suppress(OSError):
                os.remove(p)
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)
        if isinstance(exc, OSError):
            raise InputError(f"{out_dir}: cannot write shard files: {exc}") from None
        raise
    for stale in set(existing) - set(finals):
        os.remove(stale)
    return finals


def _write_one(path, X, dense_out, y, qid, attrs, values=np.float64):
    with h5py.File(path, "w") as f:
        f.attrs.update(attrs)
        if dense_out:
            f.create_dataset("X", data=X.toarray() if sp.issparse(X) else X, dtype=values)
        else:
            X = sp.csr_matrix(X)
            g = f.create_group("X")
            g.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0",
                            "shape": np.array(X.shape, dtype=np.int64)})
            g.create_dataset("data", data=X.data, dtype=values)
            g.create_dataset("indices", data=np.asarray(
                X.indices, np.int32 if X.shape[1] < _INDEX_LIMIT else np.int64))
            g.create_dataset("indptr", data=np.asarray(X.indptr, np.int64))
        f.create_dataset("y", data=y)
        if qid is not None:
            f.create_dataset("qid", data=qid)


def _shard_summary(path):
    """Rows, stored nonzeros, queries and layout of one shard file (for the CLI)."""
    with h5py.File(path, "r") as f:
        if _attr_str(f.attrs["label_kind"]) == STRUCTURED:
            return dict(rows=int(f.attrs["n_examples"]), nnz=int(f["x_values"].shape[0]), queries=None,
                        layout="ragged", n_features=int(f.attrs["n_features"]), label_kind=STRUCTURED,
                        n_classes=None)
        X = f["X"]
        if isinstance(X, h5py.Group):
            nnz, layout = int(X["data"].shape[0]), "sparse"
        else:
            nnz, layout = int(np.count_nonzero(X[()])), "dense"
        queries = None
        if "qid" in f:
            q = f["qid"][()]
            queries = int(np.count_nonzero(np.r_[True, q[1:] != q[:-1]])) if q.size else 0
        return dict(rows=int(f.attrs["n_examples"]), nnz=nnz, queries=queries, layout=layout,
                    n_features=int(f.attrs["n_features"]), label_kind=str(f.attrs["label_kind"]),
                    n_classes=int(f.attrs["classes"].size) if "classes" in f.attrs else None)


# ---- Finding and loading shards -----------------------------------------

def list_shards(spec):
    """List the shard files named by `spec`.

    Parameters
    ----------
    spec : str, os.PathLike or sequence of them
        A directory (its ``part-*.h5`` files, in shard order), a glob pattern
        (matches sorted by directory, then shard number), a single file, or a
        list of these (concatenated in the given order).

    Returns
    -------
    list of str

    Raises
    ------
    InputError
        If nothing is found ("DIR: no shard files (part-*.h5)").
    """
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise InputError("no shard files given")
        return [f for s in spec for f in list_shards(s)]
    s = os.fspath(spec)
    if os.path.isdir(s):
        files = _existing_parts(s)
        if not files:
            raise InputError(f"{s}: no shard files (part-*.h5)")
        return files
    if glob.has_magic(s):
        files = sorted((p for p in glob.glob(s) if os.path.isfile(p)), key=_shard_sort_key)
        if not files:
            raise InputError(f"{s}: no shard files match this pattern")
        return files
    if os.path.isfile(s):
        return [s]
    raise InputError(f"{s}: no such file or directory")


def _spec_label(spec, files):
    if isinstance(spec, (str, bytes, os.PathLike)):
        return os.fspath(spec)
    dirs = {os.path.dirname(f) for f in files}
    return dirs.pop() if len(dirs) == 1 else "shard list"


@contextlib.contextmanager
def _open_shard(path):
    """Open a shard for reading; a damaged file becomes a one-line InputError."""
    try:
        with h5py.File(path, "r") as f:
            yield f
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file (truncated or corrupt): "
                         f"{' '.join(str(exc).split())}") from None
    except KeyError as exc:  # h5py: a dataset or attribute of the format is missing
        raise InputError(f"{path}: not a prbmrm shard file: {exc.args[0]}") from None


def _attr_str(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _check_position(path, count, index, pos, files, label):
    """Raise unless the shard `path` (shard_count `count`, shard_index `index`) is number `pos` of `files`."""
    if count != len(files):
        raise _count_error(path, count, files, label)
    if index != pos:
        raise InputError(f"{path}: shard_index is {index} but the file is number {pos} "
                         f"(from 0) of the {len(files)} sorted shard files "
                         "(renamed or mixed shard files?)")


def _shard_meta(path, pos, files, label, positioned=True):
    """Open one shard, check its attributes and structure; return its metadata.

    Reads only attributes, shapes and ``indptr`` (n + 1 integers). With
    `positioned` False the caller checks its place among `files` later
    (:func:`_check_position`, with the metadata's ``count`` and ``index``).
    """
    with _open_shard(path) as f:
        a = f.attrs
        if _attr_str(a.get("format")) != FORMAT:
            got = repr(_attr_str(a["format"])) if "format" in a else "missing"
            raise InputError(f"{path}: not a prbmrm shard file (format attribute is {got})")
        version = int(a["format_version"]) if "format_version" in a else "missing"
        if version != FORMAT_VERSION:
            raise InputError(f"{path}: shard format version {version} is not supported "
                             f"(this prbmrm reads version {FORMAT_VERSION})")
        count, index = int(a["shard_count"]), int(a["shard_index"])
        if positioned:
            _check_position(path, count, index, pos, files, label)
        n, d, kind = int(a["n_examples"]), int(a["n_features"]), _attr_str(a["label_kind"])
        if kind not in LABEL_KINDS + (STRUCTURED,):
            raise InputError(f"{path}: unknown label_kind {kind!r}")
        meta = dict(path=path, n=n, d=d, kind=kind, classes=None, sparse=False,
                    n_total=int(a["n_examples_total"]), has_qid="qid" in f, nnz=0, labels="",
                    positive=float(a["positive"]) if "positive" in a else None,
                    exact=bool(a.get("exact_width", False)),
                    negative=float(a["negative"]) if "negative" in a else None, count=count, index=index)
        if kind == STRUCTURED:
            from .structured.data import shard_meta

            return shard_meta(f, meta)
        classes = None if kind == "real" else np.atleast_1d(a["classes"]).astype(np.float64)
        X, sparse = f["X"], isinstance(f["X"], h5py.Group)
        shape = tuple(int(s) for s in X.attrs.get("shape", ())) if sparse else X.shape
        if shape != (n, d):
            raise InputError(f"{path}: /X has shape {shape}, but the attributes say ({n}, {d})")
        meta.update(classes=classes, sparse=sparse)
        if sparse:
            enc = _attr_str(X.attrs.get("encoding-type"))
            if enc != "csr_matrix":
                raise InputError(f"{path}: /X has encoding-type {enc!r}, expected 'csr_matrix'")
            nnz, indptr = X["data"].shape[0], X["indptr"][()].astype(np.int64)
            if (X["data"].shape != (nnz,) or X["indices"].shape != (nnz,)
                    or indptr.shape != (n + 1,) or indptr[0] != 0 or indptr[-1] != nnz
                    or np.any(np.diff(indptr) < 0)):
                raise InputError(f"{path}: /X/data, /X/indices and /X/indptr do not make a "
                                 f"CSR matrix of {n} rows")
            meta.update(nnz=nnz, indptr=indptr)
        want = (n, classes.size) if kind in ("multilabel", "multioutput") else (n,)
        if f["y"].shape != want:
            raise InputError(f"{path}: /y has shape {f['y'].shape}, expected {want}")
        if meta["has_qid"] and f["qid"].shape != (n,):
            raise InputError(f"{path}: /qid has shape {f['qid'].shape}, expected ({n},)")
        return meta


def _count_error(path, count, files, label):
    S, names = len(files), {os.path.basename(f) for f in files}
    missing = [_shard_name(k) for k in range(count) if _shard_name(k) not in names]
    if count > S and missing:
        return InputError(f"{label}: missing shard {missing[0]} (shard_count is {count}, "
                          f"found {S} file{'s' if S != 1 else ''})")
    return InputError(f"{label}: {S} shard file{'s' if S != 1 else ''} but {path} has "
                      f"shard_count {count} (shard files of different conversions mixed?)")


# What every shard must share with shard 0: a key of its metadata, and how a value reads.
_AGREED = (
    ("d", "the number of features", str),
    ("kind", "the label kind", repr),
    ("classes", "the label classes", lambda c: f"[{_fmt_values(c)}]"),
    ("has_qid", "query ids", lambda q: "query ids" if q else "none"),
    ("sparse", "the layout of /X", lambda s: "sparse" if s else "dense"),
    ("labels", "the type and shape of the label parts", repr),
    ("positive", "the label mapping (--positive)", lambda p: "no mapping" if p is None else f"positive label {p:g}"),
)


def _check_agreement(files, metas):
    """Compare every shard with shard 0 (several conversions must agree on all of :data:`_AGREED`)."""
    first = metas[0]
    for key, what, show in _AGREED:
        for m in metas:
            if not np.array_equal(m[key], first[key]):
                hint = " (shard files of different conversions mixed?)" if key == "sparse" else ""
                raise InputError(f"shards disagree on {what}: {files[0]} has {show(first[key])}, "
                                 f"{m['path']} has {show(m[key])}{hint}")


def _conversions(files, label):
    """Per file: (position in its conversion, the conversion's files, its label).

    A conversion is the ``part-*.h5`` files of one directory (one run of
    :func:`write_shards`); a glob may name several.
    """
    groups = {}
    for path in files:
        groups.setdefault(os.path.dirname(path), []).append(path)
    return [(group.index(path), group, label if len(groups) == 1 else (os.path.dirname(path) or "."))
            for path in files for group in [groups[os.path.dirname(path)]]]


def _survey(files, label):
    """Check every shard's attributes and structure, per conversion and across; return their metadata
    (as :func:`_shard_meta`).

    Run by one rank: it opens every file (attributes, shapes and indptr only).
    """
    conversions = _conversions(files, label)
    metas = [_shard_meta(path, pos, group, where, positioned=False)
             for path, (pos, group, where) in zip(files, conversions)]
    _check_agreement(files, metas)  # before the positions: mixed files are told apart by what differs
    for m, (pos, group, where) in zip(metas, conversions):
        _check_position(m["path"], m["count"], m["index"], pos, group, where)
    for group in {tuple(group) for _, group, _ in conversions}:
        members = [m for m in metas if m["path"] in group]
        first, where = members[0], conversions[files.index(group[0])][2]
        odd = next((m for m in members if m["n_total"] != first["n_total"]), None)
        if odd is not None:
            raise InputError(f"shards disagree on n_examples_total: {first['path']} has {first['n_total']}, "
                             f"{odd['path']} has {odd['n_total']} (shard files of different conversions mixed?)")
        held = sum(m["n"] for m in members)
        if held != first["n_total"]:
            raise InputError(f"{where}: the {len(group)} shard files hold {held} rows but n_examples_total "
                             f"is {first['n_total']} (shard files missing or of different conversions mixed?)")
    return metas


def _canonical_blocks(metas, ranks):
    """The canonical blocks of a shard set: (file number, first row, end row), in order.

    Each file is cut into ceil(K / S) blocks of equal rows (at most one per
    row) with K = max(ranks, min(rows, 16, B)): the cut does not depend on the
    number of ranks up to min(16, B) (or up to S), so neither do the sums
    (bitwise), and any number of ranks up to the number of rows finds work.
    Every block holds a partial gradient of d + 1 floats per evaluation, so
    B = ``_PARTIALS_BUDGET`` / (d + 1) keeps them within 64 MiB on wide data
    (text-like sets of millions of features get a block per file and rank).
    Files with query ids or structured examples stay whole (a query or
    example is never split).
    """
    S, total = len(metas), sum(m["n"] for m in metas)
    whole = metas[0]["has_qid"] or metas[0]["kind"] == STRUCTURED
    wide = max(1, _PARTIALS_BUDGET // (metas[0]["d"] + 1))
    # 16, not split_local's 64: every block costs two small products per iteration.
    per_file = 1 if whole else -(-max(ranks, min(total, _SHARD_BLOCKS, wide)) // S)
    blocks = []
    for i, m in enumerate(metas):
        c = max(1, min(per_file, m["n"]))
        blocks += [(i, j * m["n"] // c, (j + 1) * m["n"] // c) for j in range(c)]
    return blocks


def _slice_meta(meta, lo, hi):
    """`meta` of a whole shard restricted to its rows lo..hi (what :func:`_read_local` reads)."""
    part = dict(meta, n=hi - lo, lo=lo)
    if meta["sparse"]:
        indptr = meta["indptr"][lo:hi + 1]
        part.update(indptr=indptr - indptr[0], nnz=int(indptr[-1] - indptr[0]), first_value=int(indptr[0]))
    return part


def _read_local(metas, bias, as_dense=False):
    """Read this rank's checked shards into one X, y, qid (preallocated: no
    concatenation copies) and validate the values.

    CSR shards are read into a dense X if `as_dense`. Structured shards give
    ragged examples (with their labels) as X, and y None.
    """
    if metas[0]["kind"] == STRUCTURED:
        from .structured.data import read_local

        if bias:
            raise InputError(f"{metas[0]['path']}: --bias (bias=True) does not apply to structured "
                             "examples: give the joint feature map a constant feature instead")
        return read_local(metas), None, None
    n, d = sum(m["n"] for m in metas), metas[0]["d"]
    kind, classes, sparse = metas[0]["kind"], metas[0]["classes"], metas[0]["sparse"]
    y = (np.empty((n, classes.size), dtype=np.int8) if kind == "multilabel"
         else np.empty((n, classes.size)) if kind == "multioutput" else np.empty(n))
    qid = np.empty(n, dtype=np.int64) if metas[0]["has_qid"] else None
    csr = sparse and not as_dense
    if csr:
        nnz = sum(m["nnz"] for m in metas)
        idx = np.int32 if max(nnz, d) < _INDEX_LIMIT else np.int64
        data, indices, indptr = np.empty(nnz), np.empty(nnz, idx), np.zeros(n + 1, idx)
    else:
        X = np.zeros((n, d + bias)) if sparse else np.empty((n, d + bias))
        X[:, d:] = 1.0
    row = pos = 0
    for m in metas:
        path, rows, vals = m["path"], np.s_[row:row + m["n"]], np.s_[pos:pos + m["nnz"]]
        # Only this rank's rows of the file: a row range, and its range of values.
        lo, first = m.get("lo", 0), m.get("first_value", 0)
        source, source_vals = np.s_[lo:lo + m["n"]], np.s_[first:first + m["nnz"]]
        with _open_shard(path) as f:
            if csr and m["nnz"]:
                f["X/data"].read_direct(data, source_sel=source_vals, dest_sel=vals)
                f["X/indices"].read_direct(indices, source_sel=source_vals, dest_sel=vals)
            elif sparse and m["nnz"]:
                _scatter_csr(f, m, X[rows])
            elif not sparse and m["n"] and d:
                f["X"].read_direct(X, source_sel=np.s_[lo:lo + m["n"], 0:d], dest_sel=np.s_[rows, 0:d])
            if m["n"]:
                f["y"].read_direct(y, source_sel=source, dest_sel=rows)
                if qid is not None:
                    f["qid"].read_direct(qid, source_sel=source, dest_sel=rows)
        if csr:
            indptr[row:row + m["n"] + 1] = m["indptr"] + pos
            _check_indices(indices[vals], d, path)
            _check_unique_indices(indices[vals], m["indptr"], path, row_offset=lo)
            _check_finite(data[vals], path, indptr=m["indptr"], row_offset=lo)
        elif not sparse:
            _check_finite(X[rows, :d], path, row_offset=lo)
        if kind == "multilabel":
            _check_indicator(y[rows], path)
        else:
            _check_finite(y[rows], path, "label")
            bad = (np.flatnonzero(~np.isin(y[rows], classes))
                   if kind not in ("real", "multioutput") else [])
            if len(bad):
                raise InputError(f"{path}: row {lo + bad[0] + 1} has label {_fmt_num(y[row + bad[0]])}"
                                 f", not one of the classes [{_fmt_values(classes)}]")
        row, pos = row + m["n"], pos + m["nnz"]
    if csr:
        X = _with_bias(sp.csr_matrix((data, indices, indptr), shape=(n, d), copy=False), bias)
    return X, y, qid


def _check_unique_indices(indices, indptr, path, row_offset=0):
    """Raise naming the first row of a CSR shard that gives a column twice (``X @ w`` would add the values).

    Rows with increasing indices (what the writer makes) pass in one
    vectorized comparison; only otherwise are the indices sorted per row.
    """
    out_of_order = np.flatnonzero(indices[1:] <= indices[:-1]) + 1
    if not np.isin(out_of_order, indptr[1:-1]).all():  # not only at the start of a row
        rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        order = np.lexsort((indices, rows))
        same = np.flatnonzero((indices[order][1:] == indices[order][:-1]) & (rows[order][1:] == rows[order][:-1]))
        if len(same):
            at = order[same[0]]
            raise InputError(f"{path}: row {rows[at] + row_offset + 1} gives column {indices[at]} twice "
                             "(duplicate index in /X/indices)")


def _check_indices(indices, d, path):
    if indices.size and (indices.min() < 0 or indices.max() >= d):
        raise InputError(f"{path}: /X/indices has a feature index out of range [0, {d})")


def _scatter_csr(f, m, out):
    """Fill the zeroed dense rows `out` with the CSR /X of the open shard `m`, checking it.

    A few MB are read at a time: the shard's CSR arrays are never all in memory.
    """
    path, indptr, d = m["path"], m["indptr"], m["d"]
    first, rows = m.get("first_value", 0), m.get("lo", 0)  # where this rank's rows start in the file
    step = max(1, _DENSE_READ // max(d, 1))
    for a in range(0, m["n"], step):
        b = min(a + step, m["n"])
        lo, hi = int(indptr[a]), int(indptr[b])
        if hi == lo:
            continue
        values, columns = f["X/data"][first + lo:first + hi], f["X/indices"][first + lo:first + hi]
        _check_indices(columns, d, path)
        _check_unique_indices(columns, indptr[a:b + 1] - lo, path, row_offset=rows + a)
        _check_finite(values, path, indptr=indptr[a:b + 1] - lo, row_offset=rows + a)
        out[np.repeat(np.arange(a, b), np.diff(indptr[a:b + 1])), columns] = values


def _dense_layout(sparse, nonzeros, rows, features, dense):
    """Whether to hold X dense in memory: `dense` if given, else CSR data of density >= DENSE_DENSITY."""
    if dense is not None:
        return bool(dense)
    return not sparse or nonzeros >= DENSE_DENSITY * rows * features


def _collectively(comm, fn, *args):
    """fn(*args) on every rank; an InputError on any rank is raised on all (comm.check)."""
    error = result = None
    try:
        result = fn(*args)
    except InputError as exc:
        error = exc
    comm.check(error)
    return result


def load_local(spec, comm, *, bias=False, dense=None):
    """Load this rank's block of shard files; validate them on every rank together.

    Rank 0 checks every file's attributes and structure (shapes, indptr) and
    that the files agree; a glob may name the shards of several conversions
    (directories), which must agree on features, labels and label mapping.
    The rows are cut into canonical blocks (:func:`_canonical_blocks`) that
    do not depend on the number of ranks P (up to 64), and rank r reads only
    the row ranges of its blocks: any P up to the number of rows works, and
    results are bitwise equal for every P. Files with query ids or
    structured examples stay whole (then P is at most the number of files).

    Parameters
    ----------
    spec : str, os.PathLike or sequence of them
        Shard files, as for :func:`list_shards`.
    comm : prbmrm.comm.SerialComm or prbmrm.comm.MPIComm
        Communicator; every rank must call this function.
    bias : bool, default False
        Append a constant-1 feature column.
    dense : bool or None, default None
        Hold X as a dense array (True) or as the shards store it (False);
        None: dense if the shards are, or if their CSR has a density of at
        least :data:`DENSE_DENSITY` over all shards (the same choice on
        every rank, so sums stay independent of the rank count).

    Returns
    -------
    LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, if any rank found a problem: no shard files, fewer
        files than ranks, a missing, truncated or corrupt file, a file of
        another format or version, inconsistent shapes, non-finite values,
        or shards that disagree (on features, labels, query ids, row count,
        or dense and sparse ones mixed).
    """
    def survey():
        files = list_shards(spec)
        light = [k for k, _, _ in _AGREED] + ["path", "n", "nnz", "exact", "negative"]
        return ([{key: m[key] for key in light} for m in _survey(files, _spec_label(spec, files))],
                _spec_label(spec, files))

    error = surveyed = None
    if comm.is_root:  # one rank checks every file's attributes; the others get the verdict
        try:
            surveyed = survey()
        except InputError as exc:
            error = exc
    comm.check(error)
    light, label = comm.bcast_object(surveyed)
    blocks = _canonical_blocks(light, comm.size)
    P, G = comm.size, len(blocks)
    if G < P:
        unit = "shard file" if light[0]["has_qid"] or light[0]["kind"] == STRUCTURED else "row"
        raise CollectiveError(f"{label}: {G} {unit}{'s' if G != 1 else ''} for {P} ranks: need at least "
                              f"one {unit} per rank" + (" (files with query ids or structured examples "
                                                        "are not split)" if unit != "row" else ""))
    mine = blocks[comm.rank * G // P:(comm.rank + 1) * G // P]
    files = [m["path"] for m in light]
    conversions = _conversions(files, label)

    first = light[0]
    as_dense = _dense_layout(first["sparse"], sum(m["nnz"] for m in light), sum(m["n"] for m in light),
                             first["d"], dense)

    def read_mine():
        pieces = {}  # file number -> (first row, end row) of this rank's blocks in it
        for i, lo, hi in mine:
            pieces[i] = (min(lo, pieces.get(i, (lo, hi))[0]), hi)
        metas = []
        for i, (lo, hi) in pieces.items():
            whole = _shard_meta(files[i], *conversions[i])
            metas.append(whole if (lo, hi) == (0, whole["n"]) else _slice_meta(whole, lo, hi))
        return metas, _read_local(metas, bias, as_dense)

    metas, (X, y, qid) = _collectively(comm, read_mine)
    row_counts = [hi - lo for _, lo, hi in mine]
    offset = sum(hi - lo for _, lo, hi in blocks[:comm.rank * G // P])
    return LocalData(X=X, y=y, qid=qid, n_features=first["d"],
                     n_examples_total=sum(m["n"] for m in light), label_kind=first["kind"],
                     classes=first["classes"], files=[m["path"] for m in metas],
                     bias=bool(bias), row_offset=int(offset),
                     blocks=[0] + np.cumsum(row_counts).tolist(),
                     positive=first["positive"], exact_width=first["exact"], negative=first["negative"])


def split_local(X, y, comm, *, qid=None, bias=False, label_kind=None, classes=None,
                source="", positive=None, exact_width=True, dense=None):
    """Keep this rank's contiguous block of in-memory data present on every rank.

    Every rank holds the same full arrays (the demo data, the Python API) and
    keeps the rows it would have loaded had they been written by
    :func:`write_shards` into K = max(P, min(units, 64, max(8, c / 2**14)))
    files (units: rows, or queries; c: the stored values plus the rows). The
    K blocks do not depend on P up to min(64, max(8, c / 2**14)) ranks.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n, d)
        All the features (identical on every rank).
    y : array_like
        All the labels (n,), or multilabel label sets / 2-D indicator.
    comm : prbmrm.comm.SerialComm or prbmrm.comm.MPIComm
        Communicator; every rank must call this function.
    qid : array_like, optional
        Query ids (n,); each query must be a contiguous run of rows.
    bias : bool, default False
        Append a constant-1 feature column.
    label_kind : str, optional
        Override the inferred label kind (e.g. ``"real"`` for integer-valued
        regression targets).
    classes : array_like, optional
        Override the inferred classes.
    source : str, optional
        Name of the data, used in messages.
    positive : float, optional
        One-vs-rest: this label becomes +1 and every other label -1.
    exact_width : bool, default True
        Recorded in :attr:`LocalData.exact_width`.
    dense : bool or None, default None
        Keep this rank's rows as a dense array (True) or as given (False);
        None: dense if `X` is, or if it is sparse with a density of at least
        :data:`DENSE_DENSITY`.

    Returns
    -------
    LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, if the data are inconsistent or not finite, or there
        are fewer rows (queries) than ranks.
    """
    where = source or "input arrays"

    def keep_mine():
        A = _as_matrix(X, where)
        n, d = A.shape
        if n == 0:
            raise InputError(f"{where}: no rows")
        Y, kind, found = _prepare_labels(y, n, where, label_kind=label_kind, classes=classes,
                                         positive=positive)
        q = _as_qid(qid, n, where)
        blocks = _rank_blocks(_row_costs(A, not sp.issparse(A)), q, comm, where)
        a, b = blocks[0], blocks[-1]
        mine = A[a:b]
        _check_finite(mine, where, row_offset=a)
        if sp.issparse(mine) and _dense_layout(True, A.nnz, n, d, dense):
            mine = mine.toarray()
        return LocalData(X=_with_bias(mine, bias), y=np.ascontiguousarray(Y[a:b]),
                         qid=None if q is None else q[a:b].copy(), n_features=d,
                         n_examples_total=n, label_kind=kind, classes=found, files=[],
                         bias=bool(bias), row_offset=a, blocks=[j - a for j in blocks],
                         positive=positive, exact_width=exact_width, negative=_raw_negative(y, positive))

    return _collectively(comm, keep_mine)


def _rank_blocks(costs, qid, comm, where, unit=("row", "rows")):
    """Global boundaries of this rank's canonical blocks of in-memory rows (or queries).

    The rows are cut as if sharded into K = max(P, min(units, 64, max(8,
    sum(costs) // 2**14))) files (:func:`_row_bounds` on the rows' `costs`),
    which do not depend on the number of ranks P up to K; each rank keeps whole blocks, as
    :func:`load_local` assigns files. K > units only when P > units, and then
    _row_bounds reports too few rows for the ranks.
    """
    P, r = comm.size, comm.rank
    n_units = len(costs) if qid is None else int(np.count_nonzero(qid[1:] != qid[:-1])) + 1
    by_cost = max(_SPLIT_MIN_BLOCKS, int(np.sum(costs)) // _SPLIT_BLOCK_COST)
    K = max(P, min(n_units, _SPLIT_BLOCKS, by_cost))
    bounds = _row_bounds(costs, qid, K, where, what="ranks", unit=unit)
    return bounds[r * K // P:(r + 1) * K // P + 1]
