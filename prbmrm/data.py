"""Data: the HDF5 shard format, conversion from text and arrays, validation, loading.

This module knows nothing of solvers or MPI. The functions that run on every
rank (:func:`load_local`, :func:`split_local`) are handed a communicator
(:class:`prbmrm.comm.SerialComm` or :class:`prbmrm.comm.MPIComm`) and use only
its ``rank``, ``size``, ``check``, ``allreduce_min``/``allreduce_max`` and
``gather_counts``. Every problem with the input is reported as an
:class:`prbmrm.errors.InputError` with one line naming the file and the
problem; on several ranks it becomes the same
:class:`prbmrm.errors.CollectiveError` on every rank.

Shard file format (version 1)
-----------------------------
One HDF5 file per shard, named ``part-00000.h5``, ``part-00001.h5``, ...

Root attributes
    ``format`` = ``"prbmrm-shard"``, ``format_version`` = 1, ``n_features``,
    ``n_examples`` (rows in this shard), ``n_examples_total`` (rows over all
    shards), ``shard_index``, ``shard_count``, ``label_kind`` (one of
    ``"binary"``, ``"integer"``, ``"real"``, ``"multilabel"``), ``classes``
    (float64, the sorted distinct label values over *all* shards, or the label
    ids for multilabel data; absent for ``"real"``), ``source`` (the input
    file names) and, when the labels were mapped one-vs-rest, ``positive``.
``/X``
    Either a group in the anndata CSR convention (attributes
    ``encoding-type`` = ``"csr_matrix"``, ``encoding-version`` = ``"0.1.0"``,
    ``shape`` = (n, d); datasets ``data`` float64, ``indices`` int32 (int64
    when d >= 2**31), ``indptr`` int64) or a dense (n, d) float64 dataset.
``/y``
    float64 (n,) labels; for multilabel data an int8 (n, k) 0/1 indicator
    whose columns follow ``classes``.
``/qid``
    int64 (n,) query ids, present when the input has them.

Datasets are stored contiguous and uncompressed: reading speed matters more
than size on disk.
"""

import glob
import hashlib
import io
import itertools
import lzma
import os
import re
from dataclasses import dataclass, field

import h5py
import numpy as np
import scipy.sparse as sp

from .errors import InputError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LABEL_KINDS",
    "LocalData",
    "infer_label_kind",
    "list_shards",
    "load_local",
    "read_input",
    "split_local",
    "write_shards",
]

FORMAT = "prbmrm-shard"
FORMAT_VERSION = 1
LABEL_KINDS = ("binary", "integer", "real", "multilabel")

_INDEX_LIMIT = 2**31  # int32 indices and indptr below this
_SPLIT_BLOCKS = 64  # canonical blocks of in-memory data (split_local)
_SHARD_RE = re.compile(r"^part-(\d+)\.h5$")
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz")


# --------------------------------------------------------------------------
# The local data of one rank
# --------------------------------------------------------------------------

