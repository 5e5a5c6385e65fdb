"""Train a model: ``python -m prbmrm.train`` and the Python function :func:`fit`.

Run plainly for one process, or under ``mpiexec -n P`` (or ``python -m mpi4py
-m prbmrm.train``) for P ranks, each reading its own block of shard files.
Without ``--data`` it trains on a small real data set shipped in the package.
"""

import argparse
import contextlib
import errno
import inspect
import json
import math
import numbers
import os
import re
import sys
import time

import numpy as np

from . import __version__
from ._cli import ArgumentParser, run
from ._config import add_config_options, config_section, parse_configured
from ._params import parse_params
from .checkpoint import SignalFlag, checkpointing, verify_state
from .watch import DEFAULT_TIMEOUT
from .data import STRUCTURED, split_local
from .errors import InputError, UsageError
from .files import OutputClaim
from .inputs import describe_mapping, load_input
from .losses import LOSSES, get_loss
from .model import Model, check_writable
from .party import Party, load_party, party_path
from .plugins import plugin_names
from .regularizers import REGULARIZERS, get_regularizer
from .shard import add_label_column_option
from .risk import DistributedRisk, run_distributed
from .solvers import SOLVERS, default_solver, get_solver, minimize, solver_options
from .solvers._base import planes_within
from .solvers.lsbmrm import check_theta
from .solvers.path import LamPath, PathProgress, PathResult, minimize_path
from .structured import RaggedExamples
from .structured.data import split_examples

DEMO_NAME = "embedded demo: Wisconsin breast cancer (569 x 30, standardized)"


def load_demo():
    """Return ``(X, y)`` of the embedded demo data set.

    The Wisconsin diagnostic breast cancer data (UCI, CC BY 4.0; 569 examples,
    30 features standardized to zero mean and unit variance, labels +1
    malignant / -1 benign), as shipped with scikit-learn.
    """
    from importlib.resources import files

    with files("prbmrm").joinpath("_data/breast_cancer.npz").open("rb") as f:
        archive = np.load(f)
        return archive["X"], archive["y"]


LAM_MIN = 1e-150
"""The smallest lambda accepted: w grows like 1/lam, so below about 1e-154 its squared norm
overflows float64 (and lam * Omega(w) loses every digit) long before the run ends."""

DEFAULT_REL_EPSILON = 1e-3

STOPPING_RULE = ("Stopping: --epsilon alone stops on the absolute gap; --rel-epsilon alone (or neither: "
                 f"{DEFAULT_REL_EPSILON:g}) on the gap relative to the best objective; both given: whichever "
                 "is met first.")


def stopping_tolerances(epsilon=None, rel_epsilon=None):
    """Return ``(epsilon, rel_epsilon)`` as the solvers take them (0 disables a test).

    `epsilon` alone stops on the absolute gap only; `rel_epsilon` alone, or
    neither, on the relative gap (default :data:`DEFAULT_REL_EPSILON`); both
    given: on whichever is met first. None means "not given".
    """
    if rel_epsilon is None:
        rel_epsilon = 0.0 if epsilon is not None else DEFAULT_REL_EPSILON
    return (0.0 if epsilon is None else epsilon), rel_epsilon


