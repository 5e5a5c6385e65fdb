"""Checkpoint and resume: a solver's full state in an HDF5 file, written atomically by rank 0.

A solver that supports checkpoints takes two keywords (see
:func:`prbmrm.solvers.bmrm.minimize_bmrm`)::

    state : dict or None          # resume from this state instead of w0
    checkpoint : callable or None # checkpoint(t, snapshot) after iteration t; True stops the solver

``snapshot()`` returns the state as a dict of arrays and scalars (nested dicts
allowed) holding everything the next iteration depends on, so a resumed run
takes exactly the path of the uninterrupted one. The file also holds the run's
options and a fingerprint of the data; :func:`checkpointing` refuses to resume
from a file whose options or data differ.

Files are written as model files are (:func:`prbmrm.io.files.write_hdf5`): built
in memory, written to ``.NAME.tmp-PID`` in the same directory, fsync'ed and
renamed over NAME, so a crash while writing leaves the previous checkpoint
intact, and a full disk or quota is one clear error that removes the temporary.

Imports: h5py, numpy, scipy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.io.files`,
:mod:`prbmrm.model`, :mod:`prbmrm.solvers.base`, :mod:`prbmrm.solvers.bundle`.
"""

import hashlib
import hmac
import itertools
import json
import math
import numbers
import os
import signal

import h5py
import numpy as np
import scipy.sparse as sp

from .errors import InputError, UsageError
from .io.files import private_problem, write_hdf5
from .model import read_checked, read_numbers
from .solvers.base import HISTORY_COLUMNS
from .solvers.bundle import Bundle

CHECKPOINT_FORMAT = "prbmrm-checkpoint"

TAG = "hmac_sha256"
"""The root attribute of an authenticated checkpoint: HMAC-SHA256 (hex) of :func:`canonical_items`."""

KEY_VARIABLE = "PRBMRM_CHECKPOINT_KEY"
"""The environment variable that names the checkpoint key file when ``--checkpoint-key`` is not given."""

MIN_KEY_BYTES = 16

RESUME_OPTIONS = ("loss", "loss_params", "lam", "reg", "reg_params", "solver", "solver_params", "bias",
                  "idle_age", "bundle_size")
"""Options a resumed run must share with the checkpoint (the stopping tests and --max-iter may change)."""


def save_checkpoint(path, state, meta, key=None):
    """Write `state` and `meta` to `path` atomically (authenticated if a `key` is given).

    Parameters
    ----------
    path : str
    state : dict
        Arrays and scalars (nested dicts become HDF5 groups) under ``/state``.
    meta : dict
        JSON-serializable values, stored as root attributes (JSON text).
    key : bytes, optional
        The checkpoint key (:func:`read_key`): the file gets the attribute
        :data:`TAG`, the HMAC-SHA256 of every dataset and attribute.

    Raises
    ------
    InputError
        If the file cannot be written (disk full, quota): the previous
        checkpoint stays as it was and no temporary file is left.
    """
    def fill(f):
        for name, value in meta.items():
            f.attrs[name] = json.dumps(value)
        _write_group(f.create_group("state"), state)
        if key is not None:
            f.attrs[TAG] = authentication_tag(f, key, path)

    write_hdf5(path, CHECKPOINT_FORMAT, fill, "checkpoint")


def read_key(path):
    """Return the checkpoint key held in the file `path` (its bytes, at least 16).

    Like a party's signing key, the file must be private to its owner.

    Raises
    ------
    InputError
        If it cannot be read, is not private, or is too short.
    """
    try:
        with open(path, "rb") as f:
            problem = private_problem(os.fstat(f.fileno()))
            key = b"" if problem else f.read(4096)
    except OSError as error:
        raise InputError(f"{path}: cannot read the checkpoint key ({error.strerror})") from None
    if problem:
        raise InputError(f"{path}: the checkpoint key {problem}: it must be private to its owner (chmod 600 {path})")
    if len(key.strip()) < MIN_KEY_BYTES:
        raise InputError(f"{path}: the checkpoint key must hold at least {MIN_KEY_BYTES} bytes (e.g. "
                         f"head -c 32 /dev/urandom > {os.path.basename(path)}), found {len(key.strip())}")
    return key.strip()