@dataclass
class LocalData:
    """The rows of the data set held by one rank.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix or numpy.ndarray
        Local features, float64. Sparse matrices have int32 ``indices`` and
        ``indptr`` whenever the sizes allow (int64 otherwise); dense arrays
        are C-contiguous. With ``bias`` the last column is a constant 1.
    y : numpy.ndarray
        Local labels: float64 (n_local,), or an int8 (n_local, k) 0/1
        indicator for multilabel data, columns following `classes`.
    qid : numpy.ndarray or None
        int64 (n_local,) query ids, or None when the data has none.
    n_features : int
        Number of features of the data, *without* the bias column.
    n_examples_total : int
        Number of rows over all ranks.
    label_kind : str
        One of ``"binary"``, ``"integer"``, ``"real"``, ``"multilabel"``.
    classes : numpy.ndarray or None
        Sorted distinct label values over all ranks (label ids for
        multilabel data); None for real labels.
    files : list of str
        The shard files this rank read (empty for in-memory data).
    bias : bool
        Whether a constant-1 column was appended to `X`.
    row_offset : int
        Global index of the first local row (ranks hold contiguous blocks in
        rank order).
    blocks : list of int
        Local row boundaries ``[0, n_1, ..., n_local]`` of the canonical
        blocks of rows this rank holds: one per shard file read, or for
        in-memory data (:func:`split_local`) the blocks of a partition that
        does not depend on the number of ranks. Summing per block makes
        results independent of how blocks are spread over ranks.
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

    def __post_init__(self):
        if self.blocks is None:
            self.blocks = [0, self.n_local]

    @property
    def n_local(self):
        """int: Number of rows held by this rank."""
        return int(self.X.shape[0])


# --------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------

def infer_label_kind(y, multilabel=False):
    """Classify labels and find their distinct values.

    Parameters
    ----------
    y : array_like
        Labels of *all* examples: a 1-D numeric array; for multilabel data
        either a sequence of label sets (tuples of label ids, as returned by
        ``sklearn.datasets.load_svmlight_file(..., multilabel=True)``) or a
        2-D 0/1 indicator array.
    multilabel : bool, default False
        Treat `y` as multilabel. A 2-D array is always multilabel.

    Returns
    -------
    label_kind : str
        ``"multilabel"``; ``"real"`` if some value is not an integer;
        ``"binary"`` for exactly two distinct integer values; ``"integer"``
        otherwise (three or more distinct integer values, or the degenerate
        case of a single value).
    classes : numpy.ndarray or None
        Sorted distinct values as float64 (the label ids for multilabel data,
        ``0..k-1`` for an indicator array); None for ``"real"``.

    Raises
    ------
    InputError
        If the labels are not numeric or not finite.
    """
    if multilabel or (isinstance(y, np.ndarray) and y.ndim == 2):
        if isinstance(y, np.ndarray) and y.ndim == 2:
            _check_indicator(y, "labels")
            return "multilabel", np.arange(y.shape[1], dtype=np.float64)
        flat = _flatten_label_sets(y, "labels")
        return "multilabel", np.unique(flat)
    y = _label_vector(y, "labels")
    bad = ~np.isfinite(y)
    if bad.any():
        raise InputError(f"labels: row {int(np.argmax(bad)) + 1} has a non-finite label")
    values = np.unique(y)
    if np.any(values != np.round(values)):
        return "real", None
    return ("binary" if values.size == 2 else "integer"), values


def _label_vector(y, where):
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: labels are not numeric") from None
    if y.ndim != 1:
        raise InputError(f"{where}: labels must be a 1-D array, got shape {y.shape}")
    return y


def _flatten_label_sets(y, where):
    try:
        sets = [tuple(s) for s in y]
        flat = np.fromiter(itertools.chain.from_iterable(sets), dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: multilabel labels must be sequences of numeric "
                         "label ids") from None
    row = _first_nonfinite_label_set(sets, flat)
    if row is not None:
        raise InputError(f"{where}: row {row + 1} has a non-finite label")
    return flat


def _first_nonfinite_label_set(sets, flat=None):
    """0-based row of the first label set holding a non-finite value, or None."""
    if flat is None:
        flat = np.fromiter(itertools.chain.from_iterable(sets), dtype=np.float64)
    bad = ~np.isfinite(flat)
    if not bad.any():
        return None
    lens = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
    return int(np.searchsorted(np.cumsum(lens), int(np.argmax(bad)), side="right"))


def _check_indicator(Y, where):
    if Y.size and not np.isin(Y, (0, 1)).all():
        raise InputError(f"{where}: a multilabel indicator must hold only 0 and 1")


def _label_sets_to_indicator(y, classes):
    lens = np.fromiter((len(s) for s in y), dtype=np.int64, count=len(y))
    flat = np.fromiter(itertools.chain.from_iterable(y), dtype=np.float64, count=int(lens.sum()))
    Y = np.zeros((len(y), classes.size), dtype=np.int8)
    Y[np.repeat(np.arange(len(y)), lens), np.searchsorted(classes, flat)] = 1
    return Y


def _prepare_labels(y, n, where, *, multilabel=False, positive=None,
                    label_kind=None, classes=None):
    """Return (y array as stored, label_kind, classes)."""
    is_2d = isinstance(y, np.ndarray) and y.ndim == 2
    if multilabel or is_2d or label_kind == "multilabel":
        if positive is not None:
            raise InputError(f"{where}: positive= (one-vs-rest) does not apply to multilabel data")
        if is_2d:
            Y = np.asarray(y)
            _check_indicator(Y, where)
            if classes is None:
                classes = np.arange(Y.shape[1], dtype=np.float64)
            Y = Y.astype(np.int8)
        else:
            if len(y) != n:
                raise InputError(f"{where}: {len(y)} label sets for {n} rows")
            flat = _flatten_label_sets(y, where)
            if classes is None:
                classes = np.unique(flat)
            Y = _label_sets_to_indicator(y, np.asarray(classes, dtype=np.float64))
        classes = np.asarray(classes, dtype=np.float64)
        if Y.shape != (n, classes.size):
            raise InputError(f"{where}: multilabel indicator has shape {Y.shape}, "
                             f"expected ({n}, {classes.size})")
        return Y, "multilabel", classes
    y = _label_vector(y, where)
    if y.shape[0] != n:
        raise InputError(f"{where}: {y.shape[0]} labels for {n} rows")
    _check_finite_labels(y, where)
    if positive is not None:
        positive = float(positive)
        hit = y == positive
        if not hit.any():
            shown = _fmt_values(np.unique(y))
            raise InputError(f"{where}: the positive label {_fmt_num(positive)} does not "
                             f"occur in the data (labels: {shown})")
        return np.where(hit, 1.0, -1.0), "binary", np.array([-1.0, 1.0])
    if label_kind is None:
        label_kind, inferred = infer_label_kind(y)
        if classes is None:
            classes = inferred
    elif label_kind not in LABEL_KINDS:
        raise InputError(f"{where}: unknown label kind {label_kind!r} "
                         f"(one of {', '.join(LABEL_KINDS)})")
    elif label_kind != "real" and classes is None:
        classes = np.unique(y)
    if label_kind == "real":
        classes = None
    else:
        classes = np.asarray(classes, dtype=np.float64)
    return np.ascontiguousarray(y), label_kind, classes


def _fmt_num(v):
    v = float(v)
    return str(int(v)) if v == round(v) and abs(v) < 1e15 else repr(v)


def _fmt_values(values, limit=10):
    values = list(values)
    shown = ", ".join(_fmt_num(v) for v in values[:limit])
    if len(values) > limit:
        shown += f", ... ({len(values)} values)"
    return shown


# --------------------------------------------------------------------------
# Validation helpers shared by the readers and writers
# --------------------------------------------------------------------------

def _first_nonfinite_row(X):
    """0-based row of the first non-finite feature value of X, or None."""
    if sp.issparse(X):
        bad = ~np.isfinite(X.data)
        if not bad.any():
            return None
        return int(np.searchsorted(X.indptr, int(np.argmax(bad)), side="right")) - 1
    bad_rows = ~np.isfinite(X).all(axis=1)
    if not bad_rows.any():
        return None
    return int(np.argmax(bad_rows))


def _check_finite_features(X, where, row_offset=0, line_of_row=None):
    row = _first_nonfinite_row(X)
    if row is not None:
        raise InputError(f"{where}: {_row_text(row + row_offset, line_of_row)} "
                         "has a non-finite feature value")


def _check_finite_labels(y, where, row_offset=0, line_of_row=None):
    bad = ~np.isfinite(y)
    if bad.any():
        row = int(np.argmax(bad)) + row_offset
        raise InputError(f"{where}: {_row_text(row, line_of_row)} has a non-finite label")


def _row_text(row, line_of_row=None):
    text = f"row {row + 1}"
    if line_of_row is not None:
        line = line_of_row(row)
        if line is not None:
            text += f" (line {line})"
    return text


def _as_matrix(X, where):
    """Return (X as float64 CSR or C-contiguous 2-D ndarray, is_sparse)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
        return X, True
    try:
        X = np.ascontiguousarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: features are not numeric") from None
    if X.ndim != 2:
        raise InputError(f"{where}: features must be a 2-D array, got shape {X.shape}")
    return X, False