def check_options(lam, epsilon, rel_epsilon, max_iter, idle_age, bundle_size=0, solver="bmrm", theta=None):
    """Raise UsageError for option values no run can use (`lam` as for :func:`fit`)."""
    lams = [lam.smallest] if isinstance(lam, LamPath) else np.ravel(lam).tolist()
    for value in lams:
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"--lam must be a positive number, got {value:g}")
        if value < LAM_MIN:
            raise UsageError(f"--lam {value:g} is too small to be meaningful (below {LAM_MIN:g}, the "
                             "weights, which grow like 1/lam, overflow float64)")
    if len(set(lams)) != len(lams):
        raise UsageError("--lam: the lambdas of a path must differ")
    for name, value in (("--epsilon", epsilon), ("--rel-epsilon", rel_epsilon)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{name} must be >= 0, got {value:g}")
    if max_iter < 1:
        raise UsageError(f"--max-iter must be >= 1, got {max_iter}")
    if idle_age < 0:
        raise UsageError(f"--idle-age must be >= 0 (0 keeps every plane), got {idle_age}")
    if bundle_size < 0 or bundle_size == 1:
        raise UsageError(f"--bundle-size must be 0 (no limit) or >= 2, got {bundle_size}")
    if theta is not None:
        if solver != "lsbmrm":
            raise UsageError(f"--theta is an option of --solver lsbmrm, not of {solver!r}")
        check_theta(theta)


def fit(data=None, *, loss="hinge", loss_params=None, lam=1e-4, bias=False, solver=None, reg="l2",
        reg_params=None, epsilon=None, rel_epsilon=None, max_iter=10000, idle_age=10, bundle_size=0,
        bundle_memory=0, theta=None, solver_params=None, callback=None, comm=None, checkpoint=None,
        checkpoint_every=0, resume=None, stop=None, party=None, positive=None, label_column=0, report=None,
        warm=None):
    """Train a linear model with a bundle method on this process's share of the data.

    Call it on every rank with the same arguments.

    Parameters
    ----------
    data : str, list of str, tuple (X, y) or (X, y, options), RaggedExamples, or None
        A shard directory, glob or list of shard files (each rank opens only
        its own block), an SVMlight/LIBSVM, ``.npz`` or ``.csv`` file (read
        on every rank, which keeps its block of rows: see
        :func:`prbmrm.inputs.load_input`), or in-memory arrays ``(X, y)`` present on every rank
        (each rank keeps its block of rows); `options` are keywords of
        :func:`prbmrm.data.split_local` (``qid``, ``label_kind``, ``classes``).
        Structured examples (for a structured loss) come as shards of
        :func:`prbmrm.structured.data.write_structured_shards` or as a
        :class:`prbmrm.structured.RaggedExamples` present on every rank.
        None: the embedded demo data.
    loss : str or prbmrm.losses.Loss
        A key of :data:`prbmrm.losses.LOSSES` or the name of a loss plug-in
        (:mod:`prbmrm.plugins`), or a loss object (then `loss_params` is
        ignored), e.g. a :class:`prbmrm.structured.StructuredLoss`.
    loss_params : dict, optional
        The loss's parameters (``--loss-param NAME=VALUE``).
    lam : float, sequence of float or prbmrm.solvers.path.LamPath
        Regularization constant, > 0. Several (a sequence, or a LamPath's
        geometric grid) train a regularization path from the largest to the
        smallest, each run starting from the previous one's w (and bundle,
        for BMRM): see :func:`prbmrm.solvers.path.minimize_path`.
    bias : bool
        Append a constant feature whose weight is the (regularized) offset.
    solver : str or None
        A key of :data:`prbmrm.solvers.SOLVERS` or a solver plug-in's name;
        None: :func:`prbmrm.solvers.default_solver`'s choice.
    reg : str or prbmrm.regularizers.Regularizer
        A key of :data:`prbmrm.regularizers.REGULARIZERS`, or a regularizer
        object (then `reg_params` is ignored).
    reg_params : dict, optional
        The regularizer's parameters (``--reg-param NAME=VALUE``).
    epsilon, rel_epsilon : float or None
        Stop when the gap is at most `epsilon`, or at most `rel_epsilon` times
        the best objective: `epsilon` alone stops on the absolute gap only,
        `rel_epsilon` alone or neither on the relative one (default 1e-3), both
        on whichever is met first (see :func:`stopping_tolerances`). Ignored under differential
        privacy, where the gap is noisy: the run takes `max_iter` iterations.
    max_iter : int
    idle_age : int
        Drop planes idle this many iterations (0: never).
    bundle_size : int
        Keep at most this many planes, aggregating the oldest (0: no limit;
        solvers with a bundle only).
    bundle_memory : int or str
        A budget in bytes for the bundle's planes, e.g. ``"2GB"`` (see
        :func:`memory_bytes`): the bundle size is then the number of planes
        of the model's dimension that fit in it (at least 2; at most
        `bundle_size` if that is given too). 0: no budget.
    theta : float, optional
        ``lsbmrm`` only: where the next plane is taken between the line
        search's point and the model's minimizer (None: the solver's 0.9).
    solver_params : dict, optional
        The solver's own parameters (``--solver-param NAME=VALUE``, see
        :func:`prbmrm.solvers.solver_options`).
    callback : callable, optional
        Called on rank 0 with a :class:`prbmrm.solvers.Progress` per iteration.
    comm : prbmrm.comm.SerialComm or MPIComm, optional
        Defaults to :func:`prbmrm.comm.get_comm`.
    checkpoint : str, optional
        Rank 0 writes the solver's state to this file every `checkpoint_every`
        iterations, at `max_iter` and on `stop` (see :mod:`prbmrm.checkpoint`).
    checkpoint_every : int
    resume : str, optional
        Continue from this checkpoint; UsageError on every rank if its options
        or data differ.
    stop : callable, optional
        ``stop() -> bool``, checked on rank 0 between iterations: True ends the
        run (status 5 with a final checkpoint; status 3 for a solver without
        checkpoints).
    party : prbmrm.party.Party, optional
        Party mode: rank r is party r, `data` names each party's own files
        (a template with ``{rank}``, or a list with one entry per party) and
        every sum is a secure aggregation (see :mod:`prbmrm.party`).
    positive : float, optional
        One-vs-rest: map this label to +1 and every other to -1 (as
        ``prbmrm.shard --positive``); recorded in the model.
    label_column : int, str or list, default 0
        CSV input: the label column (number or header name).
    report : callable, optional
        Called on rank 0 with each line that describes the input (a CSV's
        header and label column, the label mapping), before training.
    warm : prbmrm.solvers.Result, optional
        Rank 0: a result of an earlier run on the same data and loss (any
        lam): start from its w and, for a solver that keeps a bundle, its
        planes and multipliers, which bound R_emp whatever lam (as on a
        lambda path). One lam only.

    Returns
    -------
    result : prbmrm.solvers.Result, prbmrm.solvers.path.PathResult or None
        On rank 0 (a PathResult for several lambdas; in party mode also on the
        parties that receive the model); None on the other ranks. ``result.w``
        is flat: reshape it to ``(n_features [+ 1 with bias], loss.n_outputs)``
        for multi-output losses.
    local : prbmrm.data.LocalData
        This rank's data, as loaded.
    loss : prbmrm.losses.Loss
        The loss, prepared for the data's labels.
    """
    from .comm import get_comm

    comm = get_comm() if comm is None else comm
    solver = solver or default_solver(lam, reg, warm is not None)
    check_options(lam, epsilon, rel_epsilon, max_iter, idle_age, bundle_size, solver, theta)
    epsilon, rel_epsilon = stopping_tolerances(epsilon, rel_epsilon)
    if isinstance(bundle_memory, str):
        try:
            bundle_memory = memory_bytes(bundle_memory)
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"--bundle-memory: {error}") from None
    if party is not None:
        if not isinstance(lam, numbers.Real) or checkpoint or resume:
            raise UsageError("party mode trains one lambda and takes no --checkpoint or --resume")
        comm = party.start(comm, solver=solver, max_iter=max_iter)
        if party.private:
            # A noisy gap certifies nothing (it even goes negative): use the whole budget.
            epsilon = rel_epsilon = -math.inf
    loss_object = get_loss(loss, **(loss_params or {})) if isinstance(loss, str) else loss
    # A bundle size is a parameter of the solvers that keep a bundle; others refuse it.
    limited = bundle_size or (2 if bundle_memory else 0)  # the size a budget gives is known with the data
    own = dict(solver_params or {}, **({"bundle_size": limited} if limited else {}),
               **({} if theta is None else {"theta": theta}))
    options = solver_options(solver, own)
    if party is not None and party.private and solver == "proximal":
        # BMRM's points go far from the prox-center, where noisy planes are poor: plain Alg. 1.
        options.setdefault("null_steps", 0)
    regularizer = get_regularizer(reg, **(reg_params or {})) if isinstance(reg, str) else reg
    notes = []
    if data is None:
        X, y = load_demo()
        local = split_local(X, y, comm, bias=bias, source=DEMO_NAME)
    elif party is not None:
        local = load_party(data, comm, bias=bias)
    elif isinstance(data, RaggedExamples):
        local = split_examples(data, comm, source="examples")
    elif isinstance(data, tuple):
        X, y, *data_options = data
        local = split_local(X, y, comm, bias=bias, source="arrays", positive=positive,
                            **(data_options[0] if data_options else {}))
    else:
        local = load_input(data, comm, bias=bias, positive=positive, label_column=label_column, notes=notes)
    if report is not None and comm.is_root:
        for line in notes + [describe_mapping(local)] * (local.positive is not None):
            report(line)
    where = data if isinstance(data, str) else DEMO_NAME if data is None else "data"
    structured = loss_object.structured
    if bias and structured:
        raise UsageError("--bias does not apply to a structured loss: give the joint feature map a "
                         "constant feature instead")
    if local.label_kind == STRUCTURED and not structured:
        problem = (f"loss {loss_object.name!r} needs rows of features and labels, the data holds structured "
                   "examples (train them with a structured loss)")
    elif local.label_kind == "multioutput" and not loss_object.multioutput:
        problem = (f"loss {loss_object.name!r} needs one label per example, the data has "
                   f"{len(local.classes)} real targets per example (multioutput; "
                   "multivariate_regression fits them)")
    else:
        problem = loss_object.check_labels(local.classes, local.label_kind)
    if problem is None and loss_object.needs_qid and local.qid is None:
        problem = f"loss {loss_object.name!r} needs query ids (qid:) and the data has none"
    if problem is not None:
        raise UsageError(f"{where}: {problem}")
    if structured:
        problem = loss_object.check_examples(local.X, local.row_offset)
        comm.check(None if problem is None else InputError(f"{where}: {problem}"))
    loss_object.prepare(local.classes, local.label_kind)
    evaluated = loss_object if party is None else party.check_loss(loss_object)
    oracle = DistributedRisk(evaluated, local.X, local.y, local.n_examples_total, comm, local.blocks,
                             local.qid)
    regularizer.prepare(oracle.dim, loss_object.risk_floor)
    w0 = regularizer.initial_point(oracle.dim)
    if bundle_memory:
        planes = planes_within(bundle_memory, oracle.dim)
        bundle_size = options["bundle_size"] = min(bundle_size, planes) if bundle_size else planes
    path = not isinstance(lam, numbers.Real)
    if path and (checkpoint or resume):
        raise UsageError("--checkpoint and --resume do not apply to a lambda path")
    callback, options = _checkpoint_options(comm, local, callback, options, checkpoint, checkpoint_every, resume,
                                            stop, loss_object, regularizer, lam=lam, solver=solver, bias=bias,
                                            idle_age=idle_age, bundle_size=bundle_size, max_iter=max_iter)

    if warm is not None:
        if path:
            raise UsageError("a warm start applies to one lambda, not to a path")
        w0 = warm.w
        if warm.bundle is not None and "bundle" in inspect.signature(get_solver(solver)).parameters:
            options = dict(options, bundle=warm.bundle, alpha=warm.alpha)

    def solve(risk):
        if "state" in options:  # a resumed run: check the checkpoint's claims before trusting them
            verify_state(options["state"], risk, lam, regularizer, resume)
        return (minimize_path if path else minimize)(
            risk, w0, lam, method=solver, reg=regularizer, epsilon=epsilon, rel_epsilon=rel_epsilon,
            max_iter=max_iter, idle_age=idle_age, callback=callback, **options)

    if party is None:
        return run_distributed(oracle, solve), local, loss_object
    party.attach(oracle, local, lam, regularizer, loss_object)
    return party.run(oracle, solve), local, loss_object


