"""Model files: HDF5 with ``/w``, the training summary as attributes and ``/history``.

Written atomically (:func:`prbmrm.io.files.write_hdf5`: built in memory, written
to a temporary file in the same directory, fsync, rename), so a failed or
interrupted run never leaves a partial model behind, and a full disk is one
clear error.

Imports: h5py, numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.io.files`, :mod:`prbmrm.losses`.
"""

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass

import h5py
import numpy as np

from .errors import InputError, UsageError
from .io.files import stored_problem, temporary_name, write_hdf5

MODEL_FORMAT = "prbmrm-model"

PROBABILISTIC = ("logistic", "softmax")
"""The losses that are negative log-likelihoods: their models give :meth:`Model.predict_proba`."""


@dataclass
class Model:
    """A trained model: returned by :func:`prbmrm.fit`, read by :func:`prbmrm.load`.

    It carries the label mapping it was trained with (attributes
    ``label_kind``, ``classes``, ``positive``, ``negative``, ``n_features``, ``has_bias``,
    ``loss``): :meth:`predict` answers in the training data's own labels and
    :meth:`score` maps raw labels the same way. Models written before the
    mapping was recorded (no ``positive`` attribute) load as models of
    unmapped labels.

    Attributes
    ----------
    w : ndarray
        Weights, shape (d,) (or (d, k) for multi-output losses).
    bias : float or ndarray
        The learned offset, one per output (0 when trained without ``--bias``).
    attrs : dict
        Every attribute of the file: objective, lower_bound, gap, iterations,
        lam, loss, options, version, ...
    history : dict of str to ndarray
        The progress table, one array per column.
    path : dict of str to ndarray or None
        The group ``/path`` of a lambda path's model: ``lam`` (n,), ``w``
        (n, d[, k]), ``bias``, ``objective``, ``lower_bound``, ``gap``,
        ``iterations``, ``status``; None for a single lambda.
    result : prbmrm.solvers.Result or None
        The solver's result on rank 0 of the run that made the model (its
        bundle warm-starts another run, see :func:`prbmrm.fit`); None
        elsewhere and in a model read from a file (not saved).
    """

    w: np.ndarray
    bias: object
    attrs: dict
    history: dict
    path: dict = None
    result: object = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self):
        a = self.attrs
        shown = [f"{key}={a[key]!r}" for key in ("loss", "reg", "solver") if key in a]
        shown += [f"{key}={a[key]:.6g}" for key in ("lam", "objective", "gap") if key in a]
        shown += [f"{key}={a[key]!r}" for key in ("iterations", "n_features", "has_bias") if key in a]
        if self.path is not None:
            shown.append(f"path of {len(self.path['lam'])} lambdas")
        return f"Model({', '.join(shown)})"

    @classmethod
    def broadcast(cls, model, comm):
        """Return rank 0's `model` on every rank of `comm` (collective; its `result` stays on rank 0)."""
        if comm.size == 1:
            return model
        parts = comm.bcast_object({"attrs": model.attrs, "history": model.history, "path": model.path,
                                   "bias": np.asarray(model.bias), "shape": list(model.w.shape)}
                                  if comm.is_root else None)
        w = comm.bcast_array(np.ascontiguousarray(model.w, dtype=np.float64) if comm.is_root
                             else np.empty(parts["shape"]))
        if comm.is_root:
            return model
        bias = parts["bias"]
        return cls(w=w, bias=bias.item() if bias.ndim == 0 else bias, attrs=parts["attrs"],
                   history=parts["history"], path=parts["path"])

    @property
    def classes_(self):
        """ndarray: the labels of a classifier in the training data's own values, in the order of
        the columns of :meth:`predict_proba` (two classes: the label of -1, then that of +1); None
        for a model of scores."""
        classes = self.attrs.get("classes")
        if classes is None or not self.loss().predicts_labels:
            return None
        if self.attrs.get("positive") is None:
            return np.atleast_1d(np.asarray(classes, dtype=np.float64))
        return np.array([self.attrs.get("negative", -1.0), self.attrs["positive"]], dtype=np.float64)

    def decision_function(self, X):
        """Return the scores ``X @ w + bias`` of the rows of `X`.

        Raises
        ------
        UsageError
            If `X` does not have the model's number of features.
        """
        X = X if hasattr(X, "shape") else np.asarray(X, dtype=np.float64)
        if X.shape[1] != self.w.shape[0]:
            raise UsageError(f"X has {X.shape[1]} features, the model was trained on {self.w.shape[0]}")
        return np.asarray(X @ self.w) + self.bias

    def loss(self):
        """Return the model's loss, prepared for its training labels."""
        from .losses import get_loss

        loss = get_loss(self.attrs["loss"], **json.loads(self.attrs.get("loss_params", "{}")))
        loss.prepare(self.attrs.get("classes"), self.attrs.get("label_kind"))
        return loss

    def predict(self, X):
        """Return the labels predicted for the rows of `X`, in the training data's own labels.

        A model trained one-vs-rest (``positive``) on data with two labels
        answers with those two (e.g. 0 and 1); on data with more, with
        ``positive`` and -1 for "another label".

        Raises
        ------
        UsageError
            If the loss predicts scores, not labels.
        """
        return self.labels(self.decision_function(X))

    def labels(self, scores):
        """Return the labels the scores `scores` (of :meth:`decision_function`) predict, in the
        training data's own labels (see :meth:`predict`).

        Raises
        ------
        UsageError
            If the loss predicts scores, not labels.
        """
        loss = self.loss()
        if not loss.predicts_labels:
            raise UsageError(f"loss {loss.name!r} predicts scores, not labels: use decision_function")
        labels = loss.predict_labels(scores)
        positive = self.attrs.get("positive")
        if positive is None:
            return labels
        return np.where(labels > 0, positive, self.attrs.get("negative", -1.0))

    def predict_proba(self, X):
        """Return the class probabilities of the rows of `X`, shape (n_samples, n_classes).

        For the losses that are negative log-likelihoods (:data:`PROBABILISTIC`):
        ``logistic`` gives ``[1 - sigmoid(f), sigmoid(f)]`` (the columns of
        :attr:`classes_`: the label of -1, then that of +1), ``softmax`` the
        softmax of the scores over the classes. Each row sums to 1.

        Raises
        ------
        UsageError
            For a model of another loss (its scores are no log-odds).
        """
        return np.exp(self.predict_log_proba(X))

    def predict_log_proba(self, X):
        """Return the logarithm of :meth:`predict_proba` (computed without overflow)."""
        from scipy.special import log_softmax

        if self.attrs.get("loss") not in PROBABILISTIC:
            raise UsageError(f"loss {self.attrs.get('loss')!r} gives no probabilities (those that do: "
                             f"{', '.join(PROBABILISTIC)}): use decision_function")
        scores = self.decision_function(X)
        if scores.ndim == 1:  # P(+1) = sigmoid(f) = softmax([0, f])[1]
            scores = np.column_stack([np.zeros_like(scores), scores])
        return log_softmax(scores, axis=1)

    def score(self, X, y):
        """Return the accuracy on (`X`, `y`) for classification, R^2 for regression.

        `y` holds raw labels, mapped as in training (``positive``).
        """
        y = np.asarray(y, dtype=np.float64)
        if self.loss().task == "classification":
            return float(np.mean(self.predict(X) == y))
        residual = np.sum((y - self.decision_function(X)) ** 2)
        return float(1.0 - residual / np.sum((y - y.mean(axis=0)) ** 2))

    def save(self, path):
        """Write the model to the HDF5 file `path` atomically (see :func:`save_model`)."""
        save_model(path, self.w, self.bias, self.attrs, self.history,
                   None if self.path is None else {"path": self.path})

    def at_lam(self, lam):
        """Return the model of the path's lambda `lam` (equal to 1e-9 relative).

        Raises
        ------
        UsageError
            If the model holds no path or `lam` is not on it (the message
            lists the path's lambdas).
        """
        lams = self.path["lam"] if self.path is not None else np.array([self.attrs["lam"]])
        index = np.flatnonzero(np.isclose(lams, lam, rtol=1e-9, atol=0.0))
        if index.size == 0:
            raise UsageError(f"--lam {lam:g}: the model's lambdas are {', '.join(f'{v:g}' for v in lams)}")
        if self.path is None:
            return self
        i = int(index[0])
        return dataclasses.replace(self, w=self.path["w"][i], bias=self.path["bias"][i])


