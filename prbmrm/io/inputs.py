"""Any input a user names, loaded with its label mapping: shard sets, or text files read in memory.

``train --data`` and ``predict --data`` take a shard directory, file or glob,
or an SVMlight/LIBSVM, ``.npz`` or ``.csv`` file; a text file is read by every
rank, which keeps its own block of rows (:func:`prbmrm.io.split_local`).
The label mapping of ``shard --positive`` is applied the same way to both, and
:func:`check_for_model` compares data with the mapping and width a model was
trained with.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.io`.
"""

import glob
import os

import numpy as np

from . import load_local, negative_label, read_input, split_local
from ..errors import CollectiveError, InputError

__all__ = ["is_shard_spec", "load_input", "check_for_model", "describe_mapping"]


def is_shard_spec(spec):
    """True if `spec` names shards (a directory, ``*.h5`` files, a glob or a list), not a text file."""
    if isinstance(spec, (list, tuple)):
        return True
    spec = os.fspath(spec)
    return os.path.isdir(spec) or spec.endswith(".h5") or glob.has_magic(spec)


def load_input(spec, comm, *, bias=False, positive=None, label_column=0, n_features=None,
               label_kind=None, notes=None):
    """Return this rank's rows of `spec`, labels mapped one-vs-rest if `positive` is given (collective).

    Parameters
    ----------
    spec : str, os.PathLike or list of them
        Shards (as for :func:`prbmrm.io.load_local`) or one text file (as
        for :func:`prbmrm.io.read_input`).
    comm : prbmrm.distributed.comm.SerialComm or MPIComm
    bias : bool, default False
        Append a constant-1 feature column.
    positive : float, optional
        The label mapped to +1, every other to -1. Shards written with
        ``--positive`` keep theirs; another value is an error.
    label_column : int, str or list, default 0
        CSV input: the label column (number or header name).
    n_features : int, optional
        SVMlight input: parse to this width (a model's). CSV and ``.npz``
        input keep their own width, for :func:`check_for_model` to compare.
    label_kind : str, optional
        Text input: ``"multilabel"`` reads label sets, ``"multioutput"`` a
        2-D ``y`` as real targets.
    notes : list, optional
        Receives the lines to show the user about the input (a CSV's header
        and label column).

    Returns
    -------
    prbmrm.io.LocalData

    Raises
    ------
    prbmrm.errors.CollectiveError
        On every rank, naming the file, for any problem with the input.
    """
    if is_shard_spec(spec):
        local = load_local(spec, comm, bias=bias)
        return map_one_vs_rest(local, positive, spec, comm)
    info, error, arrays = {}, None, None
    try:
        arrays = read_input(spec, multilabel=label_kind == "multilabel",
                            multioutput=label_kind == "multioutput",
                            n_features=n_features if _is_svmlight(spec) else None,
                            label_column=label_column, info=info)
    except InputError as problem:
        error = problem
    comm.check(error)
    if notes is not None:
        notes.extend(info["notes"])
    X, y, qid = arrays
    two_d = label_kind if label_kind in ("multilabel", "multioutput") else None
    return split_local(X, y, comm, qid=qid, bias=bias, source=os.fspath(spec), label_kind=two_d,
                       positive=positive, exact_width=info["exact_width"])


def _is_svmlight(path):
    """True if the text file `path` is read as SVMlight (not ``.npz`` or ``.csv``, possibly compressed)."""
    name = os.fspath(path).lower()
    for suffix in (".gz", ".bz2", ".xz"):
        name = name.removesuffix(suffix)
    return not name.endswith((".npz", ".csv"))


def map_one_vs_rest(local, positive, spec, comm):
    """Apply the one-vs-rest mapping `positive` to data loaded without one (in place; collective facts)."""
    if positive is None or local.positive == positive:
        return local
    where = os.fspath(spec) if not isinstance(spec, (list, tuple)) else "shard list"
    if local.positive is not None:
        raise CollectiveError(f"{where}: the shards were mapped with --positive {local.positive:g}, "
                              f"not {positive:g}")
    if local.label_kind != "binary" and local.label_kind != "integer" or positive not in local.classes:
        shown = "real values" if local.classes is None else ", ".join(f"{c:g}" for c in local.classes)
        raise CollectiveError(f"{where}: the positive label {positive:g} does not occur in the data "
                              f"(labels: {shown})")
    local.y = np.where(local.y == positive, 1.0, -1.0)
    local.negative = negative_label(local.classes, positive)
    local.label_kind, local.classes, local.positive = "binary", np.array([-1.0, 1.0]), float(positive)
    return local


def check_for_model(local, attrs, where, model_path):
    """Raise CollectiveError unless `local`'s labels and width suit the model (attributes `attrs`).

    The same global facts reach every rank, so every rank raises alike.
    The width must equal the model's, except that SVMlight input (whose
    width is only its largest feature index) may be narrower.
    """
    d = int(attrs["n_features"]) if "n_features" in attrs else None
    if d is not None and (local.n_features > d or local.n_features < d and local.exact_width):
        raise CollectiveError(f"{where}: the data has {local.n_features} features, the model {model_path} "
                              f"was trained on {d}")
    classes = attrs.get("classes")
    if attrs.get("label_kind") not in ("binary", "integer") or classes is None:
        return
    if local.label_kind not in ("binary", "integer"):
        raise CollectiveError(f"{where}: the data has {local.label_kind} labels, the model {model_path} "
                              f"was trained on class labels")
    unknown = np.setdiff1d(local.classes, classes)
    if unknown.size:
        positive = attrs.get("positive")
        hint = (f"the model maps label {positive:g} to +1 and the rest to -1" if positive is not None
                else "if the model is one class against the rest, give --positive LABEL")
        raise CollectiveError(f"{where}: label {unknown[0]:g} is not one of the model's labels "
                              f"({', '.join(f'{c:g}' for c in np.atleast_1d(classes))}); {hint}")


def describe_mapping(local):
    """One line about the label mapping applied to `local`, or None."""
    if local.positive is None:
        return None
    return f"labels mapped one-vs-rest: positive label {local.positive:g} -> +1, every other label -> -1"