def _checkpoint_options(comm, local, callback, options, path, every, resume, stop, loss, regularizer, **run):
    """Return the callback and solver options with checkpoint, resume and stop added (collective).

    A solver without checkpoints (no ``checkpoint`` keyword) refuses `path`
    and `resume`, and honours `stop` through its callback (StopIteration).
    """
    if not _checkpoints(run["solver"]):
        if path is not None or resume is not None:
            raise UsageError(f"solver {run['solver']!r} does not support --checkpoint and --resume "
                             f"(those that do: {', '.join(s for s in SOLVERS if _checkpoints(s))})")
        if stop is None or not comm.is_root:
            return callback, options
        return _stopping_callback(callback, stop), options
    # A structured loss's model has parameters of its own (--loss-param too).
    model = getattr(loss, "model", None)
    loss_params = {k: getattr(owner, k) for owner in (loss, model) if owner is not None for k in owner.params}
    described = dict(run, loss=loss.name, loss_params=loss_params,
                     reg=regularizer.name, reg_params={k: getattr(regularizer, k) for k in regularizer.params},
                     solver_params=options)
    keywords = checkpointing(comm, local, described, path=path, every=every, resume=resume,
                             max_iter=run["max_iter"], stop=stop)
    return callback, dict(options, **keywords)


def _checkpoints(solver):
    return "checkpoint" in inspect.signature(get_solver(solver)).parameters