def check_writable(path):
    """Raise InputError unless a file can be created next to `path`.

    Called once before training, so a run never spends hours only to fail
    when it writes its model.
    """
    probe = temporary_name(path)
    try:
        open(probe, "wb").close()
        os.remove(probe)
    except OSError as error:
        raise InputError(f"{path}: output path not writable: {error.strerror or error}") from None
    if os.path.isdir(path):
        raise InputError(f"{path}: output path is a directory; give a file name such as model.h5")


def save_model(path, w, bias, attrs, history, groups=None):
    """Write a model file atomically.

    Parameters
    ----------
    path : str
        The model file to create or replace.
    w : ndarray
        Weights without the bias, shape (d,) or (d, k).
    bias : float or ndarray of shape (k,)
    attrs : dict
        Scalars and strings stored as root attributes; dicts and lists are
        stored as JSON text.
    history : dict of str to array_like
        Stored as one dataset per key under ``/history``.
    groups : dict of str to dict of str to array_like, optional
        More groups of datasets, e.g. ``{"path": {...}}`` for a lambda path.

    Raises
    ------
    InputError
        If the file cannot be written (disk full, quota): nothing is left behind.
    """
    def fill(f):
        f.attrs["bias"] = np.asarray(bias, dtype=np.float64)
        for key, value in attrs.items():
            if value is None:
                continue
            f.attrs[key] = json.dumps(value) if isinstance(value, (dict, list, tuple)) else value
        f.create_dataset("w", data=np.asarray(w, dtype=np.float64))
        for name, datasets in {"history": history, **(groups or {})}.items():
            group = f.create_group(name)
            for key, values in datasets.items():
                group.create_dataset(key, data=np.asarray(values))

    write_hdf5(path, MODEL_FORMAT, fill, "model file")