def _as_qid(qid, n, where):
    if qid is None:
        return None
    q = np.asarray(qid)
    if q.ndim != 1 or q.shape[0] != n:
        raise InputError(f"{where}: qid has shape {q.shape}, expected ({n},)")
    if not np.issubdtype(q.dtype, np.integer):
        try:
            qf = q.astype(np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{where}: query ids are not numeric") from None
        if not np.isfinite(qf).all() or np.any(qf != np.round(qf)):
            raise InputError(f"{where}: query ids must be integers")
        q = qf
    return np.ascontiguousarray(q, dtype=np.int64)


# --------------------------------------------------------------------------
# Balanced contiguous blocks of rows
# --------------------------------------------------------------------------

def _row_costs(X, is_sparse, dense_out):
    """Cost of each row: its stored values + 1 (a dense row stores all d values)."""
    n, d = X.shape
    if dense_out:
        return np.full(n, d + 1, dtype=np.int64)
    if is_sparse:
        return np.diff(X.indptr).astype(np.int64) + 1
    return np.count_nonzero(X, axis=1).astype(np.int64) + 1


def _query_starts(qid, where):
    """Row indices where a run of equal qid starts; error if a qid has two runs."""
    n = qid.shape[0]
    starts = np.flatnonzero(np.r_[True, qid[1:] != qid[:-1]])
    run_ids = qid[starts]
    order = np.argsort(run_ids, kind="stable")
    dup = np.flatnonzero(run_ids[order][1:] == run_ids[order][:-1])
    if dup.size:
        a, b = order[dup[0]], order[dup[0] + 1]
        ends = np.r_[starts[1:], n]
        raise InputError(
            f"{where}: qid {int(run_ids[a])} appears in two separate runs of rows "
            f"(rows {starts[a] + 1}-{ends[a]} and {starts[b] + 1}-{ends[b]}); "
            "the rows of a query must be contiguous")
    return starts


def _row_bounds(costs, qid, parts, where, what="parts"):
    """Boundaries (parts + 1 row indices) of `parts` contiguous, balanced blocks.

    Each block is a run of whole units (rows, or queries when `qid` is given);
    boundary k sits where the cumulative cost is closest to k/parts of the total.
    """
    n = costs.shape[0]
    if qid is not None:
        starts = _query_starts(qid, where)
    else:
        starts = np.arange(n)
    n_units = starts.size
    if parts < 1:
        raise InputError(f"{where}: the number of parts must be at least 1, got {parts}")
    if parts > n_units:
        one, many = ("query", "queries") if qid is not None else ("row", "rows")
        raise InputError(f"{where}: cannot split {n_units} {many} into {parts} {what}: "
                         f"each needs at least one {one}")
    unit_costs = np.add.reduceat(costs, starts) if n else np.zeros(0, np.int64)
    cum = np.r_[0, np.cumsum(unit_costs)].astype(np.float64)
    total = cum[-1]
    cuts = [0]
    for k in range(1, parts):
        target = total * k / parts
        j = int(np.searchsorted(cum, target))
        if j > 0 and (j > n_units or target - cum[j - 1] <= cum[j] - target):
            j -= 1
        j = min(max(j, cuts[-1] + 1), n_units - (parts - k))
        cuts.append(j)
    cuts.append(n_units)
    row_starts = np.r_[starts, n]
    return [int(row_starts[c]) for c in cuts]


def _csr_block(X, a, b):
    """Rows a:b of CSR X as (data, indices, indptr) views/arrays, indptr from 0."""
    lo, hi = X.indptr[a], X.indptr[b]
    return X.data[lo:hi], X.indices[lo:hi], (X.indptr[a:b + 1] - lo).astype(np.int64)


# --------------------------------------------------------------------------
# Reading input files
# --------------------------------------------------------------------------

def _strip_compression(name):
    lower = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if lower.endswith(suffix):
            return lower[: -len(suffix)], suffix
    return lower, ""


def _open_binary(path):
    _, comp = _strip_compression(os.fspath(path))
    if comp == ".gz":
        import gzip
        return gzip.open(path, "rb")
    if comp == ".bz2":
        import bz2
        return bz2.open(path, "rb")
    if comp == ".xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


def _check_readable_file(path):
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not an input file")


_READ_ERRORS = (OSError, EOFError, lzma.LZMAError)


def read_input(path, *, multilabel=False, n_features=None, label_column=0):
    """Read examples from SVMlight/LIBSVM text, ``.npz`` or ``.csv`` files.

    Parameters
    ----------
    path : str, os.PathLike or sequence of them
        Input file(s); several files are concatenated in order, with a common
        number of features (the largest). The format follows the name:

        - ``*.npz``: arrays ``X`` (dense, 2-D) or ``data``, ``indices``,
          ``indptr``, ``shape`` (the :func:`scipy.sparse.save_npz` layout,
          CSR or CSC) together with ``y`` and optionally ``qid``; for
          multilabel data ``y`` may be a 2-D 0/1 indicator (optional
          ``classes`` array naming its columns).
        - ``*.csv`` (also ``.gz``, ``.bz2``, ``.xz``): numeric comma-separated
          values, label in column `label_column`; a first line that is not
          numeric is taken as a header.
        - anything else: SVMlight/LIBSVM text, possibly compressed (``.gz``,
          ``.bz2``, ``.xz``), read with
          :func:`sklearn.datasets.load_svmlight_file` (``query_id=True``).
          Feature indices are one-based unless some file uses index 0.
    multilabel : bool, default False
        Labels are comma-separated label sets (SVMlight), or a 2-D indicator
        (``.npz``).
    n_features : int, optional
        Number of features; at least the largest feature index found.
    label_column : int, default 0
        Column of the label in CSV input (negative counts from the end).

    Returns
    -------
    X : scipy.sparse.csr_matrix or numpy.ndarray
        Features, float64: sparse for SVMlight input (or when inputs of
        different kinds are mixed), dense for dense ``.npz`` and CSV input.
    y : numpy.ndarray or list of tuple
        float64 labels, or for multilabel data a list of label-id tuples.
    qid : numpy.ndarray or None
        int64 query ids if the input has them (then every row must have one).

    Raises
    ------
    InputError
        On a missing, empty, unreadable or malformed file, non-numeric labels,
        non-finite values, or inconsistent inputs; the message names the file
        and, where known, the line or row.
    """
    paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
    if not paths:
        raise InputError("no input files given")
    if n_features is not None and (int(n_features) != n_features or n_features < 1):
        raise InputError(f"n_features must be a positive integer, got {n_features!r}")
    pieces = []
    for p in paths:
        p = os.fspath(p)
        _check_readable_file(p)
        base, _ = _strip_compression(os.path.basename(p))
        if p.lower().endswith(".npz"):
            pieces.append(_read_npz(p, multilabel))
        elif base.endswith(".csv"):
            if multilabel:
                raise InputError(f"{p}: multilabel input must be SVMlight or .npz, not CSV")
            pieces.append(_read_csv(p, label_column))
        else:
            pieces.append(_read_svmlight(p, multilabel))
    return _combine(pieces, multilabel, n_features)


def _read_svmlight(path, multilabel):
    from sklearn.datasets import load_svmlight_file

    _, comp = _strip_compression(path)
    kwargs = dict(dtype=np.float64, multilabel=multilabel, zero_based=True, query_id=True)
    try:
        if comp == ".xz":
            with lzma.open(path, "rb") as f:
                X, y, qid = load_svmlight_file(f, **kwargs)
        else:
            X, y, qid = load_svmlight_file(path, **kwargs)
    except ValueError as exc:
        raise _svmlight_error(path, exc, multilabel) from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    X = sp.csr_matrix(X, dtype=np.float64)
    line_of_row = _svmlight_line_finder(path)
    _check_finite_features(X, path, line_of_row=line_of_row)
    if multilabel:
        y = [tuple(s) for s in y]
        row = _first_nonfinite_label_set(y)
        if row is not None:
            raise InputError(f"{path}: {_row_text(row, line_of_row)} has a non-finite label")
    else:
        y = np.array(y, dtype=np.float64)
        _check_finite_labels(y, path, line_of_row=line_of_row)
    if qid.size == 0:
        qid = None
    elif qid.size != n:
        raise InputError(f"{path}: {qid.size} of {n} rows have a query id (qid:); "
                         "either every row or none must have one")
    else:
        qid = np.array(qid, dtype=np.int64)
    return dict(path=path, X=X, y=y, qid=qid, svmlight=True)


def _svmlight_data_lines(path):
    """Yield (line number, line) of the lines that hold an example."""
    with _open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            if line.split(b"#", 1)[0].split():
                yield lineno, line


def _svmlight_line_finder(path):
    def line_of_row(row):
        try:
            for i, (lineno, _) in enumerate(_svmlight_data_lines(path)):
                if i == row:
                    return lineno
        except _READ_ERRORS:
            pass
        return None
    return line_of_row


def _svmlight_error(path, exc, multilabel):
    """InputError for a parse failure, with the line number if it can be found."""
    found = _locate_svmlight_error(path, multilabel)
    if found is None:
        return InputError(f"{path}: malformed SVMlight input: {exc}")
    lineno, line, message = found
    tokens = line.split(b"#", 1)[0].split()
    label = tokens[0].decode("utf-8", "replace") if tokens else ""
    if label and not (multilabel and ":" in label):
        def numeric(s):
            try:
                float(s)
                return True
            except ValueError:
                return False
        parts = label.split(",")
        if not multilabel and len(parts) > 1 and all(numeric(p) for p in parts):
            return InputError(f"{path}: line {lineno}: label {label!r} is a label set; "
                              "read multilabel data with --multilabel (multilabel=True)")
        if not all(numeric(p) for p in (parts if multilabel else [label])):
            return InputError(f"{path}: line {lineno}: non-numeric label {label!r}")
    return InputError(f"{path}: malformed SVMlight input at line {lineno}: {message}")


def _locate_svmlight_error(path, multilabel, chunk=4096):
    """Re-parse `path` in chunks, then line by line, to find the failing line."""
    from sklearn.datasets import load_svmlight_file

    kwargs = dict(multilabel=multilabel, zero_based=True, query_id=True)

    def fails(lines):
        try:
            load_svmlight_file(io.BytesIO(b"".join(lines)), **kwargs)
        except ValueError as exc:
            return str(exc)
        return None

    try:
        with _open_binary(path) as f:
            done = 0
            while True:
                block = list(itertools.islice(f, chunk))
                if not block:
                    return None
                if fails(block) is not None:
                    for i, line in enumerate(block):
                        message = fails([line])
                        if message is not None:
                            return done + i + 1, line, message
                    return None
                done += len(block)
    except _READ_ERRORS:
        return None


def _read_csv(path, label_column):
    try:
        with _open_binary(path) as f:
            text = io.TextIOWrapper(f, encoding="utf-8", errors="replace")
            header = 0
            first = ""
            for line in text:
                if line.split("#", 1)[0].strip():
                    first = line.split("#", 1)[0]
                    break
                header += 1
            if not first:
                raise InputError(f"{path}: empty file (no data rows)")
            try:
                [float(v) for v in first.split(",")]
                skip = header
            except ValueError:
                skip = header + 1  # the first non-blank line is a header
        with _open_binary(path) as f:
            text = io.TextIOWrapper(f, encoding="utf-8")
            try:
                A = np.loadtxt(text, delimiter=",", skiprows=skip, ndmin=2,
                               dtype=np.float64, comments="#")
            except ValueError as exc:
                raise _csv_error(path, exc, skip, label_column) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file: {exc}") from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if A.shape[0] == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    ncol = A.shape[1]
    if ncol < 2:
        raise InputError(f"{path}: needs a label column and at least one feature column, "
                         f"found {ncol} column")
    if not -ncol <= label_column < ncol:
        raise InputError(f"{path}: label column {label_column} does not exist "
                         f"({ncol} columns)")
    lc = label_column % ncol
    y = np.ascontiguousarray(A[:, lc])
    X = np.ascontiguousarray(np.delete(A, lc, axis=1))
    _check_finite_features(X, path)
    _check_finite_labels(y, path)
    return dict(path=path, X=X, y=y, qid=None, svmlight=False)


def _csv_error(path, exc, skip, label_column):
    """Find the first bad field of a CSV file for a one-line message."""
    try:
        with _open_binary(path) as f:
            text = io.TextIOWrapper(f, encoding="utf-8", errors="replace")
            width = None
            for lineno, line in enumerate(text, start=1):
                if lineno <= skip:
                    continue
                content = line.split("#", 1)[0].strip()
                if not content:
                    continue
                fields = content.split(",")
                if width is None:
                    width = len(fields)
                elif len(fields) != width:
                    return InputError(f"{path}: line {lineno} has {len(fields)} columns, "
                                      f"expected {width}")
                for col, value in enumerate(fields):
                    try:
                        float(value)
                    except ValueError:
                        what = ("non-numeric label" if col == label_column % len(fields)
                                else f"non-numeric value in column {col + 1}")
                        return InputError(f"{path}: line {lineno}: {what} {value.strip()!r}")
    except _READ_ERRORS:
        pass
    return InputError(f"{path}: malformed CSV input: {exc}")


def _read_npz(path, multilabel):
    import zipfile

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
        X, _ = _as_matrix(arrays["X"], path)
    elif all(k in arrays for k in ("data", "indices", "indptr", "shape")):
        fmt = arrays["format"].item() if "format" in arrays else b"csr"
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt not in ("csr", "csc"):
            raise InputError(f"{path}: sparse format {fmt!r} is not supported (csr or csc)")
        cls = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
        try:
            X = cls((arrays["data"], arrays["indices"], arrays["indptr"]),
                    shape=tuple(int(s) for s in arrays["shape"]))
            X.check_format(full_check=True)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{path}: invalid sparse matrix: {exc}") from None
        X, _ = _as_matrix(X, path)
    else:
        raise InputError(f"{path}: no feature arrays: expected 'X' (dense) or "
                         "'data', 'indices', 'indptr', 'shape' (sparse)")
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    y = arrays["y"]
    if y.ndim == 2 or multilabel:
        if y.ndim != 2:
            raise InputError(f"{path}: multilabel 'y' must be a 2-D 0/1 indicator array")
        if y.shape[0] != n:
            raise InputError(f"{path}: 'y' has {y.shape[0]} rows but X has {n}")
        _check_indicator(y, path)
        classes = (np.asarray(arrays["classes"], dtype=np.float64) if "classes" in arrays
                   else np.arange(y.shape[1], dtype=np.float64))
        if classes.shape != (y.shape[1],):
            raise InputError(f"{path}: 'classes' has {classes.size} entries for "
                             f"{y.shape[1]} indicator columns")
        y = [tuple(classes[np.flatnonzero(row)]) for row in y]
    else:
        y = _label_vector(y, path)
        if y.shape[0] != n:
            raise InputError(f"{path}: 'y' has {y.shape[0]} labels but X has {n} rows")
        _check_finite_labels(y, path)
    _check_finite_features(X, path)
    qid = _as_qid(arrays["qid"], n, path) if "qid" in arrays else None
    return dict(path=path, X=X, y=y, qid=qid, svmlight=False)


def _combine(pieces, multilabel, n_features):
    with_q = [p for p in pieces if p["qid"] is not None]
    if with_q and len(with_q) != len(pieces):
        without = next(p for p in pieces if p["qid"] is None)
        raise InputError(f"{without['path']}: has no query ids (qid:) but "
                         f"{with_q[0]['path']} has; give all inputs query ids or none")
    # sklearn's zero_based="auto" over all SVMlight files together: one-based
    # unless some file uses feature index 0.
    svm = [p for p in pieces if p["svmlight"]]
    if svm and not any(p["X"].indices.size and p["X"].indices.min() == 0 for p in svm):
        for p in svm:
            X = p["X"]
            d = int(X.indices.max()) if X.indices.size else 0
            p["X"] = sp.csr_matrix((X.data, X.indices - 1, X.indptr), shape=(X.shape[0], d))
    for p in svm:  # width = largest index used
        X = p["X"]
        d = int(X.indices.max()) + 1 if X.indices.size else 0
        if X.shape[1] != d:
            p["X"] = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], d))
    widest = max(pieces, key=lambda p: p["X"].shape[1])
    d = widest["X"].shape[1]
    if n_features is not None:
        if n_features < d:
            raise InputError(f"{widest['path']}: has {d} features, more than "
                             f"n_features={n_features}")
        d = int(n_features)
    if d == 0:
        raise InputError(f"{pieces[0]['path']}: no feature values at all")
    if all(not sp.issparse(p["X"]) for p in pieces):
        blocks = [np.pad(p["X"], ((0, 0), (0, d - p["X"].shape[1]))) if p["X"].shape[1] < d
                  else p["X"] for p in pieces]
        X = blocks[0] if len(blocks) == 1 else np.vstack(blocks)
        X = np.ascontiguousarray(X)
    else:
        blocks = []
        for p in pieces:
            B = sp.csr_matrix(p["X"])
            blocks.append(sp.csr_matrix((B.data, B.indices, B.indptr), shape=(B.shape[0], d)))
        X = blocks[0] if len(blocks) == 1 else sp.vstack(blocks, format="csr")
        X = sp.csr_matrix(X, dtype=np.float64)
    if any(isinstance(p["y"], list) for p in pieces):
        y = list(itertools.chain.from_iterable(p["y"] for p in pieces))
    else:
        y = np.concatenate([p["y"] for p in pieces])
    qid = np.concatenate([p["qid"] for p in pieces]) if with_q else None
    return X, y, qid