def _part(data):
    return len(data).to_bytes(8, "little") + data


def canonical_items(f, path):
    """Yield the canonical serialization of the open HDF5 file `f`, one byte string per item.

    Every group, dataset and attribute but :data:`TAG`, in sorted order: its
    kind, full name, and value (an attribute's text, or its dtype, shape and
    bytes; a dataset's dtype, shape and bytes), each part length-prefixed so
    that no two files serialize alike. Only hard links are followed.

    Raises
    ------
    InputError
        Naming `path`, if it holds anything else (a soft or external link, a
        named type) or a dataset that does not store what it declares.
    """
    def value(v):
        if isinstance(v, str):
            return _part(b"text") + _part(v.encode("utf-8", "surrogatepass"))
        if isinstance(v, bytes):
            return _part(b"bytes") + _part(v)
        array = np.asarray(v)
        if array.dtype.kind not in "biuf":
            raise InputError(f"{path}: an attribute of type {array.dtype} is not part of a checkpoint")
        return _part(array.dtype.str.encode()) + _part(repr(array.shape).encode()) + _part(array.tobytes())

    def walk(group):
        for name in sorted(group.attrs):
            if group.name == "/" and name == TAG:
                continue
            yield _part(b"attribute") + _part(group.name.encode()) + _part(name.encode()) + value(group.attrs[name])
        for name in sorted(group):
            full = f"{group.name.rstrip('/')}/{name}"
            if not isinstance(group.get(name, getlink=True), h5py.HardLink):
                raise InputError(f"{path}: {full} is a link, not part of a checkpoint")
            item = group[name]
            if isinstance(item, h5py.Group):
                yield _part(b"group") + _part(full.encode())
                yield from walk(item)
            elif isinstance(item, h5py.Dataset):
                data = read_numbers(f, full, path, "checkpoint", range(33))
                yield (_part(b"dataset") + _part(full.encode()) + _part(data.dtype.str.encode())
                       + _part(repr(data.shape).encode()) + _part(np.ascontiguousarray(data).tobytes()))
            else:
                raise InputError(f"{path}: {full} is not a group or a dataset")

    yield from walk(f)


def authentication_tag(f, key, path):
    """The HMAC-SHA256 (hex) under `key` of the open checkpoint `f` (:func:`canonical_items`)."""
    mac = hmac.new(key, b"prbmrm checkpoint v1", hashlib.sha256)
    for item in canonical_items(f, path):
        mac.update(item)
    return mac.hexdigest()


def _write_group(group, values):
    for key, value in values.items():
        if isinstance(value, dict):
            _write_group(group.create_group(key), value)
        else:
            group.create_dataset(key, data=np.asarray(value))


class State(dict):
    """A checkpoint's state (or one of its groups): a dict whose missing key is an InputError naming the file.

    A solver reads the keys it needs as it resumes; a checkpoint without one
    (damaged, or of another solver or version) stops the run with one message
    instead of a KeyError.
    """

    def __init__(self, values, path, group):
        super().__init__(values)
        self.path = path
        self.group = group

    def __missing__(self, key):
        raise InputError(f"{self.path}: the checkpoint has no {self.group}{key} (damaged, or written by "
                         "another solver or version)")


def _read_group(group, path):
    """The group as a :class:`State`: every dataset checked (:func:`prbmrm.model.read_numbers`) before it is read."""
    values = {}
    for key in group:
        if not isinstance(group.get(key, getlink=True), h5py.HardLink):
            raise InputError(f"{path}: {group.name}/{key} is a link, not part of a checkpoint")
        item = group[key]
        if isinstance(item, h5py.Group):
            values[key] = _read_group(item, path)
        else:
            data = read_numbers(group.file, f"{group.name}/{key}", path, "checkpoint", range(33))
            values[key] = data.item() if data.shape == () else data
    return State(values, path, group.name.removeprefix("/state").lstrip("/") + "/" if group.name != "/state" else "")