def _stopping_callback(callback, stop):
    def stopping(row):
        if callback is not None:
            callback(row)
        if stop():
            raise StopIteration
    return stopping


class ProgressTable:
    """Prints the progress table on rank 0: every iteration at first, then sparser.

    On a terminal the rows in between show in place on the last line (at
    most 10 times a second), so a long run shows its progress; elsewhere
    (a file, a pipe, a batch job's log) only the plain rows are written. On
    a lambda path each lambda gets its own table, headed by the lambda.

    Parameters
    ----------
    every : int
        Print every this many iterations; 0 chooses 1 up to iteration 10, 10
        up to 100, then 100.
    stream : file, optional
        sys.stdout by default.
    note : str, optional
        A line printed above the first header (e.g. that the bound is not certified).
    """

    LIVE_SECONDS = 0.1

    HEADER = (f"{'iter':>6} {'objective':>13} {'best':>13} {'lower bound':>13} {'gap':>10} "
              f"{'planes':>6} {'risk s':>8} {'sub s':>8} {'comm s':>8}")

    def __init__(self, every=0, stream=None, note=None):
        self.every = every
        self.stream = sys.stdout if stream is None else stream
        self.note = note
        self.last = None
        self.printed = 0
        self.live = self.stream.isatty()
        self.shown = None  # when the in-place row was last written, None when there is none

    def __call__(self, row):
        # The first row of a run, of a resumed run, or of each step of a lambda path.
        if self.last is None or (isinstance(row, PathProgress) and row.iteration == 1):
            if self.last is None and self.note:
                print(self.note, file=self.stream)
            self.finish()
            if isinstance(row, PathProgress):
                print(f"path step {row.step + 1}: lambda {row.lam:.6g}", file=self.stream)
            print(self.HEADER, file=self.stream)
        every = self.every or (1 if row.iteration <= 10 else 10 if row.iteration <= 100 else 100)
        self.last = row
        if row.iteration % every == 0 or row.iteration == 1:
            self.print_row(row)
        elif self.live and (self.shown is None or time.monotonic() - self.shown > self.LIVE_SECONDS):
            self.stream.write("\r" + self.format_row(row))
            self.stream.flush()
            self.shown = time.monotonic()

    def finish(self):
        """Print the last row if it was skipped."""
        if self.last is not None and self.printed != self.last.iteration:
            self.print_row(self.last)

    def print_row(self, row):
        """Print one row of the table (over the in-place row, if any)."""
        self.printed = row.iteration
        start = "\r" if self.shown is not None else ""
        self.shown = None
        print(start + self.format_row(row), file=self.stream, flush=True)

    @staticmethod
    def format_row(row):
        """Return the text of one row."""
        return (f"{row.iteration:6d} {row.objective:13.6e} {row.best_objective:13.6e} "
                f"{row.lower_bound:13.6e} {row.gap:10.3e} {row.planes:6d} {row.seconds_risk:8.4f} "
                f"{row.seconds_subproblem:8.4f} {row.seconds_comm:8.4f}")


