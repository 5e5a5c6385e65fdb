"""The shard format: writing, listing and validating HDF5 shard files; the format's one description.

:func:`write_shards` writes a set, :func:`list_shards` finds one, and the
survey (:func:`survey_shards`) checks every file's attributes and structure and that
the files of a set agree. A package adds a layout of its own through
:func:`register_layout` (the structured examples of :mod:`prbmrm.structured.data`).

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
    the values may be stored as float32 instead (``prbmrm.cli.shard --float32``:
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

Imports: h5py, numpy, scipy, :mod:`prbmrm.io.arrays`, :mod:`prbmrm.io.files` and
:mod:`prbmrm.plugins`.
"""

import contextlib
from collections import namedtuple
import glob
import os
import re

import h5py
import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from .files import check_memory, hdf5_image, stored_problem, write_image
from ..plugins import load_builtin_plugins
from .arrays import (_as_matrix, _as_qid, check_finite, _fmt_values, _INDEX_LIMIT, LABEL_KINDS,
    _prepare_labels, _raw_negative, row_bounds, _row_costs, _rows, STRUCTURED)

FORMAT = "prbmrm-shard"
FORMAT_VERSION = 1
_SHARD_RE = re.compile(r"^part-(\d+)\.h5$")

Layout = namedtuple("Layout", "check read")
"""A shard layout of its own (:func:`register_layout`): ``check(f, meta)`` validates the datasets of
the open shard `f` and returns its metadata `meta` completed; ``read(metas, bias)`` reads the rows the
(checked) metadata of this rank's shards name, and returns them as the local X (the labels included)."""

LAYOUTS = {}
"""Shard layouts beyond the /X, /y, /qid of the label kinds :data:`LABEL_KINDS`, by label kind."""


def register_layout(kind, check, read):
    """Let shards whose ``label_kind`` attribute is `kind` hold datasets of their own.

    The hook through which a package extends the shard format (as
    :mod:`prbmrm.structured.data` does for ragged examples, label kind
    :data:`STRUCTURED`): the root attributes stay those of :func:`shard_attrs`,
    written by :func:`write_all`, and :func:`load_local` calls `check` on
    every shard and `read` on this rank's ones.

    Parameters
    ----------
    kind : str
        The ``label_kind`` attribute of such shards; not one of :data:`LABEL_KINDS`.
    check : callable
        ``check(f, meta)``: raise :class:`prbmrm.errors.InputError` naming
        ``meta["path"]`` unless the open h5py file `f` holds a valid shard;
        return `meta` (the root attributes read, as a dict) completed with
        what `read` needs (``n``, ``d``, ``labels``, ...).
    read : callable
        ``read(metas, bias)``: the local X of this rank's shards (their
        metadata as `check` returned it, possibly cut to row ranges).
    """
    if kind in LABEL_KINDS:
        raise ValueError(f"label kind {kind!r} is built in")
    LAYOUTS[kind] = Layout(check, read)


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
    parts = parts_count(parts, where, n)
    Y, label_kind, classes = _prepare_labels(y, n, where, multilabel=multilabel,
                                             multioutput=multioutput, positive=positive)
    qid = _as_qid(qid, n, where)
    check_finite(X, where)
    if float32:
        values = X.data if sp.issparse(X) else X
        if np.abs(values).max(initial=0.0) > np.finfo(np.float32).max:
            raise InputError(f"{where}: a feature value is beyond the float32 range (+-3.4e38): "
                             "store it as float64 (without --float32)")
    dense_out = not sp.issparse(X) if dense is None else bool(dense)
    bounds = row_bounds(_row_costs(X, dense_out), qid, parts, where)

    attrs = shard_attrs(n, d, parts, label_kind, source)
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

    return write_all(out_dir, parts, write, overwrite)