def load_checkpoint(path, key=None):
    """Read a checkpoint; return ``(state, meta)``.

    `state` is a :class:`State`; see :func:`verify_state` for the checks a
    resumed run makes of it. With a `key`, the file must carry a valid
    authentication tag (:data:`TAG`), checked before anything is used.

    Raises
    ------
    InputError
        If the file is missing, unreadable, not a prbmrm checkpoint, or (with
        a `key`) without a valid tag.
    """
    with read_checked(path, CHECKPOINT_FORMAT, "checkpoint file") as f:
        if key is not None:
            tag = f.attrs.get(TAG)
            if not isinstance(tag, str):
                raise InputError(f"{path}: the checkpoint has no authentication tag ({TAG}): it was written "
                                 "without a checkpoint key, and cannot be trusted with one")
            if not hmac.compare_digest(tag.encode("utf-8", "replace"), authentication_tag(f, key, path).encode()):
                raise InputError(f"{path}: the checkpoint's authentication tag does not match the checkpoint key: "
                                 "it was changed after it was written, or written with another key")
        meta = {}
        for name, value in f.attrs.items():
            if name in ("format", "version", TAG):
                continue
            try:
                meta[name] = json.loads(value) if isinstance(value, str) else None
            except (ValueError, RecursionError):
                meta[name] = None
            if meta[name] is None or (name in ("options", "fingerprint") and not isinstance(meta[name], dict)):
                raise InputError(f"{path}: the checkpoint's attribute {name} is not the JSON text of a checkpoint")
        state = f.get("state")
        if not isinstance(state, h5py.Group):
            raise InputError(f"{path}: the checkpoint has no group /state")
        return _read_group(state, path), meta


# Where a solver's state keeps vectors of the length of w, and matrices with rows of that length.
_VECTORS = ("w", "best_w", "w_b", "w_c", "w_t", "center", "g", "preconditioner")
_ROWS = ("A", "s", "y", "gradient")
# Groups of cutting planes: below R_emp (their Gram matrix in the regularizer's metric), or below J
# (the proximal method's model, plain Gram matrix).
_PLANES = {"bundle": "risk", "lower": "risk", "planes": "objective"}
# Scalars that claim a lower bound of min J.
_BOUNDS = ("lower_bound", "value")


def verify_state(state, risk, lam, regularizer, path):
    """Check a checkpoint's state before a run resumes from it (on rank 0, in the solver's place).

    The state must hold the keys every solver writes, arrays of the right
    shapes without NaN (nor infinities outside scalars and the history), an
    iteration count matching its history, and Gram matrices matching their
    planes. Then its claims are recomputed with one evaluation of the risk
    at the stored best iterate: ``best_objective`` must be J(best_w); every
    cutting plane must lie below R_emp (below J, for the proximal model) at
    best_w; and neither the bound the bundle's planes give (the subproblem
    solved again) nor a lower bound the state claims may exceed J(best_w).
    This catches damage and edits that would make a run claim a gap it does
    not have; it is a consistency check, not an authentication (a forger who
    writes planes that are valid at best_w but not elsewhere is not caught:
    only a checkpoint key, :func:`load_checkpoint` with `key`, stops one).

    Parameters
    ----------
    state : dict
        From :func:`load_checkpoint`.
    risk : callable
        ``risk(w) -> (R_emp(w), a)``, with ``dim``, the length of w.
    lam : float
    regularizer : prbmrm.regularizers.Regularizer
    path : str
        The checkpoint file, for the message.

    Raises
    ------
    InputError
        ``--resume PATH: problem``, for the first problem found.
    """
    problem = _state_problem(state, risk, lam, regularizer)
    if problem is not None:
        raise InputError(f"--resume {path}: {problem}; not resuming from it")