class JsonLog:
    """Appends each progress row to a JSON-lines file as the run goes (``--log-json``, rank 0).

    Each line is one JSON object with the columns of the model's
    ``/history`` (on a path also ``step`` and ``lam``), a non-finite value
    written as null. The file is emptied when the log is created; each line
    is then appended with one write and the file closed, so it always holds
    whole lines, those of the iterations done so far, also when the run
    fails or is killed (a record of how far it got). The model file, not the
    log, tells whether a run finished.

    Parameters
    ----------
    path : str

    Raises
    ------
    InputError
        If the file cannot be created.
    """

    def __init__(self, path):
        self.path = path
        try:
            open(path, "w").close()
        except OSError as error:
            raise InputError(f"{path}: cannot write the --log-json file: {error.strerror or error}") from None

    def __call__(self, row):
        values = {name: _json_value(value) for name, value in vars(row).items()}
        line = (json.dumps(values) + "\n").encode()
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as error:
            raise InputError(f"{self.path}: cannot write the --log-json file: {error.strerror or error}") from None
        try:
            length = os.fstat(descriptor).st_size
            try:
                if os.write(descriptor, line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as error:
                os.ftruncate(descriptor, length)  # keep whole lines only
                raise InputError(f"{self.path}: cannot write the --log-json file: "
                                 f"{error.strerror or error}") from None
        finally:
            os.close(descriptor)


class PhaseSeconds:
    """Sums the per-phase seconds of the progress rows of this run (a callback, rank 0).

    Attributes
    ----------
    totals : dict
        ``seconds_risk``, ``seconds_subproblem`` and ``seconds_comm`` summed over the rows seen.
    """

    NAMES = ("seconds_risk", "seconds_subproblem", "seconds_comm")

    def __init__(self):
        self.totals = dict.fromkeys(self.NAMES, 0.0)

    def __call__(self, row):
        for name in self.NAMES:
            self.totals[name] += float(getattr(row, name))


def partial_name(out):
    """The file an interrupted run writes its best iterate to: ``model.h5`` -> ``model.interrupted.h5``."""
    stem, extension = os.path.splitext(out)
    return f"{stem}.interrupted{extension or '.h5'}"


def _json_value(value):
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _callbacks(*functions):
    """One callback that calls each of `functions` that is not None; None if all are."""
    functions = [function for function in functions if function is not None]
    if not functions:
        return None

    def callback(row):
        for function in functions:
            function(row)

    return callback


_MEMORY_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def memory_bytes(text):
    """Type of ``--bundle-memory``: bytes, e.g. ``2000000``, ``2GB``, ``1.5G``, ``512MiB``.

    K, M, G, T are powers of 1000, Ki, Mi, Gi, Ti powers of 1024; a final B is optional.

    Raises
    ------
    argparse.ArgumentTypeError
        If `text` is not a size >= 0.
    """
    match = re.fullmatch(r"\s*(\d+\.?\d*(?:e[+-]?\d+)?)\s*([kmgt]i?)?b?\s*", str(text), re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 2GB or 512MiB, got {text!r}")
    return int(float(match[1]) * _MEMORY_UNITS[(match[2] or "").upper()])


def lam_values(text):
    """Type of ``--lam``: a number, or a comma-separated list of them (a path) as a tuple."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or a comma-separated list of numbers, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def lam_option(args):
    """The `lam` of :func:`fit` for the parsed options: a float, a tuple (a path) or a LamPath."""
    if not args.lam_path:
        if args.lam_max is not None:
            raise UsageError("--lam-max goes with --lam-path")
        return args.lam
    if not isinstance(args.lam, float):
        raise UsageError("--lam-path takes one --lam, the smallest lambda of the path")
    return LamPath(args.lam_path, args.lam, args.lam_max)


def split_weights(w, loss, has_bias):
    """Return ``(w, bias)`` of a solver's flat `w`: (d,) or (d, k) weights, and the offset(s)."""
    W = w.reshape(-1, loss.n_outputs) if loss.n_outputs > 1 else w
    return (W[:-1], W[-1]) if has_bias else (W, np.zeros(W.shape[1:]))


def path_tables(path, loss, has_bias):
    """Return ``(history, groups)`` of a lambda path's model file.

    `history` concatenates the runs' histories with the columns ``step``
    and ``lam``; ``groups["path"]`` holds per lambda ``lam``, ``w`` (n, d[, k]),
    ``bias``, ``objective``, ``lower_bound``, ``gap``, ``iterations`` and ``status``.
    """
    histories = [dict(result.history, step=np.full(result.nit, step), lam=np.full(result.nit, lam))
                 for step, (lam, result) in enumerate(zip(path.lams, path.results))]
    history = {name: np.concatenate([h[name] for h in histories]) for name in histories[0]}
    weights = [split_weights(result.w, loss, has_bias) for result in path.results]
    table = {"lam": path.lams, "w": np.stack([w for w, _ in weights]),
             "bias": np.stack([np.asarray(b, dtype=np.float64) for _, b in weights])}
    for name, attribute in (("objective", "fun"), ("lower_bound", "lower_bound"), ("gap", "gap"),
                            ("iterations", "nit"), ("status", "status")):
        table[name] = np.array([getattr(result, attribute) for result in path.results])
    return history, {"path": table}


def print_path(path):
    """Print one line per lambda of a path: its objective, bound, gap, iterations and status."""
    print(f"path of {len(path.lams)} lambdas, {sum(r.nit for r in path.results)} iterations in all:\n"
          f"{'lambda':>12} {'objective':>13} {'lower bound':>13} {'gap':>10} {'iter':>6}  status")
    for lam, result in zip(path.lams, path.results):
        print(f"{lam:12.6g} {result.fun:13.6e} {result.lower_bound:13.6e} {result.gap:10.3e} "
              f"{result.nit:6d}  {result.message}")


def build_parser():
    """Return the argument parser of ``python -m prbmrm.train``."""
    parser = ArgumentParser(prog="prbmrm.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="shard directory or glob of shard files "
                        "(python -m prbmrm.shard makes them), or an SVMlight/LIBSVM, .npz or .csv file "
                        "(read on every rank, each keeping its rows); with --parties each party's, a "
                        "template such as 'site-{rank}.h5'; default: the embedded demo data")
    parser.add_argument("--loss", default="hinge", help=f"loss: {', '.join([*LOSSES, *plugin_names('loss')])} (default hinge)")
    parser.add_argument("--loss-param", action="append", metavar="NAME=VALUE",
                        help="a parameter of the loss, e.g. tau=0.3 for quantile (repeatable)")
    parser.add_argument("--lam", type=lam_values, default=1e-4,
                        help="regularization constant > 0 (default 1e-4); a comma-separated list "
                        "trains a lambda path, from the largest to the smallest")
    parser.add_argument("--lam-path", type=int, default=0, metavar="N",
                        help="train a path of N lambdas, log-spaced from --lam-max down to --lam")
    parser.add_argument("--lam-max", type=float, metavar="LAM",
                        help="the first lambda of --lam-path (default: the smallest lambda at which "
                        "w = 0 is optimal for l1 and elastic_net, 1.0 for other regularizers)")
    parser.add_argument("--solver", help=f"solver: {', '.join([*SOLVERS, *plugin_names('solver')])} (default: "
                        "proximal for one --lam with a quadratic --reg, else bmrm)")
    parser.add_argument("--theta", type=float, help="lsbmrm: next plane at (1 - theta) w_b + theta w_t, "
                        "0 < theta <= 1 (default 0.9)")
    parser.add_argument("--solver-param", action="append", metavar="NAME=VALUE",
                        help="a parameter of the solver, e.g. mu=1e-6 for smooth_lbfgs (repeatable)")
    parser.add_argument("--reg", default="l2", help=f"regularizer: {', '.join([*REGULARIZERS, *plugin_names('regularizer')])} "
                        "(default l2)")
    parser.add_argument("--reg-param", action="append", metavar="NAME=VALUE",
                        help="a parameter of the regularizer, e.g. p=1.5 for lp (repeatable)")
    parser.add_argument("--epsilon", type=float,
                        help="stop when the gap (best objective - lower bound) <= this; given alone, "
                        "the only gap test (the default --rel-epsilon no longer applies)")
    parser.add_argument("--rel-epsilon", type=float,
                        help="stop when the gap <= this times the best objective (default "
                        f"{DEFAULT_REL_EPSILON:g} unless --epsilon alone is given). {STOPPING_RULE}")
    parser.add_argument("--max-iter", type=int, default=10000, help="maximum iterations (default 10000)")
    parser.add_argument("--idle-age", type=int, default=10,
                        help="drop planes whose multiplier stayed 0 this many iterations (default 10; 0: never)")
    parser.add_argument("--bundle-size", type=int, default=0,
                        help="keep at most this many planes (>= 2), aggregating the oldest (default 0: no limit)")
    parser.add_argument("--bundle-memory", type=memory_bytes, default=0, metavar="SIZE",
                        help="a budget for the bundle's planes, e.g. 2GB or 512MiB: the bundle size follows "
                             "from it and the number of weights (default 0: none)")
    parser.add_argument("--bias", action="store_true", help="learn an offset (a constant feature, regularized)")
    parser.add_argument("--positive", type=float, metavar="LABEL",
                        help="one-vs-rest: map LABEL to +1 and every other label to -1 (as prbmrm.shard "
                        "--positive); recorded in the model, which predict applies to raw labels")
    add_label_column_option(parser)
    add_checkpoint_arguments(parser)
    parser.add_argument("--out", default="model.h5", help="model file to write (default model.h5)")
    parser.add_argument("--print-every", type=int, default=0,
                        help="progress row every N iterations (default 0: 1 to 10 by 1, to 100 by 10, then by 100)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--log-json", metavar="FILE",
                        help="append each iteration's progress row to FILE as a JSON line (rank 0)")
    add_config_options(parser)
    parser.add_argument("--version", action="version", version=f"prbmrm {__version__}")
    party = parser.add_argument_group("party mode (several data owners, one rank each; docs/party.md)")
    party.add_argument("--parties", action="store_true",
                       help="rank r is party r: reads only its own files, every sum is securely aggregated")
    config_section(party, "privacy", {"party_data": "data"})
    party.add_argument("--party-data", action="append", metavar="PATH",
                       help="the files of one party, once per party in rank order, or once a template "
                            "such as 'site-{rank}.h5' (instead of --data)")
    party.add_argument("--model-to", metavar="RANKS", type=party_numbers,
                       help="comma-separated parties that receive and write the model (default: all)")
    party.add_argument("--allow-score-sharing", action="store_true",
                       help="accept a non-decomposable loss, whose per-example scores go to rank 0 unmasked")
    party.add_argument("--verify-coordinator", action="store_true",
                       help="every party replays the solver and stops if a w of rank 0 differs")
    party.add_argument("--audit-log", default="audit-{rank}.jsonl",
                       help="each party's log of every w it evaluated (default audit-{rank}.jsonl)")
    party.add_argument("--no-audit-log", action="store_true", help="write no audit log")
    party.add_argument("--dp-epsilon", type=float, help="differential privacy: epsilon over the whole run")
    party.add_argument("--dp-delta", type=float, help="differential privacy: delta over the whole run")
    party.add_argument("--dp-clip", type=float, default=1.0,
                       help="norm each example's (loss, gradient) is clipped to (default 1)")
    party.add_argument("--dp-coalition", type=int, metavar="T",
                       help="the privacy target holds against any T colluding parties (default parties - 2)")
    party.add_argument("--party-key", metavar="PATH",
                       help="this party's signing key file, a template such as 'site-{rank}.key' "
                            "(python -m prbmrm.keys keygen makes it)")
    party.add_argument("--roster", metavar="PATH",
                       help="the parties' expected public keys (python -m prbmrm.keys roster): a "
                            "substituted key stops the run")
    return parser


def add_checkpoint_arguments(parser):
    """Add ``--checkpoint``, ``--checkpoint-every``, ``--resume``, ``--resume-if-exists`` and ``--rank-timeout``."""
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rank 0 writes the solver state here (atomically) every --checkpoint-every "
                        "iterations, at --max-iter and on SIGINT/SIGTERM")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                        help="checkpoint every N iterations (default 0: only at the end and on a signal)")
    parser.add_argument("--resume", metavar="PATH", help="continue from this checkpoint (same options and data)")
    parser.add_argument("--resume-if-exists", action="store_true",
                        help="continue from the --checkpoint file if it exists, else start afresh: the same "
                        "command starts or continues a run (a requeued batch job)")
    parser.add_argument("--rank-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="a rank waiting this long in a collective checks that the others still answer; "
                        f"one that does not ends the job, named (default {DEFAULT_TIMEOUT:g}; 0: wait forever)")