# --------------------------------------------------------------------------
# Writing shards
# --------------------------------------------------------------------------

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
                 multilabel=False, positive=None, overwrite=False):
    """Split examples into `parts` HDF5 shard files.

    The rows are cut into `parts` contiguous blocks balanced by cost
    (nonzeros + 1 per row; a dense row costs its width + 1): boundary k is put
    where the cumulative cost is closest to k/parts of the total, and never
    inside a query.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix, shape (n, d)
        Features.
    y : array_like
        Labels (n,); multilabel data as label-id tuples or a 2-D indicator.
    out_dir : str or os.PathLike
        Output directory, created if needed; receives ``part-00000.h5``, ...
    parts : int
        Number of shard files, at most the number of rows (of queries, with
        `qid`).
    qid : array_like, optional
        Query ids (n,); the rows of each query must be contiguous.
    source : str, optional
        Input file names, stored in the ``source`` attribute and used in
        messages.
    dense : bool, optional
        Store ``/X`` dense (True) or sparse (False); by default as `X` is.
    multilabel : bool, default False
        `y` holds label sets (implied by a 2-D `y`).
    positive : float, optional
        One-vs-rest: this label becomes +1 and every other label -1.
    overwrite : bool, default False
        Replace existing ``part-*.h5`` files in `out_dir` (and remove those
        beyond the new count) instead of refusing.

    Returns
    -------
    list of str
        Paths of the written shard files, in order.

    Raises
    ------
    InputError
        On inconsistent or non-finite input, a query split over two runs of
        rows, more parts than rows or queries, existing shard files without
        `overwrite`, or a failure to write; nothing is left behind then.
    """
    where = source or "input arrays"
    X, is_sparse = _as_matrix(X, where)
    n, d = X.shape
    if n == 0:
        raise InputError(f"{where}: no rows to write")
    if isinstance(parts, bool) or int(parts) != parts:
        raise InputError(f"{where}: the number of parts must be an integer, got {parts!r}")
    parts = int(parts)
    Y, label_kind, classes = _prepare_labels(y, n, where, multilabel=multilabel,
                                             positive=positive)
    qid = _as_qid(qid, n, where)
    _check_finite_features(X, where)
    dense_out = (not is_sparse) if dense is None else bool(dense)
    bounds = _row_bounds(_row_costs(X, is_sparse, dense_out), qid, parts, where)

    out_dir = os.fspath(out_dir)
    created = False
    try:
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise InputError(f"{out_dir}: exists and is not a directory")
        if not os.path.exists(out_dir):
            os.makedirs(out_dir)
            created = True
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot create the output directory: "
                         f"{exc.strerror or exc}") from None
    existing = _existing_parts(out_dir)
    if existing and not overwrite:
        raise InputError(f"{out_dir}: already holds shard files "
                         f"({os.path.basename(existing[0])}, ...); pass --overwrite "
                         "(overwrite=True) to replace them")

    finals = [os.path.join(out_dir, _shard_name(i)) for i in range(parts)]
    temps, replaced = [], []
    attrs = dict(format=FORMAT, format_version=np.int64(FORMAT_VERSION),
                 n_features=np.int64(d), n_examples_total=np.int64(n),
                 shard_count=np.int64(parts), label_kind=label_kind, source=str(source))
    if classes is not None:
        attrs["classes"] = np.asarray(classes, dtype=np.float64)
    if positive is not None:
        attrs["positive"] = np.float64(positive)
    try:
        for i in range(parts):
            a, b = bounds[i], bounds[i + 1]
            tmp = os.path.join(out_dir, f".{_shard_name(i)}.tmp-{os.getpid()}")
            temps.append(tmp)
            _write_one(tmp, X, is_sparse, dense_out, Y, qid, a, b, i, attrs)
        for tmp, final in zip(temps, finals):
            os.replace(tmp, final)
            replaced.append(final)
    except BaseException as exc:
        for p in temps + [f for f in replaced if f not in existing]:
            try:
                os.remove(p)
            except OSError:
                pass
        if created:
            try:
                os.rmdir(out_dir)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise InputError(f"{out_dir}: cannot write shard files: {exc}") from None
        raise
    for stale in existing:
        if stale not in finals:
            os.remove(stale)
    return finals