def _state_problem(state, risk, lam, regularizer):
    missing = [key for key in ("best_w", "best_objective", "iteration", "history") if key not in state]
    missing += [f"history/{column}" for column in HISTORY_COLUMNS
                if "history" in state and column not in state["history"]]
    if missing:
        return f"the checkpoint has no {missing[0]} (damaged, or written by another solver or version)"
    problem = _structure(state, risk.dim, "") or _planes_structure(state, risk.dim, regularizer)
    if problem is not None:
        return problem
    history, iteration = state["history"], state["iteration"]
    rows = np.atleast_1d(history["iteration"])
    if not (isinstance(iteration, numbers.Integral) and iteration == len(rows)
            and np.array_equal(rows, np.arange(1, len(rows) + 1))
            and all(np.atleast_1d(history[column]).shape == rows.shape for column in HISTORY_COLUMNS)):
        return f"iteration {iteration} does not match its history of {len(rows)} rows"
    return _claims_problem(state, risk, lam, regularizer)


def _structure(group, dim, prefix):
    """The first array of `group` (recursively) that is not numeric, holds NaN or has a wrong shape."""
    for key, value in group.items():
        name = prefix + key
        if isinstance(value, dict):
            problem = _structure(value, dim, name + "/")
            if problem is not None:
                return problem
            continue
        a = np.asarray(value)
        if a.dtype.kind not in "biuf":
            return f"{name} is not numeric"
        if a.dtype.kind == "f" and np.isnan(a).any():
            return f"{name} holds NaN"
        if a.ndim and not prefix.startswith("history") and not np.isfinite(a).all():
            return f"{name} holds an infinite value"
        if (key in _VECTORS and a.shape != (dim,)) or (key in _ROWS and a.size and (a.ndim != 2 or a.shape[1] != dim)):
            return f"{name} has shape {a.shape}, expected {'(%d,)' % dim if key in _VECTORS else '(n, %d)' % dim}"
    return None


def _planes_structure(state, dim, regularizer):
    """The first plane group whose parts disagree in size or whose Gram matrix is not that of its planes."""
    for key, kind in _PLANES.items():
        if key not in state:
            continue
        planes = state[key]
        t = len(np.atleast_1d(planes["b"]))
        shapes = (("A", (t, dim)),) if "A" in planes else (("indptr", (t + 1,)),)
        for part, shape in shapes + (("b", (t,)), ("gram", (t, t)), ("idle", (t,))):
            if np.shape(planes[part]) != shape:
                return f"{key}/{part} has shape {np.shape(planes[part])}, expected {shape}"
        if "alpha" in state and (np.shape(state["alpha"]) != (t,) or np.min(state["alpha"], initial=0) < 0):
            return f"alpha must be {t} multipliers >= 0 (one per plane of {key}), got {np.shape(state['alpha'])}"
        A = _planes_matrix(planes, dim)
        if isinstance(A, str):
            return f"{key}: {A}"
        metric = getattr(regularizer, "metric", None) if kind == "risk" else None
        rows = A.toarray() if sp.issparse(A) and metric is not None else A
        gram = A @ (A.T if metric is None else np.array([metric(a) for a in rows]).T)
        gram = gram.toarray() if sp.issparse(gram) else gram
        if np.abs(planes["gram"] - gram).max(initial=0) > 1e-8 * np.abs(gram).max(initial=0):
            return f"{key}/gram is not the Gram matrix of {key}/A"
    return None


def _planes_matrix(planes, dim):
    """The planes of a checkpoint's group as a matrix: ``A``, or a sparse bundle's rows as CSR
    (:meth:`prbmrm.solvers.Bundle.state`); a string saying what is wrong if they do not form one."""
    if "A" in planes:
        return planes["A"]
    indptr, indices, values = (np.asarray(planes.get(part, ())) for part in ("indptr", "indices", "values"))
    if not (indptr[0] == 0 and (np.diff(indptr) >= 0).all() and indices.shape == values.shape == (indptr[-1],)
            and indices.dtype.kind in "iu" and ((indices >= 0) & (indices < dim)).all()):
        return "indptr, indices and values do not form sparse planes of %d coordinates" % dim
    return sp.csr_matrix((values, indices, indptr), shape=(len(indptr) - 1, dim))