def _check_checkpoint_arguments(args, comm):
    """Raise UsageError for bad checkpoint options; check the checkpoint path is writable (collective).

    Returns the checkpoint to resume from: ``--resume``, or with
    ``--resume-if-exists`` the ``--checkpoint`` file if rank 0 sees it.
    """
    if not (math.isfinite(args.rank_timeout) and args.rank_timeout >= 0):
        raise UsageError(f"--rank-timeout must be >= 0 seconds, got {args.rank_timeout:g}")
    if args.resume_if_exists and (args.checkpoint is None or args.resume is not None):
        raise UsageError("--resume-if-exists needs --checkpoint PATH (and no --resume)")
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.checkpoint_every and args.checkpoint is None:
        raise UsageError("--checkpoint-every needs --checkpoint PATH")
    error = None
    if comm.is_root and args.checkpoint is not None:
        try:
            check_writable(args.checkpoint)
        except Exception as problem:
            error = problem
    comm.check(error)
    if not args.resume_if_exists:
        return args.resume
    # Rank 0 alone reads the checkpoint: its view decides for every rank.
    found = comm.allreduce_max([comm.is_root and os.path.exists(args.checkpoint)])[0]
    return args.checkpoint if found else None


_PARTY_ONLY = ("party_data", "model_to", "allow_score_sharing", "verify_coordinator", "dp_epsilon",
               "dp_delta", "dp_coalition", "party_key", "roster")