def parts_count(parts, where, n, unit="rows"):
    """`parts` as an int, or InputError if it is not an integer or there are no `unit` (`n` = 0) to write."""
    if n == 0:
        raise InputError(f"{where}: no {unit} to write")
    if isinstance(parts, bool) or int(parts) != parts:
        raise InputError(f"{where}: the number of parts must be an integer, got {parts!r}")
    return int(parts)


def shard_attrs(n, d, parts, label_kind, source):
    """The root attributes every shard of a set shares."""
    return dict(format=FORMAT, format_version=np.int64(FORMAT_VERSION), n_features=np.int64(d),
                n_examples_total=np.int64(n), shard_count=np.int64(parts), label_kind=label_kind,
                source=str(source))


def write_all(out_dir, parts, write, overwrite):
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
            raise InputError(f"{out_dir}: cannot write shard files: {exc.strerror or exc} (nothing written)") from None
        raise
    for stale in set(existing) - set(finals):
        os.remove(stale)
    return finals


def _write_one(path, X, dense_out, y, qid, attrs, values=np.float64):
    """Write one shard file, built in memory (a full disk or a file-size limit is then an OSError)."""
    write_image(path, hdf5_image(lambda f: _fill_shard(f, X, dense_out, y, qid, attrs, values)))


def _fill_shard(f, X, dense_out, y, qid, attrs, values):
    """Fill the open h5py file `f` with one shard's attributes and datasets."""
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


def shard_summary(path):
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


def spec_label(spec, files):
    if isinstance(spec, (str, bytes, os.PathLike)):
        return os.fspath(spec)
    dirs = {os.path.dirname(f) for f in files}
    return dirs.pop() if len(dirs) == 1 else "shard list"


@contextlib.contextmanager
def open_shard(path):
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


def _show(value):
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _scalar_attr(a, name, path, kinds, what):
    """The attribute `name` as a Python scalar of a dtype kind in `kinds`; InputError naming it otherwise."""
    value = a[name]
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in kinds:
        raise InputError(f"{path}: attribute {name} is {_show(value)}, not {what}")
    return array.reshape(()).item()


def _count_attr(a, name, path, low=0):
    value = _scalar_attr(a, name, path, "iu", "an integer")
    if value < low:
        raise InputError(f"{path}: attribute {name} is {value}, expected at least {low}")
    return int(value)


def _real_attr(a, name, path):
    value = float(_scalar_attr(a, name, path, "iuf", "a number"))
    if not np.isfinite(value):
        raise InputError(f"{path}: attribute {name} is {value}, not a finite number")
    return value


def _dataset(f, name, path, kinds, what):
    """The HDF5 dataset `name` of shard `f`, checked: a dataset, of a dtype kind in `kinds`, stored whole."""
    item = f.get(name)
    if not isinstance(item, h5py.Dataset):
        raise InputError(f"{path}: /{name} is {'missing' if item is None else 'not a dataset'}")
    if item.dtype.kind not in kinds:
        raise InputError(f"{path}: /{name} has type {item.dtype}, not {what}")
    problem = stored_problem(item)
    if problem is not None:
        raise InputError(f"{path}: /{name} {problem}")
    return item


_FLOATS = ("f", "floating-point values")
_INTEGERS = ("iu", "integers")
_NUMBERS = ("iuf", "numbers")
VECTORS_IN_MEMORY = 3
"""Vectors of n_features + 1 float64 a run holds at the least (w, a subgradient, a cutting plane):
what a shard's declared width is checked against the memory available."""