def _claims_problem(state, risk, lam, regularizer):
    """Whether the state's objective, planes and bounds hold at its best iterate (one risk evaluation)."""
    best_w, best_objective = state["best_w"], state["best_objective"]
    r, _ = risk(best_w)
    objective = lam * regularizer.value(best_w) + r
    if not math.isclose(objective, best_objective, rel_tol=1e-9):
        return (f"best_objective {best_objective:.12g} is not the objective at best_w, "
                f"{objective:.12g} (best_w or best_objective changed)")
    if np.atleast_1d(state["history"]["best_objective"])[-1] != best_objective:
        return "best_objective differs from the last row of its history"
    claims = [("the history's last lower bound", np.atleast_1d(state["history"]["lower_bound"])[-1])]
    claims += [(f"{key}", state[key]) for key in _BOUNDS if key in state]
    for key, kind in _PLANES.items():
        if key not in state or not len(state[key]["b"]):
            continue
        A, b = _planes_matrix(state[key], len(best_w)), state[key]["b"]
        values = A @ best_w + b
        below = r if kind == "risk" else objective
        if values.max() > below + 1e-9 * (abs(below) + np.abs(A @ best_w).max() + np.abs(b).max()):
            return (f"plane {int(values.argmax())} of {key} lies above the "
                    f"{'empirical risk' if kind == 'risk' else 'objective'} at best_w ({values.max():.12g} > "
                    f"{below:.12g}): not a cutting plane of this problem")
        if kind == "risk":
            bundle = Bundle(len(best_w), getattr(regularizer, "metric", None))
            bundle.restore(state[key])
            _, bound, _ = regularizer.solve_subproblem(bundle, lam, None)
            claims.append((f"the lower bound of the planes of {key}", bound))
    for what, bound in claims:
        if bound > objective + 1e-9 * max(abs(objective), abs(bound)):
            return (f"{what}, {bound:.12g}, exceeds the objective at best_w, {objective:.12g}: "
                    "it is not a lower bound")
    return None


def _block_digest(X, y, qid):
    """A 48-bit digest of one canonical block (exact in a float64)."""
    digest = hashlib.sha256()
    if sp.issparse(X):
        # Index dtypes depend on the local sizes, not on the data: hash them as int64.
        parts = (X.data, X.indices.astype(np.int64), np.diff(X.indptr).astype(np.int64))
    elif hasattr(X, "x_offsets"):  # ragged examples, with their labels: offsets relative to the block
        parts = (X.x_values, np.diff(X.x_offsets), X.y_values, np.diff(X.y_offsets))
    else:
        parts = (X,)
    for part in (*parts, np.asarray(X.shape, dtype=np.int64), *(p for p in (y, qid) if p is not None)):
        digest.update(np.ascontiguousarray(part).tobytes())
    return int.from_bytes(digest.digest()[:6], "little")


def data_fingerprint(local, comm):
    """Return a fingerprint of the data over all ranks (collective; a dict on rank 0, None elsewhere).

    It holds the sizes, the label kind and classes, and a SHA-256 of the
    per-block digests in global block order. Blocks do not depend on the
    number of ranks, so neither does the fingerprint: a run checkpointed on
    one rank may resume on three.
    """
    bounds = local.blocks
    digests = [_block_digest(local.X[a:b], None if local.y is None else local.y[a:b],
                             None if local.qid is None else local.qid[a:b])
               for a, b in itertools.pairwise(bounds)]
    every = comm.gather_scalars(np.asarray(digests, dtype=np.float64))
    if not comm.is_root:
        return None
    return {"n_examples": int(local.n_examples_total), "n_features": int(local.n_features),
            "label_kind": local.label_kind,
            "classes": None if local.classes is None else np.asarray(local.classes, dtype=np.float64).tolist(),
            "blocks": len(every), "sha256": hashlib.sha256(every.astype(np.int64).tobytes()).hexdigest()}