def party_numbers(text):
    """Type of ``--model-to``: comma-separated party numbers, as a list."""
    try:
        return [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--model-to expects comma-separated party numbers, "
                                         f"got {text!r}") from None


def party_data(args):
    """The `data` of :func:`fit`: ``--data``, or the ``--party-data`` list (given once with ``{rank}``: a template)."""
    paths = args.party_data
    if not paths:
        return args.data
    template = len(paths) == 1 and party_path(paths[0], 0) != party_path(paths[0], 1)
    return paths[0] if template else paths


def party_from_args(args):
    """Return the :class:`prbmrm.party.Party` of ``--parties`` and its options, or None."""
    if not args.parties:
        given = [name for name in _PARTY_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --parties")
        return None
    if args.party_data and args.data:
        raise UsageError("give either --data (a template with {rank}) or --party-data, not both")
    if args.data is None and not args.party_data:
        raise UsageError("--parties needs each party's data: --data 'site-{rank}.h5' or --party-data")
    return Party(model_to=args.model_to, allow_score_sharing=args.allow_score_sharing,
                 verify_coordinator=args.verify_coordinator,
                 audit_log=None if args.no_audit_log else args.audit_log, dp_epsilon=args.dp_epsilon,
                 dp_delta=args.dp_delta, dp_clip=args.dp_clip, dp_coalition=args.dp_coalition,
                 signing_key=args.party_key, roster=args.roster)


def _absolute_files(params):
    """`params` with file names made absolute, so `prbmrm.predict` finds them from any directory."""
    return {name: os.path.abspath(value) if isinstance(value, str) and os.path.isfile(value) else value
            for name, value in params.items()}


def main(argv, comm):
    """Entry point of ``python -m prbmrm.train``; returns the exit status."""
    with contextlib.ExitStack() as held:
        return _main(argv, comm, held)


def _main(argv, comm, held):
    """:func:`main`, with `held` (an ExitStack) keeping this job's claims on its output files."""
    args = parse_configured(build_parser(), argv, comm)
    if args is None:  # --print-config
        return 0
    comm.set_rank_timeout(args.rank_timeout)
    lam = lam_option(args)
    args.solver = args.solver or default_solver(lam, args.reg)
    check_options(lam, args.epsilon, args.rel_epsilon, args.max_iter, args.idle_age, args.bundle_size,
                  args.solver, args.theta)
    loss_params = parse_params(args.loss_param, "--loss-param")
    get_loss(args.loss, **loss_params)
    reg_params = parse_params(args.reg_param, "--reg-param")
    regularizer = get_regularizer(args.reg, **reg_params)
    solver_params = parse_params(args.solver_param, "--solver-param")
    solver_options(args.solver, solver_params)
    party = party_from_args(args)
    # In party mode each party that receives the model writes its own file.
    out = args.out if party is None else party_path(args.out, comm.rank)
    writes = comm.is_root if party is None else party.model_to is None or comm.rank in party.model_to
    error, log = None, None
    if writes:
        try:
            # Claimed before anything is written (the log is emptied when opened).
            held.enter_context(OutputClaim({"--out": out, "--checkpoint": args.checkpoint if comm.is_root else None,
                                            "--log-json": args.log_json if comm.is_root else None}, "prbmrm.train"))
            check_writable(out)
            log = JsonLog(args.log_json) if args.log_json and comm.is_root else None
        except Exception as problem:
            error = problem
    comm.check(error)
    resume = _check_checkpoint_arguments(args, comm)
    verbose = comm.is_root and not args.quiet
    note = ("note: differential privacy adds noise to every risk and subgradient: the objective, "
            "lower bound and gap below are noisy, the lower bound is NOT certified, and the run "
            f"takes all {args.max_iter} iterations" if party is not None and party.private else None)
    table = ProgressTable(args.print_every, note=note) if verbose else None
    phases = PhaseSeconds()
    started = time.perf_counter()
    with SignalFlag(comm) as interrupted:
        result, local, loss = fit(party_data(args), loss=args.loss, loss_params=loss_params,
                                  lam=lam, bias=args.bias, solver=args.solver, reg=regularizer,
                                  epsilon=args.epsilon, rel_epsilon=args.rel_epsilon, max_iter=args.max_iter,
                                  idle_age=args.idle_age, bundle_size=args.bundle_size,
                                  bundle_memory=args.bundle_memory, theta=args.theta,
                                  solver_params=solver_params, callback=_callbacks(table, log, phases), comm=comm,
                                  checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                                  resume=resume, stop=interrupted, party=party, positive=args.positive,
                                  label_column=args.label_column, report=print if verbose else None)
    status = comm.bcast_object(interrupted.exit_status)
    mean_delta = training_mean_delta(result, local, loss, comm) if loss.structured else None
    if party is not None and not args.quiet and not comm.is_root:
        print_audit_summary(party)
    if result is None:
        return status
    seconds = time.perf_counter() - started
    path = result if isinstance(result, PathResult) else None
    options = {key: value for key, value in vars(args).items() if key not in ("quiet", "print_every")}
    model = build_model(result, local, loss, comm.size, seconds, lam=args.lam, loss_name=args.loss,
                        loss_params=loss_params, solver=args.solver, reg=args.reg, reg_params=reg_params,
                        bias=args.bias, data=args.data or DEMO_NAME, options=options)
    result, w, history = (result if path is None else path.last), model.w, model.history
    if mean_delta is not None:
        model.attrs["train_mean_delta"] = mean_delta
    if party is not None:
        model.attrs.update(party.model_attrs())
    # An interrupted run's model is the best iterate so far: never under the final name.
    written = partial_name(out) if status else out
    if writes:
        model.save(written)
        if not status and os.path.exists(partial_name(out)):
            os.remove(partial_name(out))  # an earlier interrupted run's, now superseded
    if verbose:
        table.finish()
        if path is not None:
            print_path(path)
        if party is not None:
            print(party_summary(party))
        # This run's iterations only: a resumed history also holds the earlier runs' rows.
        totals = phases.totals
        print(f"{'converged' if result.success else 'stopped'} after {result.nit} iterations "
              f"({result.message}): objective {result.fun:.8g}, lower bound {result.lower_bound:.8g}, "
              f"gap {result.gap:.3g}\n"
              f"seconds: risk {totals['seconds_risk']:.3f}, subproblem {totals['seconds_subproblem']:.3f}, "
              f"comm {totals['seconds_comm']:.3f}, total {seconds:.3f} on {comm.size} rank(s); "
              f"{local.n_examples_total} examples x {local.n_features} features"
              f"{' + bias' if args.bias else ''}; {model.attrs['nonzeros']} of {w.size} weights nonzero")
        if mean_delta is not None:
            print(f"training mean Delta {mean_delta:.6g}")
        print(f"model written to {written}" if writes else "model not written here (--model-to)")
        if party is not None:
            print_audit_summary(party)
    if interrupted.signum is not None and comm.is_root:
        print(f"prbmrm.train: interrupted by signal {interrupted.signum} after iteration {result.nit}"
              f"{f'; checkpoint written to {args.checkpoint}' if args.checkpoint else ''}; the best "
              f"iterate so far written to {written}, not to {out}", file=sys.stderr, flush=True)
    return status


def build_model(result, local, loss, ranks, seconds, *, lam, loss_name, loss_params, solver, reg, reg_params,
                bias, data, options):
    """Return the :class:`prbmrm.model.Model` of a run: weights, training summary and label mapping.

    Parameters
    ----------
    result : prbmrm.solvers.Result or prbmrm.solvers.path.PathResult
        Rank 0's result of :func:`fit`.
    local : prbmrm.data.LocalData
        The data as loaded (its label kind, classes, mapping and width are recorded).
    loss : prbmrm.losses.Loss
        The prepared loss.
    ranks : int
    seconds : float
        Wall seconds of the run.
    lam, loss_name, loss_params, solver, reg, reg_params, bias, data, options
        The run's settings as given (``lam`` as for :func:`fit`, `loss_name`
        the name :func:`prbmrm.losses.get_loss` takes, `data` the data's name).
    """
    path = result if isinstance(result, PathResult) else None
    last = result if path is None else path.last
    w, offset = split_weights(last.w, loss, bias)
    history, groups = (last.history, None) if path is None else path_tables(path, loss, bias)
    attrs = {"objective": last.fun, "lower_bound": last.lower_bound, "gap": last.gap,
             "iterations": last.nit, "status": last.status, "message": last.message,
             "lam": lam if path is None else path.lams[-1],
             "loss": loss_name, "loss_params": json.dumps(_absolute_files(loss_params or {})),
             "solver": solver, "reg": reg if isinstance(reg, str) else reg.name,
             "reg_params": json.dumps(_absolute_files(reg_params or {})),
             "nonzeros": int(np.count_nonzero(w)), "has_bias": bool(bias), "n_features": local.n_features,
             "n_examples": local.n_examples_total, "ranks": ranks, "data": data,
             "label_kind": local.label_kind, "options": json.dumps(options), "seconds": seconds}
    if local.classes is not None:
        attrs["classes"] = np.asarray(local.classes, dtype=np.float64)
    if local.positive is not None:
        attrs["positive"] = float(local.positive)
    if local.negative is not None:
        attrs["negative"] = float(local.negative)
    return Model(w=w, bias=offset, attrs=attrs, history=history, path=None if groups is None else groups["path"])


def training_mean_delta(result, local, loss, comm):
    """Return the mean Delta(y, predict(x)) of the final w over all training examples (collective).

    For a structured loss; `result` is rank 0's (a Result or PathResult).
    """
    last = result.last if isinstance(result, PathResult) else result
    w = comm.bcast_object(None if last is None else last.w)
    local_sum = loss.metrics_examples(local.X, w)["mean_delta"] * len(local.X) if len(local.X) else 0.0
    return float(comm.allreduce_sum(np.array([local_sum]))[0]) / local.n_examples_total


def party_summary(party):
    """The lines rank 0 prints about party mode at the end of a run."""
    comm = party.comm
    lines = [f"party mode: {comm.size} parties, {comm.messages} masked sums (fixed point 2^{comm.exponent} "
             f"range, {comm.rescales} rescale(s) after overflow); signing key fingerprints "
             f"{', '.join(comm.fingerprints)} ({'checked against the roster' if comm.authenticated else 'NOT authenticated: no --roster'})"]
    if party.private:
        lines.append(f"differential privacy: spent epsilon {party.budget.spent():.4g} (target "
                     f"{party.dp_epsilon:g}) against any coalition of up to {party.dp_coalition} parties, "
                     f"at delta {party.dp_delta:g} over {party.budget.evaluations} "
                     f"evaluations; noise multiplier {party.budget.noise_multiplier:.4g}, clip "
                     f"{party.dp_clip:g}; the lower bound is not certified")
    return "\n".join(lines)


def print_audit_summary(party):
    """Each party prints its own audit summary (what its audit log ends with)."""
    summary = party.audit_summary
    if summary is None:
        return
    trend = ""
    if "local_objective_first" in summary:
        trend = (f"; local objective {summary['local_objective_first']:.6g} -> "
                 f"{summary['local_objective_last']:.6g} "
                 f"({'decreasing' if summary['decreasing'] else 'NOT decreasing'}), "
                 f"{summary['queries_above_first']} queries above the first")
    print(f"party {party.comm.rank}: answered {summary['queries']} queries{trend}; audit log "
          f"{party_path(party.audit_log, party.comm.rank)}", flush=True)


if __name__ == "__main__":
    sys.exit(run(main, "prbmrm.train"))