def _shard_meta(path, pos, files, label, positioned=True):
    """Open one shard, check its attributes and structure; return its metadata.

    Reads only attributes, shapes and ``indptr`` (n + 1 integers), after
    checking that each dataset's type is the format's and that the file stores
    the bytes its shape declares; the declared width is checked against the
    memory available. With `positioned` False the caller checks its place
    among `files` later (:func:`_check_position`, with the metadata's
    ``count`` and ``index``).
    """
    with open_shard(path) as f:
        a = f.attrs
        if _attr_str(a.get("format")) != FORMAT:
            got = repr(_attr_str(a["format"])) if "format" in a else "missing"
            raise InputError(f"{path}: not a prbmrm shard file (format attribute is {_show(got)})")
        version = _count_attr(a, "format_version", path) if "format_version" in a else "missing"
        if version != FORMAT_VERSION:
            raise InputError(f"{path}: shard format version {version} is not supported "
                             f"(this prbmrm reads version {FORMAT_VERSION})")
        count, index = _count_attr(a, "shard_count", path, 1), _count_attr(a, "shard_index", path)
        if positioned:
            _check_position(path, count, index, pos, files, label)
        n, d = _count_attr(a, "n_examples", path), _count_attr(a, "n_features", path)
        kind = _attr_str(a["label_kind"])
        check_memory(path, VECTORS_IN_MEMORY * 8 * (d + 1), f"n_features = {d} (the model's vectors)")
        if kind not in LABEL_KINDS and kind not in LAYOUTS:
            load_builtin_plugins()  # the structured package registers its layout
        if kind not in LABEL_KINDS and kind not in LAYOUTS:
            raise InputError(f"{path}: unknown label_kind {_show(kind)}")
        meta = dict(path=path, n=n, d=d, kind=kind, classes=None, sparse=False,
                    n_total=_count_attr(a, "n_examples_total", path), has_qid="qid" in f, nnz=0, labels="",
                    positive=_real_attr(a, "positive", path) if "positive" in a else None,
                    exact=bool(_scalar_attr(a, "exact_width", path, "biu", "a flag")) if "exact_width" in a
                    else False,
                    negative=_real_attr(a, "negative", path) if "negative" in a else None, count=count, index=index)
        if kind in LAYOUTS:
            return LAYOUTS[kind].check(f, meta)
        classes = None
        if kind != "real":
            classes = np.atleast_1d(a["classes"])
            if classes.ndim != 1 or classes.dtype.kind not in "iuf" or not np.isfinite(classes).all():
                raise InputError(f"{path}: attribute classes is {_show(classes)}, not a list of finite numbers")
            classes = classes.astype(np.float64)
        X, sparse = f.get("X"), isinstance(f.get("X"), h5py.Group)
        if sparse:
            shape = X.attrs.get("shape", ())
            shape = (tuple(int(s) for s in shape) if np.ndim(shape) == 1 and np.asarray(shape).dtype.kind in "iu"
                     else _show(shape))
        else:
            shape = _dataset(f, "X", path, *_FLOATS).shape
        if shape != (n, d):
            raise InputError(f"{path}: /X has shape {shape}, but the attributes say ({n}, {d})")
        meta.update(classes=classes, sparse=sparse)
        if sparse:
            enc = _attr_str(X.attrs.get("encoding-type"))
            if enc != "csr_matrix":
                raise InputError(f"{path}: /X has encoding-type {_show(enc)}, expected 'csr_matrix'")
            data, indices = _dataset(f, "X/data", path, *_FLOATS), _dataset(f, "X/indices", path, *_INTEGERS)
            indptr = _dataset(f, "X/indptr", path, *_INTEGERS)
            nnz = data.shape[0] if data.ndim == 1 else -1
            indptr = indptr[()].astype(np.int64) if indptr.shape == (n + 1,) else None
            if (nnz < 0 or indices.shape != (nnz,) or indptr is None or indptr[0] != 0 or indptr[-1] != nnz
                    or np.any(np.diff(indptr) < 0)):
                raise InputError(f"{path}: /X/data, /X/indices and /X/indptr do not make a "
                                 f"CSR matrix of {n} rows")
            meta.update(nnz=nnz, indptr=indptr)
        want = (n, classes.size) if kind in ("multilabel", "multioutput") else (n,)
        y = _dataset(f, "y", path, *_NUMBERS)
        if y.shape != want:
            raise InputError(f"{path}: /y has shape {y.shape}, expected {want}")
        if meta["has_qid"] and _dataset(f, "qid", path, *_INTEGERS).shape != (n,):
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


def survey_shards(files, label):
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