def _write_one(path, X, is_sparse, dense_out, Y, qid, a, b, index, attrs):
    n_rows, d = b - a, X.shape[1]
    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        f.attrs["n_examples"] = np.int64(n_rows)
        f.attrs["shard_index"] = np.int64(index)
        if is_sparse:
            data, indices, indptr = _csr_block(X, a, b)
        if dense_out:
            block = (sp.csr_matrix((data, indices, indptr), shape=(n_rows, d)).toarray()
                     if is_sparse else X[a:b])
            f.create_dataset("X", data=np.ascontiguousarray(block, dtype=np.float64))
        else:
            if not is_sparse:
                block = sp.csr_matrix(X[a:b])
                data, indices, indptr = block.data, block.indices, block.indptr
            g = f.create_group("X")
            g.attrs["encoding-type"] = "csr_matrix"
            g.attrs["encoding-version"] = "0.1.0"
            g.attrs["shape"] = np.array([n_rows, d], dtype=np.int64)
            g.create_dataset("data", data=np.asarray(data, dtype=np.float64))
            g.create_dataset("indices", data=np.asarray(
                indices, dtype=np.int32 if d < _INDEX_LIMIT else np.int64))
            g.create_dataset("indptr", data=np.asarray(indptr, dtype=np.int64))
        f.create_dataset("y", data=Y[a:b])
        if qid is not None:
            f.create_dataset("qid", data=qid[a:b])