class Checkpointer:
    """The `checkpoint` callable handed to a solver on rank 0.

    Writes the solver's state every `every` iterations, at iteration `last`
    (the run's ``max_iter``) and when `stop` says the run must end; returns
    True in the last case so the solver stops.

    Parameters
    ----------
    path : str or None
        Checkpoint file; None writes nothing (only `stop` is honoured).
    every : int
        Write every this many iterations (0: only at `last` and on stop).
    last : int
        The iteration at which the run ends.
    meta : dict
        The options and data fingerprint stored with every state.
    stop : callable, optional
        ``stop() -> bool``, True when the run must end (a signal arrived).
    key : bytes, optional
        Authenticate every checkpoint with this key (:func:`save_checkpoint`).
    sums : prbmrm.distributed.exact.FixedPointSum, optional
        The risk's fixed-point sums: their bounds are saved with the state (:data:`SUM_BOUNDS`).

    Attributes
    ----------
    written : int or None
        The iteration of the last checkpoint written.
    """

    def __init__(self, path, every, last, meta, stop=None, key=None, sums=None):
        self.path = path
        self.key = key
        self.every = every
        self.last = last
        self.meta = meta
        self.stop = stop
        self.sums = sums
        self.written = None

    def __call__(self, t, snapshot):
        stopping = self.stop is not None and self.stop()
        due = stopping or t == self.last or (self.every > 0 and t % self.every == 0)
        if self.path is not None and due:
            state = snapshot()
            if self.sums is not None and self.sums.exponent is not None:
                state = dict(state, **{SUM_BOUNDS: self.sums.exponent})
            save_checkpoint(self.path, state, dict(self.meta, iteration=t), self.key)
            self.written = t
        return stopping


SUM_BOUNDS = "sum_exponents"
"""The state's dataset of the risk's fixed-point bounds (log2 per component,
:class:`prbmrm.distributed.exact.FixedPointSum`): they decide how each block's sum is rounded, so a
resumed run takes them up to take bitwise the uninterrupted run's path, on any number of ranks."""


def _sum_bounds(state, sums):
    """Take the fixed-point bounds out of a loaded `state`; return (exponents or None, problem or None)."""
    found = state.pop(SUM_BOUNDS, None)
    if found is None:
        return None, None
    found = np.asarray(found)
    if found.shape != (sums.n,) or found.dtype.kind not in "iu" or np.any(np.abs(found) > sums.EXPONENT_LIMIT):
        return None, (f"/state/{SUM_BOUNDS} is not {sums.n} integers within +-{sums.EXPONENT_LIMIT} "
                      "(damaged, or written for other data)")
    return found.astype(np.int64), None


def checkpointing(comm, local, options, *, path=None, every=0, resume=None, max_iter=10000, stop=None,
                  key=None, sums=None):
    """Prepare the `state` and `checkpoint` keywords of a solver (collective).

    Parameters
    ----------
    comm : prbmrm.distributed.comm.SerialComm or MPIComm
    local : prbmrm.io.LocalData
    options : dict
        The run's options; those of :data:`RESUME_OPTIONS` must match the checkpoint's.
    path : str, optional
        Checkpoint file to write.
    every : int
        Write every this many iterations.
    resume : str, optional
        Checkpoint file to resume from.
    max_iter : int
        The run's last iteration (a checkpoint is always written there).
    stop : callable, optional
        ``stop() -> bool``: checked between iterations; True writes a final
        checkpoint and stops the solver.
    key : str, optional
        The checkpoint key file (default: the file the environment variable
        :data:`KEY_VARIABLE` names, if set): checkpoints written are
        authenticated with it, and the one resumed from must carry a valid tag.
    sums : prbmrm.distributed.exact.FixedPointSum, optional
        The risk oracle's fixed-point sums (the same on every rank): their
        bounds are saved with every state and, on resume, restored on every rank.

    Returns
    -------
    dict
        On rank 0 the solver keywords (``checkpoint``, and ``state`` when
        resuming; empty without `path`, `resume` and `stop`); empty elsewhere.

    Raises
    ------
    UsageError
        On every rank, if the key file or the resume file is unreadable, the
        resume file lacks a valid tag when a key is given, or its options or
        data fingerprint differ from this run's.
    """
    if path is None and resume is None:
        return {"checkpoint": Checkpointer(None, 0, max_iter, {}, stop)} if stop and comm.is_root else {}
    fingerprint = data_fingerprint(local, comm)
    options = json.loads(json.dumps({name: options[name] for name in RESUME_OPTIONS}, default=str))
    key_file = key if key is not None else os.environ.get(KEY_VARIABLE) or None
    state, problem, secret, bounds = None, None, None, None
    if comm.is_root:
        try:
            secret = None if key_file is None else read_key(key_file)
        except InputError as error:
            problem = f"--checkpoint-key {error}"
    if comm.is_root and resume is not None and problem is None:
        try:
            state, meta = load_checkpoint(resume, secret)
            problem = _mismatch(meta, options, fingerprint)
            if problem is None and sums is not None:
                bounds, problem = _sum_bounds(state, sums)
        except InputError as error:
            problem = f"--resume {resume}: {error}"
        else:
            problem = None if problem is None else f"--resume {resume}: {problem}"
    problem = comm.bcast_object(problem)
    if problem is not None:
        raise UsageError(problem)
    if resume is not None and sums is not None:
        # Every rank rounds with the bounds of the uninterrupted run (float64 holds them exactly).
        message = np.zeros(sums.n + 1)
        if bounds is not None:
            message[0], message[1:] = 1.0, bounds
        comm.bcast_array(message)
        if message[0]:
            sums.exponent = message[1:].astype(sums.EXPONENT_DTYPE)
    if not comm.is_root:
        return {}
    meta = {"options": options, "fingerprint": fingerprint}
    keywords = {"checkpoint": Checkpointer(path, every, max_iter, meta, stop, secret, sums)}
    if state is not None:
        keywords["state"] = state
    return keywords


