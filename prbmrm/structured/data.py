"""Structured examples in shards: ragged x and y with offsets, HDF5 files that never split an example.

Shard file format (ragged layout)
---------------------------------
The root attributes of :mod:`prbmrm.io.shards`' shards (``format`` =
``"prbmrm-shard"``, ``format_version``, ``n_features``, ``n_examples``,
``n_examples_total``, ``shard_index``, ``shard_count``, ``source``) with
``label_kind`` = ``"structured"``, which marks the ragged layout, and no
``classes``; optionally ``model``, the name of the structured model the data
was written for (informational). Datasets:

``/x_values``
    float64 (parts, n_features): the parts of the shard's examples (sequence
    positions, points), stacked.
``/x_offsets``
    int64 (n + 1,): example i is ``x_values[x_offsets[i]:x_offsets[i+1]]``;
    from 0, non-decreasing, ending at the number of parts.
``/y_values``, ``/y_offsets``
    The labels' parts (any numeric type, first axis ragged) and their offsets, alike.

:func:`prbmrm.io.load_local` reads them (this module registers the layout
with :func:`prbmrm.io.register_layout`) into a :class:`RaggedExamples`;
``python -m prbmrm.cli.shard`` converts an ``.npz`` file with the four arrays.

Imports: h5py, numpy, :mod:`prbmrm.io` (its public hook) and :mod:`prbmrm.structured.base`.
"""

import numpy as np

from ..errors import InputError
from ..io.files import hdf5_image, write_image
from ..io import (STRUCTURED, LocalData, check_finite, collectively, open_shard, parts_count,
                   rank_blocks, register_layout, row_bounds, shard_attrs, write_all)
from .base import RaggedExamples

_UNIT = ("example", "examples")  # what messages call the units a shard holds
RAGGED = ("x_values", "x_offsets", "y_values", "y_offsets")
"""The datasets of a ragged shard, and the arrays of a structured ``.npz`` input."""


def check_examples(examples, where):
    """Return `examples` (a RaggedExamples, or a tuple of its four arrays) checked, or raise InputError.

    Offsets must start at 0, not decrease and end at the number of parts;
    x must be finite and its values 2-D, the labels numeric.
    """
    if not isinstance(examples, RaggedExamples):
        try:
            examples = RaggedExamples(*examples)
        except (TypeError, ValueError) as error:
            raise InputError(f"{where}: not ragged examples (x_values, x_offsets, y_values, y_offsets): "
                             f"{error}") from None
    for name in ("x", "y"):
        values, offsets = getattr(examples, f"{name}_values"), getattr(examples, f"{name}_offsets")
        _check_offsets(offsets, len(values), where, name)
    if not (np.issubdtype(examples.y_values.dtype, np.number) or examples.y_values.dtype == bool):
        raise InputError(f"{where}: y_values must be numeric, got {examples.y_values.dtype}")
    check_finite(examples.x_values, where, indptr=examples.x_offsets)
    if np.issubdtype(examples.y_values.dtype, np.floating):
        check_finite(examples.y_values.reshape(len(examples.y_values), -1), where, "label",
                           indptr=examples.y_offsets)
    return examples


def _check_offsets(offsets, n_values, where, name):
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) \
            or offsets[-1] != n_values:
        raise InputError(f"{where}: {name}_offsets must run from 0 without decreasing to the "
                         f"{n_values} parts of {name}_values")


def _costs(examples):
    """Cost of each example: its x values, its label parts, + 1."""
    return (np.diff(examples.x_offsets) * examples.shape[1] + np.diff(examples.y_offsets) + 1).astype(np.int64)


def write_structured_shards(examples, out_dir, parts, *, source="", model=None, overwrite=False):
    """Split ragged examples into `parts` HDF5 shard files of whole, consecutive examples.

    The shards are balanced by size (x values + label parts + 1 per example).

    Parameters
    ----------
    examples : RaggedExamples or tuple
        The examples, or their arrays ``(x_values, x_offsets, y_values, y_offsets)``.
    out_dir : str or os.PathLike
        Output directory, created if needed; receives ``part-00000.h5``, ...
    parts : int
        Number of shard files, at most the number of examples.
    source : str, optional
        Where the data came from (the ``source`` attribute; used in messages).
    model : str, optional
        Name of the structured model the data is for (the ``model`` attribute).
    overwrite : bool, default False
        Replace existing shard files in `out_dir` instead of refusing.

    Returns
    -------
    list of str
        The shard files, ``out_dir/part-00000.h5`` first.

    Raises
    ------
    InputError
        On inconsistent offsets, non-finite x, more parts than examples,
        shard files already in `out_dir` (unless `overwrite`), or a failure
        to write, after which no shard is left.
    """
    where = source or "input examples"
    examples = check_examples(examples, where)
    n, d = examples.shape
    parts = parts_count(parts, where, n, "examples")
    bounds = row_bounds(_costs(examples), None, parts, where, unit=_UNIT)
    attrs = dict(shard_attrs(n, d, parts, STRUCTURED, source), **({} if model is None else {"model": str(model)}))

    def write(i, path):
        block = examples[bounds[i]:bounds[i + 1]]

        def fill(f):
            f.attrs.update(dict(attrs, n_examples=np.int64(len(block)), shard_index=np.int64(i)))
            for name in RAGGED:
                f.create_dataset(name, data=getattr(block, name))

        write_image(path, hdf5_image(fill))  # built in memory: a full disk is an OSError, not a crash

    return write_all(out_dir, parts, write, overwrite)


