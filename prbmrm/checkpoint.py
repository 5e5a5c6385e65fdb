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

Files are written as model files are: to ``.NAME.tmp-PID`` in the same
directory, flushed, fsync'ed and renamed over NAME, so a crash while writing
leaves the previous checkpoint intact (and at worst a stale temporary file).
"""

import hashlib
import itertools
import json
import os
import signal

import h5py
import numpy as np
import scipy.sparse as sp

from . import __version__
from .errors import InputError, UsageError
from .model import _temporary_name, read_checked

CHECKPOINT_FORMAT = "prbmrm-checkpoint"

RESUME_OPTIONS = ("loss", "loss_params", "lam", "reg", "reg_params", "solver", "solver_params", "bias",
                  "idle_age", "bundle_size")
"""Options a resumed run must share with the checkpoint (the stopping tests and --max-iter may change)."""


def save_checkpoint(path, state, meta):
    """Write `state` and `meta` to `path` atomically.

    Parameters
    ----------
    path : str
    state : dict
        Arrays and scalars (nested dicts become HDF5 groups) under ``/state``.
    meta : dict
        JSON-serializable values, stored as root attributes (JSON text).
    """
    temporary = _temporary_name(path)
    try:
        with h5py.File(temporary, "w") as f:
            f.attrs["format"] = CHECKPOINT_FORMAT
            f.attrs["version"] = __version__
            for key, value in meta.items():
                f.attrs[key] = json.dumps(value)
            _write_group(f.create_group("state"), state)
            f.flush()
            os.fsync(f.id.get_vfd_handle())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def _write_group(group, values):
    for key, value in values.items():
        if isinstance(value, dict):
            _write_group(group.create_group(key), value)
        else:
            group.create_dataset(key, data=np.asarray(value))


def _read_group(group):
    return {key: _read_group(item) if isinstance(item, h5py.Group) else
            (item[()].item() if item.shape == () else item[()]) for key, item in group.items()}


def load_checkpoint(path):
    """Read a checkpoint; return ``(state, meta)``.

    Raises
    ------
    InputError
        If the file is missing, unreadable or not a prbmrm checkpoint.
    """
    with read_checked(path, CHECKPOINT_FORMAT, "checkpoint file") as f:
        meta = {key: json.loads(value) for key, value in f.attrs.items() if key not in ("format", "version")}
        return _read_group(f["state"]), meta


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

    Attributes
    ----------
    written : int or None
        The iteration of the last checkpoint written.
    """

    def __init__(self, path, every, last, meta, stop=None):
        self.path = path
        self.every = every
        self.last = last
        self.meta = meta
        self.stop = stop
        self.written = None

    def __call__(self, t, snapshot):
        stopping = self.stop is not None and self.stop()
        due = stopping or t == self.last or (self.every > 0 and t % self.every == 0)
        if self.path is not None and due:
            save_checkpoint(self.path, snapshot(), dict(self.meta, iteration=t))
            self.written = t
        return stopping


def checkpointing(comm, local, options, *, path=None, every=0, resume=None, max_iter=10000, stop=None):
    """Prepare the `state` and `checkpoint` keywords of a solver (collective).

    Parameters
    ----------
    comm : prbmrm.comm.SerialComm or MPIComm
    local : prbmrm.data.LocalData
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

    Returns
    -------
    dict
        On rank 0 the solver keywords (``checkpoint``, and ``state`` when
        resuming; empty without `path`, `resume` and `stop`); empty elsewhere.

    Raises
    ------
    UsageError
        On every rank, if the resume file is unreadable, or its options or
        data fingerprint differ from this run's.
    """
    if path is None and resume is None:
        return {"checkpoint": Checkpointer(None, 0, max_iter, {}, stop)} if stop and comm.is_root else {}
    fingerprint = data_fingerprint(local, comm)
    options = json.loads(json.dumps({key: options[key] for key in RESUME_OPTIONS}, default=str))
    state, problem = None, None
    if comm.is_root and resume is not None:
        try:
            state, meta = load_checkpoint(resume)
            problem = _mismatch(meta, options, fingerprint)
        except InputError as error:
            problem = str(error)
    problem = comm.bcast_object(problem)
    if problem is not None:
        raise UsageError(f"--resume {resume}: {problem}")
    if not comm.is_root:
        return {}
    meta = {"options": options, "fingerprint": fingerprint}
    keywords = {"checkpoint": Checkpointer(path, every, max_iter, meta, stop)}
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
    is forwarded to rank 0 (:meth:`prbmrm.comm.MPIComm.request_stop`), so
    one signalled rank is enough; ``mpiexec`` and ``srun`` forward a signal
    they get to every rank. SIGUSR1 is Slurm's usual "checkpoint and stop
    before the time limit or a preemption" (``sbatch --signal``); MPICH's
    ``MPI_Init`` installs a SIGUSR1 handler of its own (libmpi), which this
    replaces while training, since MPI is initialized before.

    Parameters
    ----------
    comm : prbmrm.comm.SerialComm or MPIComm

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
            self.comm.request_stop(signum)

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, previous in self._previous.items():
            if previous is not None:  # None: a C handler (MPICH's SIGUSR1), which Python cannot restore
                signal.signal(s, previous)
        return False

    @property
    def exit_status(self):
        """int: 128 + the signal number after a signal (130 SIGINT, 143 SIGTERM, 138 SIGUSR1), else 0."""
        return 0 if self.signum is None else 128 + self.signum