def _mismatch(meta, options, fingerprint):
    """Describe how a checkpoint's `meta` differs from this run, or return None."""
    saved = meta.get("options", {})
    changed = [f"{key} {saved.get(key)!r} -> {options[key]!r}" for key in RESUME_OPTIONS
               if saved.get(key) != options[key]]
    if changed:
        return "the checkpoint was written with other options: " + ", ".join(changed)
    if meta.get("fingerprint") != fingerprint:
        saved = meta.get("fingerprint") or {}
        differ = [key for key in fingerprint if saved.get(key) != fingerprint[key]]
        return f"the checkpoint was written for other data (differs in: {', '.join(differ)})"
    return None


class SignalFlag:
    """Context manager: SIGINT, SIGTERM and SIGUSR1 ask the run to stop instead of ending the process.

    Installed on every rank around training. Rank 0 checks the flag between
    iterations (through :class:`Checkpointer`): the solver writes a final
    checkpoint and stops the serving ranks with the normal stop message, so
    every rank leaves through MPI_Finalize. A signal caught on another rank
    is forwarded to rank 0 (:meth:`prbmrm.distributed.comm.MPIComm.request_stop`), so
    one signalled rank is enough; ``mpiexec`` and ``srun`` forward a signal
    they get to every rank. SIGUSR1 is Slurm's usual "checkpoint and stop
    before the time limit or a preemption" (``sbatch --signal``); MPICH's
    ``MPI_Init`` installs a SIGUSR1 handler of its own (libmpi), which this
    replaces while training, since MPI is initialized before. On leaving,
    SIGUSR1 is ignored for the rest of the process: the run is over, and a
    late "checkpoint and stop" would otherwise end it (status 138) while it
    writes the model, and the job would be requeued for nothing.

    Parameters
    ----------
    comm : prbmrm.distributed.comm.SerialComm or MPIComm

    Attributes
    ----------
    signum : int or None
        The signal received by this rank, or forwarded to rank 0 from another, if any.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, comm):
        self.comm = comm
        self._own = None
        self._previous = {}

    @property
    def signum(self):
        return self._own if self._own is not None else self.comm.stop_requested()

    def __call__(self):
        return self.signum is not None

    def _handle(self, signum, frame):
        if self._own is None:
            self._own = signum
        self.comm.request_stop(signum)  # a second signal ends the job at once (the communicator decides)

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, previous in self._previous.items():
            if s == signal.SIGUSR1:
                signal.signal(s, signal.SIG_IGN)
            elif previous is not None:  # None: a C handler, which Python cannot restore
                signal.signal(s, previous)
        return False

    @property
    def exit_status(self):
        """int: 128 + the signal number after a signal (130 SIGINT, 143 SIGTERM, 138 SIGUSR1), else 0."""
        return 0 if self.signum is None else 128 + self.signum