def _shard_summary(path):
    """Rows, stored nonzeros, queries and layout of one shard file (for the CLI)."""
    with h5py.File(path, "r") as f:
        rows = int(f.attrs["n_examples"])
        X = f["X"]
        if isinstance(X, h5py.Group):
            nnz, layout = int(X["data"].shape[0]), "sparse"
        else:
            nnz, layout = int(np.count_nonzero(X[()])), "dense"
        queries = None
        if "qid" in f:
            q = f["qid"][()]
            queries = int(np.count_nonzero(np.r_[True, q[1:] != q[:-1]])) if q.size else 0
        return dict(rows=rows, nnz=nnz, queries=queries, layout=layout,
                    n_features=int(f.attrs["n_features"]), label_kind=str(f.attrs["label_kind"]),
                    n_classes=int(f.attrs["classes"].size) if "classes" in f.attrs else None)


# --------------------------------------------------------------------------
# Finding and loading shards
# --------------------------------------------------------------------------

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
        files = []
        for s in spec:
            files.extend(list_shards(s))
        return files
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


_REQUIRED_ATTRS = ("n_features", "n_examples", "n_examples_total", "shard_index",
                   "shard_count", "label_kind")


def _shard_meta(path, pos, files, label):
    """Open one shard, check its attributes and structure; return its metadata.

    Reads only attributes, shapes and ``indptr`` (n + 1 integers).
    """
    S = len(files)
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            if "format" not in a or _attr_str(a["format"]) != FORMAT:
                got = repr(_attr_str(a["format"])) if "format" in a else "missing"
                raise InputError(f"{path}: not a prbmrm shard file (format attribute "
                                 f"is {got})")
            if "format_version" not in a or int(a["format_version"]) != FORMAT_VERSION:
                got = int(a["format_version"]) if "format_version" in a else "missing"
                raise InputError(f"{path}: shard format version {got} is not supported "
                                 f"(this prbmrm reads version {FORMAT_VERSION})")
            for key in _REQUIRED_ATTRS:
                if key not in a:
                    raise InputError(f"{path}: missing attribute {key!r} "
                                     "(not a prbmrm shard file?)")
            count, index = int(a["shard_count"]), int(a["shard_index"])
            if count != S:
                raise _count_error(path, count, files, label)
            if index != pos:
                raise InputError(f"{path}: shard_index is {index} but the file is number "
                                 f"{pos} (from 0) of the {S} sorted shard files "
                                 "(renamed or mixed shard files?)")
            n, d = int(a["n_examples"]), int(a["n_features"])
            kind = _attr_str(a["label_kind"])
            if kind not in LABEL_KINDS:
                raise InputError(f"{path}: unknown label_kind {kind!r}")
            classes = None
            if kind != "real":
                if "classes" not in a:
                    raise InputError(f"{path}: missing attribute 'classes' for "
                                     f"label_kind {kind!r}")
                classes = np.atleast_1d(np.asarray(a["classes"], dtype=np.float64))
            meta = dict(path=path, pos=pos, n=n, d=d, kind=kind, classes=classes,
                        n_total=int(a["n_examples_total"]), has_qid="qid" in f)
            if "X" not in f:
                raise InputError(f"{path}: no /X (not a prbmrm shard file?)")
            X = f["X"]
            if isinstance(X, h5py.Group):
                enc = _attr_str(X.attrs.get("encoding-type", ""))
                if enc != "csr_matrix":
                    raise InputError(f"{path}: /X has encoding-type {enc!r}, "
                                     "expected 'csr_matrix'")
                for key in ("data", "indices", "indptr"):
                    if key not in X:
                        raise InputError(f"{path}: /X has no {key!r} dataset")
                shape = tuple(int(s) for s in X.attrs.get("shape", ()))
                if shape != (n, d):
                    raise InputError(f"{path}: /X has shape {shape}, but the attributes "
                                     f"say ({n}, {d})")
                nnz = X["data"].shape[0] if X["data"].ndim == 1 else -1
                if X["indices"].shape != (nnz,) or nnz < 0:
                    raise InputError(f"{path}: /X/data and /X/indices differ in length")
                if X["indptr"].shape != (n + 1,):
                    raise InputError(f"{path}: /X/indptr has shape {X['indptr'].shape}, "
                                     f"expected ({n + 1},)")
                indptr = X["indptr"][()].astype(np.int64)
                if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
                    raise InputError(f"{path}: /X/indptr is inconsistent (not increasing "
                                     f"from 0 to the {nnz} stored values)")
                meta.update(sparse=True, nnz=nnz, indptr=indptr)
            else:
                if X.shape != (n, d):
                    raise InputError(f"{path}: /X has shape {X.shape}, but the attributes "
                                     f"say ({n}, {d})")
                meta.update(sparse=False, nnz=n * d, indptr=None)
            if "y" not in f:
                raise InputError(f"{path}: no /y labels")
            want = (n, classes.size) if kind == "multilabel" else (n,)
            if f["y"].shape != want:
                raise InputError(f"{path}: /y has shape {f['y'].shape}, expected {want}")
            if meta["has_qid"] and f["qid"].shape != (n,):
                raise InputError(f"{path}: /qid has shape {f['qid'].shape}, expected ({n},)")
            return meta
    except OSError as exc:
        raise InputError(f"{path}: not a readable HDF5 file (truncated or corrupt): "
                         f"{_h5_reason(exc)}") from None