def shard_meta(f, meta):
    """Check the ragged datasets of the open shard `f`; return `meta` with their sizes.

    Reads only shapes and the offsets (2 (n + 1) integers).
    """
    path, n, d = meta["path"], meta["n"], meta["d"]
    missing = [name for name in RAGGED if name not in f]
    if missing:
        raise InputError(f"{path}: structured shard without /{missing[0]}")
    x_values, y_values = f["x_values"], f["y_values"]
    if x_values.ndim != 2 or x_values.shape[1] != d:
        raise InputError(f"{path}: /x_values has shape {x_values.shape}, expected (parts, {d})")
    if y_values.ndim < 1 or not np.issubdtype(y_values.dtype, np.number):
        raise InputError(f"{path}: /y_values must be a numeric array of at least 1 dimension")
    for name, values in (("x", x_values), ("y", y_values)):
        offsets = f[f"{name}_offsets"][()]
        if offsets.shape != (n + 1,) or not np.issubdtype(offsets.dtype, np.integer):
            raise InputError(f"{path}: /{name}_offsets has shape {offsets.shape}, expected ({n + 1},) integers")
        _check_offsets(offsets, values.shape[0], path, name)
        meta[f"{name}_offsets"] = offsets.astype(np.int64)
    meta.update(labels=f"{y_values.dtype.kind}{y_values.shape[1:]}", y_dtype=y_values.dtype,
                y_tail=y_values.shape[1:])
    return meta


def read_local(metas):
    """Read this rank's checked ragged shards into one RaggedExamples (preallocated) and validate x."""
    d, first = metas[0]["d"], metas[0]
    x_total = sum(int(m["x_offsets"][-1]) for m in metas)
    y_total = sum(int(m["y_offsets"][-1]) for m in metas)
    x_values = np.empty((x_total, d))
    y_values = np.empty((y_total, *first["y_tail"]), dtype=first["y_dtype"])
    x_offsets, y_offsets = [np.zeros(1, dtype=np.int64)], [np.zeros(1, dtype=np.int64)]
    x_at = y_at = 0
    for m in metas:
        x_parts, y_parts = int(m["x_offsets"][-1]), int(m["y_offsets"][-1])
        with open_shard(m["path"]) as f:
            if x_parts and d:
                f["x_values"].read_direct(x_values, dest_sel=np.s_[x_at:x_at + x_parts])
            if y_parts:
                f["y_values"].read_direct(y_values, dest_sel=np.s_[y_at:y_at + y_parts])
        check_finite(x_values[x_at:x_at + x_parts], m["path"], indptr=m["x_offsets"])
        x_offsets.append(m["x_offsets"][1:] + x_at)
        y_offsets.append(m["y_offsets"][1:] + y_at)
        x_at, y_at = x_at + x_parts, y_at + y_parts
    return RaggedExamples(x_values, np.concatenate(x_offsets), y_values, np.concatenate(y_offsets))


def split_examples(examples, comm, *, source=""):
    """Keep this rank's canonical blocks of ragged examples present on every rank.

    As :func:`prbmrm.io.split_local` does for matrices: the examples are cut
    as if sharded into K = max(P, min(n, 64, max(8, c / 2**14))) files (c: the
    x values, label parts and examples), so results do not depend on the
    number of ranks P up to K.

    Parameters
    ----------
    examples : RaggedExamples or tuple of its four arrays
    comm : prbmrm.distributed.comm.SerialComm or prbmrm.distributed.comm.MPIComm
    source : str, optional
        Name of the data, used in messages.

    Returns
    -------
    prbmrm.io.LocalData
        ``X`` holds this rank's examples (views), ``y`` is None, ``label_kind``
        is ``"structured"``.
    """
    where = source or "input examples"

    def keep_mine():
        checked = check_examples(examples, where)
        n, d = checked.shape
        if n == 0:
            raise InputError(f"{where}: no examples")
        blocks = rank_blocks(_costs(checked), None, comm, where, unit=_UNIT)
        a = blocks[0]
        return LocalData(X=checked[a:blocks[-1]], y=None, qid=None, n_features=d, n_examples_total=n,
                              label_kind=STRUCTURED, classes=None, row_offset=a, blocks=[j - a for j in blocks])

    return collectively(comm, keep_mine)


def read_npz(path):
    """Read ragged examples from an ``.npz`` file with the arrays of :data:`RAGGED`, checked.

    Raises
    ------
    InputError
        If the file cannot be read, lacks an array, or the arrays are inconsistent.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [name for name in RAGGED if name not in z.files]
            if missing:
                raise InputError(f"{path}: structured .npz input without the array {missing[0]!r} "
                                 f"(it holds {', '.join(RAGGED)})")
            arrays = [z[name] for name in RAGGED]
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npz file of numeric arrays: {error}") from None
    return check_examples(tuple(arrays), path)


def is_structured_npz(path):
    """Return True if `path` is an ``.npz`` file holding ``x_values`` (ragged examples)."""
    if not str(path).lower().endswith(".npz"):
        return False
    try:
        with np.load(path, allow_pickle=False) as z:
            return "x_values" in z.files
    except (OSError, ValueError, EOFError):
        return False  # the reader of matrices reports what is wrong with it


def _read_layout(metas, bias):
    """:func:`read_local`, for the loader: refuses a bias column, which ragged examples have no place for."""
    if bias:
        raise InputError(f"{metas[0]['path']}: --bias (bias=True) does not apply to structured "
                         "examples: give the joint feature map a constant feature instead")
    return read_local(metas)


register_layout(STRUCTURED, shard_meta, _read_layout)
