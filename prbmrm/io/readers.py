"""Readers of input files: SVMlight/LIBSVM text (optionally compressed), ``.npz`` and CSV.

:func:`read_input` turns one file into arrays (X, y, qid) with one clear
message per problem, naming the file and line.

Imports: numpy, scipy, scikit-learn (the SVMlight parser), :mod:`prbmrm.io.arrays` and :mod:`prbmrm.io.files`.
"""

import bz2
import functools
import gzip
import io
import itertools
import lzma
import math
import os
import zipfile
import zlib

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from .files import check_memory
from .arrays import (_as_array, _as_matrix, _as_qid, check_finite, _check_indicator, _is_indicator,
    _is_number, _label_sets)

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)  # zlib.error: a damaged .gz stream

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
    except (ValueError, OverflowError) as exc:  # OverflowError: an index or qid beyond 64 or 32 bits
        raise _svmlight_error(path, exc, multilabel) from None
    except _READ_ERRORS as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{path}: empty file (no data rows)")
    line_of_row = functools.partial(_svmlight_line, path)  # error path only
    check_finite(X, path, line_of_row=line_of_row)
    if multilabel:
        y = _label_sets(y, path, line_of_row)[0]
    else:
        check_finite(y, path, "label", line_of_row=line_of_row)
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
        except OverflowError:
            return "a feature index or query id too large (feature indices must be below 2^31)"
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
    check_finite(X, path)
    check_finite(y, path, "label")
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


def _check_npz_sizes(path):
    """Refuse an ``.npz`` member whose header declares more values than it stores, or than memory holds.

    Read before :func:`numpy.load`, which allocates what a header declares before reading a
    compressed or zipped member.
    """
    declared = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in ((1, 0), (2, 0)):
                    raise InputError(f"{path}: {info.filename}: .npy format version {version} is not supported")
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(member)
                size = math.prod(shape) * dtype.itemsize
                stored = info.file_size - member.tell()
                if size > stored:
                    raise InputError(f"{path}: {info.filename} declares {shape} values of {dtype} ({size} bytes) "
                                     f"but stores {max(stored, 0)} bytes")
                declared += size
    check_memory(path, declared, "its arrays")


def _read_npz(path, multilabel, multioutput):
    try:
        _check_npz_sizes(path)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error) as exc:
        # ValueError: a malformed .npy header; NotImplementedError, RuntimeError: a compression method
        # zipfile lacks, an encrypted member
        raise InputError(f"{path}: not a readable .npz file: {' '.join(str(exc).split())[:200]}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
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
        fmt = np.asarray(arrays.get("format", "csr"))
        fmt = fmt.astype(str).item() if fmt.size == 1 and fmt.dtype.kind in "SU" else repr(fmt.tolist())
        if fmt not in ("csr", "csc"):
            raise InputError(f"{path}: sparse format {fmt!r} is not supported (csr or csc)")
        try:
            X = (sp.csr_matrix if fmt == "csr" else sp.csc_matrix)(
                (arrays["data"], arrays["indices"], arrays["indptr"]),
                shape=tuple(int(s) for s in arrays["shape"]))
            X.check_format(full_check=True)
        except (ValueError, TypeError, OverflowError) as exc:
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
        check_finite(y, path, "target")
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
        check_finite(y, path, "label")
    check_finite(X, path)
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