def _attr_str(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _attr_str(value.item())
    return str(value)


def _h5_reason(exc):
    return " ".join(str(exc).split())


def _count_error(path, count, files, label):
    S = len(files)
    if count > S:
        names = {os.path.basename(f) for f in files}
        missing = [_shard_name(k) for k in range(count) if _shard_name(k) not in names]
        if missing:
            return InputError(f"{label}: missing shard {missing[0]} (shard_count is {count}, "
                              f"found {S} file{'s' if S != 1 else ''})")
        return InputError(f"{label}: shard_count is {count} in {path} but {S} shard "
                          f"file{'s were' if S != 1 else ' was'} found")
    return InputError(f"{label}: {S} shard files but {path} has shard_count {count} "
                      "(shard files of different conversions mixed?)")


def _classes_key(classes):
    """An exact float64 fingerprint (48 bits) of a classes array."""
    if classes is None:
        return -1.0
    digest = hashlib.blake2b(np.ascontiguousarray(classes, np.float64).tobytes(),
                             digest_size=6).digest()
    return float(int.from_bytes(digest, "little"))


def _consistency_error(comm, files, metas, label):
    """Collective: compare the shards of all ranks; return the same error (or None) on all."""
    kinds = {k: i for i, k in enumerate(LABEL_KINDS)}
    keys = np.array([[m["d"], kinds[m["kind"]], _classes_key(m["classes"]),
                      float(m["has_qid"]), m["n_total"]] for m in metas], dtype=np.float64)
    n_keys = keys.shape[1]
    reduced = comm.allreduce_min(np.r_[keys.min(axis=0), -keys.max(axis=0)])
    gmin, gmax = reduced[:n_keys], -reduced[n_keys:]
    n_local = int(sum(m["n"] for m in metas))
    counts = comm.gather_counts(n_local)
    S = len(files)
    for j in range(n_keys):
        if gmin[j] == gmax[j]:
            continue
        pos = np.array([m["pos"] for m in metas], dtype=np.float64)
        first = comm.allreduce_min(np.array([
            pos[keys[:, j] == gmin[j]].min(initial=S),
            pos[keys[:, j] == gmax[j]].min(initial=S)]))
        ia, ib = int(first[0]), int(first[1])
        if j == 0:
            what, va, vb = "the number of features", int(gmin[j]), int(gmax[j])
        elif j == 1:
            what, va, vb = ("the label kind", repr(LABEL_KINDS[int(gmin[j])]),
                            repr(LABEL_KINDS[int(gmax[j])]))
        elif j == 2:
            ca, cb = _share_classes(comm, metas, ia, ib)
            what, va, vb = "the label classes", f"[{_fmt_values(ca)}]", f"[{_fmt_values(cb)}]"
        elif j == 3:
            what, va, vb = "query ids", "none", "query ids"
        else:
            what, va, vb = "n_examples_total", int(gmin[j]), int(gmax[j])
        if ib < ia:
            ia, ib, va, vb = ib, ia, vb, va
        hint = " (shard files of different conversions mixed?)" if j == 4 else ""
        return InputError(f"shards disagree on {what}: {files[ia]} has {va}, "
                          f"{files[ib]} has {vb}{hint}")
    total = int(counts.sum())
    if total != int(gmin[4]):
        return InputError(f"{label}: the {S} shard files hold {total} rows but "
                          f"n_examples_total is {int(gmin[4])} (shard files missing or "
                          "of different conversions mixed?)")
    return None


def _share_classes(comm, metas, ia, ib):
    """Collective: the classes of shards ia and ib, on every rank (error path only)."""
    mine = {m["pos"]: m["classes"] for m in metas}
    sizes = np.zeros(2)
    for slot, i in enumerate((ia, ib)):
        if i in mine and mine[i] is not None:
            sizes[slot] = mine[i].size
    sizes = comm.allreduce_max(sizes).astype(int)
    buf = np.full(int(sizes.sum()), -np.inf)
    offsets = (0, sizes[0])
    for slot, i in enumerate((ia, ib)):
        if i in mine and mine[i] is not None:
            buf[offsets[slot]:offsets[slot] + sizes[slot]] = mine[i]
    buf = comm.allreduce_max(buf)
    return buf[:sizes[0]], buf[sizes[0]:]


def _index_dtype(*sizes):
    return np.int32 if max(sizes) < _INDEX_LIMIT else np.int64


def _read_local(metas, bias):
    """Read this rank's shards (already checked) into one X, y, qid; validate values.

    Sparse shards are read straight into preallocated arrays (no concatenation
    copy); a rank holding both dense and sparse shards converts the dense ones.
    """
    n = sum(m["n"] for m in metas)
    d = metas[0]["d"]
    kind, classes = metas[0]["kind"], metas[0]["classes"]
    all_dense = not any(m["sparse"] for m in metas)
    all_sparse = all(m["sparse"] for m in metas)
    y = (np.empty((n, classes.size), dtype=np.int8) if kind == "multilabel"
         else np.empty(n, dtype=np.float64))
    qid = np.empty(n, dtype=np.int64) if metas[0]["has_qid"] else None
    if all_dense:
        X = np.empty((n, d + bias), dtype=np.float64)
        if bias:
            X[:, d] = 1.0
    else:
        nnz = sum(m["nnz"] for m in metas)  # a dense shard counts n * d (an upper bound)
        idx = _index_dtype(nnz + (n if bias else 0), d + 1)
        if all_sparse:
            data_all = np.empty(nnz, dtype=np.float64)
            indices_all = np.empty(nnz, dtype=idx)
            indptr_all = np.zeros(n + 1, dtype=idx)
        parts = []
    row = pos = 0
    for m in metas:
        path, rows = m["path"], slice(row, row + m["n"])
        try:
            with h5py.File(path, "r") as f:
                if m["sparse"]:
                    g, k = f["X"], m["nnz"]
                    if all_sparse:
                        data, indices = data_all[pos:pos + k], indices_all[pos:pos + k]
                        indptr_all[row:row + m["n"] + 1] = m["indptr"] + pos
                    else:
                        data, indices = np.empty(k), np.empty(k, dtype=idx)
                        parts.append((data, indices, m["indptr"]))
                    if k:
                        g["data"].read_direct(data)
                        g["indices"].read_direct(indices)
                    if k and (indices.min() < 0 or indices.max() >= d):
                        raise InputError(f"{path}: /X/indices has a feature index out of "
                                         f"range [0, {d})")
                    _check_finite_features(sp.csr_matrix((data, indices, m["indptr"]),
                                                         shape=(m["n"], d), copy=False), path)
                    pos += k
                elif all_dense:
                    if m["n"] and d:
                        f["X"].read_direct(X, dest_sel=np.s_[rows, 0:d])
                    _check_finite_features(X[rows, :d], path)
                else:
                    block = sp.csr_matrix(f["X"][()])
                    _check_finite_features(block, path)
                    parts.append((block.data, block.indices.astype(idx), block.indptr))
                if m["n"]:
                    f["y"].read_direct(y, dest_sel=np.s_[rows])
                    if qid is not None:
                        f["qid"].read_direct(qid, dest_sel=np.s_[rows])
        except OSError as exc:
            raise InputError(f"{path}: not a readable HDF5 file (truncated or corrupt): "
                             f"{_h5_reason(exc)}") from None
        ylocal = y[rows]
        if kind == "multilabel":
            _check_indicator(ylocal, path)
        else:
            _check_finite_labels(ylocal, path)
            if kind != "real" and ylocal.size:
                bad = ~np.isin(ylocal, classes)
                if bad.any():
                    raise InputError(f"{path}: row {int(np.argmax(bad)) + 1} has label "
                                     f"{_fmt_num(ylocal[bad][0])}, not one of the classes "
                                     f"[{_fmt_values(classes)}]")
        row += m["n"]
    if all_dense:
        return X, y, qid
    if all_sparse:
        data, indices, indptr = data_all, indices_all, indptr_all
    else:
        data = np.concatenate([p[0] for p in parts])
        indices = np.concatenate([p[1] for p in parts]).astype(idx, copy=False)
        offsets = np.cumsum([0] + [p[2][-1] for p in parts[:-1]])
        indptr = np.concatenate([[0]] + [p[2][1:] + o for p, o in zip(parts, offsets)])
        indptr = indptr.astype(idx)
    if bias:
        data, indices, indptr = _append_bias(data, indices, indptr, n, d)
    X = sp.csr_matrix((data, indices, indptr), shape=(n, d + bias), copy=False)
    _force_index_dtype(X, idx)
    return X, y, qid


def _append_bias(data, indices, indptr, n, d):
    """CSR arrays with a constant-1 entry at column d appended to every row."""
    new_indptr = indptr + np.arange(n + 1, dtype=indptr.dtype)
    total = int(new_indptr[-1])
    at = new_indptr[1:] - 1
    keep = np.ones(total, dtype=bool)
    keep[at] = False
    new_data = np.empty(total, dtype=np.float64)
    new_indices = np.empty(total, dtype=indices.dtype)
    new_data[keep], new_indices[keep] = data, indices
    new_data[at], new_indices[at] = 1.0, d
    return new_data, new_indices, new_indptr


def _force_index_dtype(X, idx):
    # scipy may pick its own index dtype in the constructor; mixed int32/int64
    # index arrays make its matvec several times slower, so fix both.
    if X.indices.dtype != idx:
        X.indices = X.indices.astype(idx)
    if X.indptr.dtype != idx:
        X.indptr = X.indptr.astype(idx)


def load_local(spec, comm, *, bias=False):
    """Load this rank's block of shard files; validate them on every rank together.

    With S shard files and P ranks, rank r reads only
    ``files[r*S//P:(r+1)*S//P]``. Every rank validates its own files; then
    the ranks compare the number of features, label kind, classes, query ids
    and total row count. Any problem found on any rank is raised on every
    rank, with the same message.

    Parameters
    ----------
    spec : str, os.PathLike or sequence of them
        Shard files, as for :func:`list_shards`.
    comm : prbmrm.comm.SerialComm or prbmrm.comm.MPIComm
        Communicator; every rank must call this function.
    bias : bool, default False
        Append a constant-1 feature column.

    Returns
    -------
    LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, if any rank found a problem: no shard files, fewer
        files than ranks, a missing, truncated or corrupt file, a file of
        another format or version, inconsistent shapes, non-finite values,
        or shards that disagree with each other.
    """
    error, files, label = None, [], os.fspath(spec) if isinstance(
        spec, (str, bytes, os.PathLike)) else "shard list"
    try:
        files = list_shards(spec)
        label = _spec_label(spec, files)
        S, P = len(files), comm.size
        if S < P:
            raise InputError(f"{label}: {S} shard file{'s' if S != 1 else ''} for {P} "
                             "ranks: need at least one shard file per rank")
    except InputError as exc:
        error = exc
    comm.check(error)

    S, P, r = len(files), comm.size, comm.rank
    lo, hi = r * S // P, (r + 1) * S // P
    mine = files[lo:hi]
    metas, error = [], None
    try:
        for pos, path in enumerate(mine, start=lo):
            metas.append(_shard_meta(path, pos, files, label))
    except InputError as exc:
        error = exc
    comm.check(error)

    comm.check(_consistency_error(comm, files, metas, label))

    error = None
    try:
        X, y, qid = _read_local(metas, bias)
    except InputError as exc:
        error = exc
    comm.check(error)

    counts = comm.gather_counts(X.shape[0])
    return LocalData(X=X, y=y, qid=qid, n_features=metas[0]["d"],
                     n_examples_total=metas[0]["n_total"], label_kind=metas[0]["kind"],
                     classes=metas[0]["classes"], files=list(mine), bias=bool(bias),
                     row_offset=int(counts[:r].sum()),
                     blocks=[0] + np.cumsum([m["n"] for m in metas]).tolist())


def split_local(X, y, comm, *, qid=None, bias=False, label_kind=None, classes=None,
                source=""):
    """Keep this rank's contiguous block of in-memory data present on every rank.

    For the embedded demo data and the Python API: every rank holds the
    same full arrays and keeps the rows it would have read had the arrays
    been sharded by :func:`write_shards` into K = max(P, min(units, 64))
    files (units: rows, or queries), loaded by :func:`load_local` on P
    ranks. The K blocks do not depend on P (up to 64 ranks), so per-block
    sums are the same on any number of ranks; a rank's share is balanced
    to within one block.

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
    error, out = None, None
    try:
        X, is_sparse = _as_matrix(X, where)
        n, d = X.shape
        if n == 0:
            raise InputError(f"{where}: no rows")
        Y, kind, classes = _prepare_labels(y, n, where, label_kind=label_kind,
                                           classes=classes)
        qid = _as_qid(qid, n, where)
        costs = _row_costs(X, is_sparse, not is_sparse)
        P, r = comm.size, comm.rank
        n_units = n if qid is None else _query_starts(qid, where).size
        if P > n_units:
            _row_bounds(costs, qid, P, where, what="ranks")  # raises the error
        # Canonical blocks independent of P (as if sharded into K files),
        # whole blocks per rank as load_local assigns files.
        K = max(P, min(n_units, _SPLIT_BLOCKS))
        bounds = _row_bounds(costs, qid, K, where, what="blocks")
        first, last = r * K // P, (r + 1) * K // P
        a, b = bounds[first], bounds[last]
        if is_sparse:
            data, indices, indptr = _csr_block(X, a, b)
            idx = _index_dtype(data.size + (b - a if bias else 0), d + 1)
            data = np.array(data, dtype=np.float64)
            indices, indptr = indices.astype(idx), indptr.astype(idx)
            Xl = sp.csr_matrix((data, indices, indptr), shape=(b - a, d), copy=False)
            _check_finite_features(Xl, where, row_offset=a)
            if bias:
                data, indices, indptr = _append_bias(data, indices, indptr, b - a, d)
                Xl = sp.csr_matrix((data, indices, indptr), shape=(b - a, d + 1), copy=False)
            _force_index_dtype(Xl, idx)
        else:
            Xl = X[a:b]
            _check_finite_features(Xl, where, row_offset=a)
            Xl = (np.hstack([Xl, np.ones((b - a, 1))]) if bias
                  else np.ascontiguousarray(Xl))
        out = LocalData(X=Xl, y=np.ascontiguousarray(Y[a:b]),
                        qid=None if qid is None else qid[a:b].copy(), n_features=d,
                        n_examples_total=n, label_kind=kind, classes=classes, files=[],
                        bias=bool(bias), row_offset=a,
                        blocks=[bounds[j] - a for j in range(first, last + 1)])
    except InputError as exc:
        error = exc
    comm.check(error)
    return out