def load_model(path):
    """Read a model file written by :func:`save_model`.

    Raises
    ------
    InputError
        If the file is missing, unreadable or not a prbmrm model.
    """
    with read_checked(path, MODEL_FORMAT, "model file") as f:
        w = read_numbers(f, "w", path, "model file", (1, 2), floats=True, finite=True)
        attrs = {key: _plain(value) for key, value in f.attrs.items()}
        _check_attrs(attrs, path, w)
        history = _read_group(f, "history", path)
        lam_path = _read_group(f, "path", path) if "path" in f else None
        return Model(w=w, bias=attrs["bias"], attrs=attrs, history=history, path=lam_path)


def read_numbers(f, name, path, what, ndims, floats=False, finite=False):
    """Read the dataset `name` of the open HDF5 file `f`: numbers stored whole, of one of `ndims` dimensions.

    Checked before anything is read: the dataset's type (floating point if
    `floats`), its dimensions and that the file stores the bytes its shape
    declares (:func:`prbmrm.io.files.stored_problem`); then, if `finite`,
    that the values are finite.

    Raises
    ------
    InputError
        Naming `path`, `what` and the dataset.
    """
    item, name = f.get(name), name.lstrip("/")
    if not isinstance(item, h5py.Dataset):
        raise InputError(f"{path}: the {what} has no dataset /{name}" if item is None
                         else f"{path}: /{name} of the {what} is not a dataset")
    problem = stored_problem(item)
    if problem is None and floats and item.dtype.kind != "f":
        problem = f"has type {item.dtype}, not floating point"
    if problem is None and item.ndim not in ndims:
        problem = f"has {item.ndim} dimensions, expected {' or '.join(map(str, ndims))}"
    if problem is not None:
        raise InputError(f"{path}: /{name} of the {what} {problem}")
    values = item[()]
    if finite and not np.isfinite(values).all():
        raise InputError(f"{path}: /{name} of the {what} holds non-finite values")
    return values


def _read_group(f, name, path):
    group = f.get(name, {})
    if not isinstance(group, (h5py.Group, dict)):
        raise InputError(f"{path}: /{name} of the model file is not a group")
    return {key: read_numbers(f, f"{name}/{key}", path, "model file", (1, 2, 3)) for key in group}


# The model's attributes that methods read, and what each must be.
_TEXT = ("loss", "label_kind", "loss_params")
_REALS = ("positive", "negative", "lam")


def _check_attrs(attrs, path, w):
    """Check the types of the attributes the :class:`Model` methods read (InputError naming `path`)."""
    def refuse(key, what):
        raise InputError(f"{path}: the model file's attribute {key} is {str(attrs[key])[:40]!r}, not {what}")

    if "bias" not in attrs:
        raise InputError(f"{path}: the model file has no attribute bias")
    bias = np.asarray(attrs["bias"])
    if bias.dtype.kind not in "iuf" or bias.shape not in ((), w.shape[1:]) or not np.isfinite(bias).all():
        refuse("bias", f"finite numbers of shape {w.shape[1:]}")
    for key in _TEXT:
        if key in attrs and not isinstance(attrs[key], str):
            refuse(key, "text")
    if "loss_params" in attrs:
        try:
            if not isinstance(json.loads(attrs["loss_params"]), dict):
                raise ValueError
        except (ValueError, RecursionError):
            refuse("loss_params", "a JSON object")
    for key in _REALS:
        if key in attrs and not (isinstance(attrs[key], (int, float)) and np.isfinite(attrs[key])):
            refuse(key, "a finite number")
    if "classes" in attrs:
        classes = np.asarray(attrs["classes"])
        if classes.ndim > 1 or classes.dtype.kind not in "iuf" or not np.isfinite(classes).all():
            refuse("classes", "a list of finite numbers")


@contextlib.contextmanager
def read_checked(path, file_format, what):
    """Open the HDF5 file `path` for reading if its ``format`` attribute is `file_format`.

    Raises
    ------
    InputError
        Naming `path` and `what` if the file is missing, unreadable or of another format.
    """
    try:
        with h5py.File(path, "r") as f:
            found = f.attrs.get("format")
            if not isinstance(found, str) or found != file_format:
                raise InputError(f"{path}: not a prbmrm {what}")
            yield f
    except OSError as error:
        raise InputError(f"{path}: cannot read {what}: {error}") from None


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value
