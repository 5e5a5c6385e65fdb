"""Training: :func:`fit`, the one front door; :func:`run`, the run it makes on this process's share of the data.

:func:`fit` (also :func:`prbmrm.fit`) takes the data and the options as
keywords, validates them once (:func:`run`), trains and returns a
:class:`prbmrm.model.Model` on every rank; the command line
(:mod:`prbmrm.cli.train`) and the estimators (:mod:`prbmrm.estimators`) call
it. :func:`run` loads the data (:mod:`prbmrm.io`), checks that the loss suits
its labels (two classes of any values are mapped to -1/+1), builds the
distributed risk (:mod:`prbmrm.distributed.oracle`) and runs a solver
(:mod:`prbmrm.solvers`), with checkpoints (:mod:`prbmrm.checkpoint`) and party
mode (:mod:`prbmrm.party.session`) when asked; :func:`build_model` turns its
result into a model, :class:`ProgressTable` prints the progress (``verbose``).

Imports: numpy and the library modules of prbmrm (io, losses, regularizers,
solvers, risk, checkpoint, party, model, structured); never the CLI modules.
"""

import contextlib
import dataclasses
import inspect
import json
import math
import numbers
import os
import signal
import sys
import threading
import time
import warnings

import numpy as np

from .checkpoint import SignalFlag, checkpointing, verify_state
from .io import STRUCTURED, split_local
from .errors import ConvergenceWarning, InputError, UsageError
from .io.inputs import describe_mapping, load_input, map_one_vs_rest
from .losses import get_loss
from .model import Model
from .options import BundleOptions, Checkpointing, Stopping, python_names, split_keywords
from .party.session import load_party
from .regularizers import get_regularizer
from .distributed.oracle import DistributedRisk, run_distributed
from .solvers import MAX_ITER_STATUS, SOLVERS, default_solver, get_solver, minimize, solver_options
from .solvers.auto import pick_solver, runs_alone, successor
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
    Stopping(epsilon, rel_epsilon, max_iter)
    BundleOptions(idle_age, bundle_size)
    if theta is not None:
        if solver != "lsbmrm":
            raise UsageError(f"--theta is an option of --solver lsbmrm, not of {solver!r}")
        check_theta(theta)


def fit(data=None, *, verbose=False, record=None, names="keywords", **options):
    """Train a model and return it: the one front door (also :func:`prbmrm.fit`).

    Call it on every rank with the same arguments. The options are
    validated once, on every rank together, before any data is read.

    Parameters
    ----------
    data : str, list of str, tuple (X, y) or (X, y, options), RaggedExamples, or None
        As for :func:`run` (shards, a text file, arrays; None: the demo data).
    verbose : bool
        Print the progress table (and the line naming the solver) on rank 0.
    record : dict, optional
        The options the model records in ``attrs["options"]`` (default: the
        keywords given that are numbers, strings or booleans).
    names : {"keywords", "flags"}
        How error messages name the options: as the keywords of this function
        (``lam``), or as the command line's flags (``--lam``).
    **options
        The keywords of :func:`run`: ``loss``, ``lam``, ``bias``, ``solver``,
        ``reg``, ``epsilon``, ``rel_epsilon``, ``max_iter``, ``positive``,
        ``checkpoint``, ``resume``, ``callback``, ``warm`` (a Model or
        Result of an earlier run on the same data: its w and planes start
        this one, whatever its lam), ...

    Returns
    -------
    prbmrm.model.Model
        On every rank (in party mode: on the parties that receive the
        model, None on the others), with the training summary, the label
        mapping in ``attrs`` and, on rank 0, the solver's result in
        ``result``. A run stopped by Ctrl-C (SIGINT) returns the best
        iterate so far with a warning (and, with ``checkpoint``, a
        checkpoint to resume from).

    Raises
    ------
    prbmrm.errors.PrbmrmError
        For bad options or data (UsageError, InputError), on every rank alike.
    """
    from .distributed.comm import get_comm

    comm = options["comm"] = options.get("comm") or get_comm()
    table = ProgressTable() if verbose and comm.is_root else None
    if table is not None:
        options["callback"] = chain(table, options.get("callback"))
        options["report"] = chain(print, options.get("report"))
    if names != "flags" and options.get("report") is not None:  # the lines name keywords too
        options["report"] = lambda line, report=options["report"]: report(python_names(line))
    # From Python, Ctrl-C ends the run at the next iteration, which keeps its best iterate.
    interrupt = (_Interrupt(comm) if options.get("stop") is None and threading.current_thread() is threading.main_thread()
                 else contextlib.nullcontext())
    started = time.perf_counter()
    try:
        with interrupt:
            if isinstance(interrupt, _Interrupt):
                options["stop"] = interrupt
            result, local, loss = run(data, **options)
    except UsageError as error:
        if names == "flags":
            raise
        raise UsageError(python_names(str(error))) from None
    if table is not None:
        table.finish()
    given = inspect.signature(run).bind(data, **options)
    given.apply_defaults()
    given = given.arguments
    mean_delta = training_mean_delta(result, local, loss, comm) if loss.structured else None
    model = None
    if result is not None:
        last = getattr(result, "last", result)
        if record is None:
            record = {key: value for key, value in options.items() if isinstance(value, (str, int, float, bool))}
        record = dict(record, solver=last.solver)
        name = given["loss"]
        model = build_model(result, local, loss, comm.size, time.perf_counter() - started,
                            lam=given["lam"], loss_name=name if isinstance(name, str) else loss.name,
                            loss_params=given["loss_params"], solver=last.solver, reg=given["reg"],
                            reg_params=given["reg_params"], bias=given["bias"],
                            data=data if isinstance(data, str) else DEMO_NAME if data is None else "arrays",
                            options=record)
        model.result = result
        if mean_delta is not None:
            model.attrs["train_mean_delta"] = mean_delta
        if given["party"] is not None:
            model.attrs.update(given["party"].model_attrs())
    if given["party"] is None:
        model = Model.broadcast(model, comm)
    if model is not None and model.attrs.get("status") == MAX_ITER_STATUS:
        warnings.warn(f"stopped at max_iter={model.attrs['iterations']} before the gap test held: gap "
                      f"{model.attrs['gap']:.3g} (the best iterate is returned; raise max_iter, or resume from a "
                      "checkpoint)", ConvergenceWarning, stacklevel=2)
    if getattr(interrupt, "signum", None) is not None and model is not None:
        path = options.get("checkpoint") or getattr(options.get("checkpointing"), "checkpoint", None)
        saved = f"; checkpoint written to {path}" if path else ""
        warnings.warn(f"interrupted (signal {interrupt.signum}) after iteration {model.attrs['iterations']}: "
                      f"returning the best iterate so far{saved}", RuntimeWarning, stacklevel=2)
    return model


class _Interrupt(SignalFlag):
    """Ctrl-C alone asks a run started from Python to stop (the command line handles more signals)."""

    SIGNALS = (signal.SIGINT,)


def chain(*functions):
    """One callable that calls each of `functions` that is not None with its argument; None if all are."""
    functions = [function for function in functions if function is not None]
    if len(functions) < 2:
        return functions[0] if functions else None

    def call(argument):
        for function in functions:
            function(argument)

    return call


def run(data=None, *, loss="hinge", loss_params=None, lam=1e-4, bias=False, solver=None, reg="l2",
        reg_params=None, stopping=None, bundle=None, checkpointing=None, theta=None, solver_params=None,
        callback=None, comm=None, stop=None, party=None, positive=None, label_column=0, report=None,
        warm=None, **fields):
    """Train a linear model with a bundle method on this process's share of the data.

    :func:`fit` calls it and makes a :class:`prbmrm.model.Model` of what it
    returns. Call it on every rank with the same arguments.

    Parameters
    ----------
    data : str, list of str, tuple (X, y) or (X, y, options), RaggedExamples, or None
        A shard directory, glob or list of shard files (each rank opens only
        its own block), an SVMlight/LIBSVM, ``.npz`` or ``.csv`` file (read
        on every rank, which keeps its block of rows: see
        :func:`prbmrm.io.inputs.load_input`), or in-memory arrays ``(X, y)`` present on every rank
        (each rank keeps its block of rows); `options` are keywords of
        :func:`prbmrm.io.split_local` (``qid``, ``label_kind``, ``classes``).
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
        None: :func:`prbmrm.solvers.default_solver`'s choice for the data (its dimension),
        recorded in ``result.solver``.
    reg : str or prbmrm.regularizers.Regularizer
        A key of :data:`prbmrm.regularizers.REGULARIZERS`, or a regularizer
        object (then `reg_params` is ignored).
    reg_params : dict, optional
        The regularizer's parameters (``--reg-param NAME=VALUE``).
    stopping : prbmrm.options.Stopping, optional
        The stopping rule: ``epsilon``, ``rel_epsilon`` (stop when the gap
        is at most `epsilon`, or at most `rel_epsilon` times the best
        objective: `epsilon` alone stops on the absolute gap only,
        `rel_epsilon` alone or neither on the relative one, default 1e-3,
        both on whichever is met first) and ``max_iter``. Under
        differential privacy, where the gap is noisy, the run takes
        `max_iter` iterations.
    bundle : prbmrm.options.BundleOptions, optional
        ``idle_age`` (drop planes idle this many iterations; 0: never),
        ``bundle_size`` (keep at most this many planes, aggregating the
        oldest; 0: no limit) and ``bundle_memory`` (a budget in bytes for the
        planes, e.g. ``"2GB"``, at least two dense planes: the bytes the
        planes hold, sparse planes counted as stored, aggregating the oldest
        when one more might not fit; 0: none).
    checkpointing : prbmrm.options.Checkpointing, optional
        ``checkpoint`` (rank 0 writes the solver's state to this file every
        ``checkpoint_every`` iterations, at `max_iter` and on `stop`; see
        :mod:`prbmrm.checkpoint`) and ``resume`` (continue from this
        checkpoint; UsageError on every rank if its options or data differ).
    **fields
        Fields of those three by name (``epsilon=1e-4``, ``max_iter=50``,
        ``checkpoint="ck.h5"``, ...), over the objects given or the defaults.
    theta : float, optional
        ``lsbmrm`` only: where the next plane is taken between the line
        search's point and the model's minimizer (None: the solver's 0.9).
    solver_params : dict, optional
        The solver's own parameters (``--solver-param NAME=VALUE``, see
        :func:`prbmrm.solvers.solver_options`).
    callback : callable, optional
        Called on rank 0 with a :class:`prbmrm.solvers.Progress` per iteration.
    comm : prbmrm.distributed.comm.SerialComm or MPIComm, optional
        Defaults to :func:`prbmrm.distributed.comm.get_comm`.
    stop : callable, optional
        ``stop() -> bool``, checked on rank 0 between iterations: True ends the
        run (status 5 with a final checkpoint; status 3 for a solver without
        checkpoints).
    party : prbmrm.party.session.Party, optional
        Party mode: rank r is party r, `data` names each party's own files
        (a template with ``{rank}``, or a list with one entry per party) and
        every sum is a secure aggregation (see :mod:`prbmrm.party.session`).
    positive : float, optional
        One-vs-rest: map this label to +1 and every other to -1 (as
        ``prbmrm shard --positive``); recorded in the model.
    label_column : int, str or list, default 0
        CSV input: the label column (number or header name).
    report : callable, optional
        Called on rank 0 with each line that describes the input (a CSV's
        header and label column, the label mapping), before training.
    warm : prbmrm.solvers.Result or prbmrm.model.Model, optional
        Rank 0: a result (or model) of an earlier run on the same data and
        loss (any lam): start from its w and, for a solver that keeps a
        bundle, its planes and multipliers, which bound R_emp whatever lam
        (as on a lambda path); for dual coordinate descent (also as auto's
        pick), its dual point. One lam only.

    Returns
    -------
    result : prbmrm.solvers.Result, prbmrm.solvers.path.PathResult or None
        On rank 0 (a PathResult for several lambdas; in party mode also on the
        parties that receive the model); None on the other ranks. ``result.w``
        is flat: reshape it to ``(n_features [+ 1 with bias], loss.n_outputs)``
        for multi-output losses.
    local : prbmrm.io.LocalData
        This rank's data, as loaded.
    loss : prbmrm.losses.Loss
        The loss, prepared for the data's labels.
    """
    from .distributed.comm import get_comm

    comm = get_comm() if comm is None else comm
    stopping, bundle, checkpointing = option_groups(stopping, bundle, checkpointing, fields)
    chosen, solver = solver, solver or default_solver(lam, reg, warm is not None, party is not None)
    check_options(lam, stopping.epsilon, stopping.rel_epsilon, stopping.max_iter, bundle.idle_age,
                  bundle.bundle_size, solver, theta)
    epsilon, rel_epsilon = stopping.tolerances
    if party is not None:
        if not isinstance(lam, numbers.Real) or checkpointing.checkpoint or checkpointing.resume:
            raise UsageError("party mode trains one lambda and takes no --checkpoint or --resume")
        comm = party.start(comm, solver=solver, max_iter=stopping.max_iter)
        if party.private:
            # A noisy gap certifies nothing (it even goes negative): use the whole budget.
            epsilon = rel_epsilon = -math.inf
    loss_object = get_loss(loss, **(loss_params or {})) if isinstance(loss, str) else loss
    # Bundle limits are parameters of the solvers that keep a bundle; others refuse them.
    bundle_size = bundle.bundle_size
    limits = {name: value for name, value in (("bundle_size", bundle_size), ("bundle_memory", bundle.bundle_memory))
              if value}
    own = dict(solver_params or {}, **limits,
               **({} if theta is None else {"theta": theta}))
    options = solver_options(solver, own)
    if party is not None and party.private and solver == "proximal":
        # BMRM's points go far from the prox-center, where noisy planes are poor: plain Alg. 1.
        options.setdefault("null_steps", 0)
    regularizer = get_regularizer(reg, **(reg_params or {})) if isinstance(reg, str) else reg
    local = _load(data, comm, party, bias, positive, label_column, report)
    if positive is None and party is None:
        _two_classes(local, loss_object, data, comm, report)
    _check_task(loss_object, local, data, bias, comm)
    loss_object.prepare(local.classes, local.label_kind)
    evaluated = loss_object if party is None else party.check_loss(loss_object)
    oracle = DistributedRisk(evaluated, local.X, local.y, local.n_examples_total, comm, local.blocks,
                             local.qid)
    regularizer.prepare(oracle.dim, loss_object.risk_floor)
    if chosen is None and party is None:
        # The default weighs the model's dimension, known only now (the same on every rank).
        solver = default_solver(lam, regularizer, warm is not None)
        options = solver_options(solver, own)
    w0 = regularizer.initial_point(oracle.dim)
    path = not isinstance(lam, numbers.Real)
    if path and (checkpointing.checkpoint or checkpointing.resume):
        raise UsageError("--checkpoint and --resume do not apply to a lambda path")
    callback, options = _checkpoint_options(comm, local, callback, options, checkpointing.checkpoint,
                                            checkpointing.checkpoint_every, checkpointing.resume, stop,
                                            loss_object, regularizer, checkpointing.checkpoint_key, oracle.fixed_point,
                                            lam=lam, solver=solver, bias=bias,
                                            idle_age=bundle.idle_age, bundle_size=bundle_size,
                                            max_iter=stopping.max_iter)
    if warm is not None:
        if path:
            raise UsageError("a warm start applies to one lambda, not to a path")
        w0 = _flat_weights(warm) if isinstance(warm, Model) and warm.result is None else warm.w
        warm = warm.result if isinstance(warm, Model) else warm
        parameters = inspect.signature(get_solver(solver)).parameters
        if getattr(warm, "bundle", None) is not None and "bundle" in parameters:
            options = dict(options, bundle=warm.bundle, alpha=warm.alpha)
        if getattr(warm, "dual", None) is not None and "dual" in parameters:
            options = dict(options, dual=warm.dual)
    if report is not None and comm.is_root:
        reason = "as given" if chosen is not None else _default_reason(lam, regularizer, warm, oracle.dim)
        said = f"solver {solver} ({reason})"
        if solver == "auto" and not path:  # on a path each lam picks its own
            first, why = pick_solver(oracle, regularizer)
            alone = runs_alone(options.get("state"), options.get("checkpoint"))
            said += f": {first} first, as {why}; " + ("no hand-over, as it checkpoints" if alone else
                                                      f"{successor(oracle, regularizer)} takes over if it stalls")
        report(describe_run(local, loss_object, regularizer, lam, bias, comm.size, (epsilon, rel_epsilon),
                            stopping.max_iter) + "; " + said)
        if "state" in options:
            report(f"resumed at iteration {options['state']['iteration']} from {checkpointing.resume}")

    def solve(risk):
        if "state" in options:  # a resumed run: check the checkpoint's claims before trusting them
            verify_state(options["state"], risk, lam, regularizer, checkpointing.resume)
        result = (minimize_path if path else minimize)(
            risk, w0, lam, method=solver, reg=regularizer, epsilon=epsilon, rel_epsilon=rel_epsilon,
            max_iter=stopping.max_iter, idle_age=bundle.idle_age, callback=callback, **options)
        for one in result.results if path else [result]:
            one.solver = solver
        return result

    if party is None:
        return run_distributed(oracle, solve), local, loss_object
    party.attach(oracle, local, lam, regularizer, loss_object)
    return party.run(oracle, solve), local, loss_object


def describe_run(local, loss, regularizer, lam, bias, ranks, tolerances, max_iter):
    """The line that says what a run does: data shape, ranks, loss, regularizer, lam, stopping rule
    (`tolerances` as the solvers take them, ``-inf``: none)."""
    count = lam.n if isinstance(lam, LamPath) else np.size(lam)
    lams = f"lam {lam:g}" if isinstance(lam, numbers.Real) else f"a path of {count} lambdas"
    epsilon, rel_epsilon = tolerances
    tests = [f"gap <= {epsilon:g}"] * (epsilon > 0) + [f"gap <= {rel_epsilon:g} x objective"] * (rel_epsilon > 0)
    rule = f"stops at {' or '.join([*tests, f'{max_iter} iterations'])}" if tests else f"takes all {max_iter} iterations"
    return (f"training on {local.n_examples_total} examples x {local.n_features} features{' + bias' * bool(bias)}, "
            f"{ranks} rank(s): loss {loss.name}, {regularizer.name} {lams}; {rule}")


def _default_reason(lam, regularizer, warm, dim):
    """Why :func:`prbmrm.solvers.default_solver` chose as it did: the facts it weighs."""
    one = "one lam" if isinstance(lam, numbers.Real) else "a lambda path"
    kind = "quadratic" if getattr(regularizer, "quadratic", False) else regularizer.name
    return (f"the default for a {kind} regularizer, {one}{', a warm start' * (warm is not None)} and "
            f"{dim} weights; --solver to choose")


def _flat_weights(model):
    """The flat w of a solver (weights, then the bias row) of a model."""
    k = model.w.shape[1] if model.w.ndim == 2 else 1
    W = model.w.reshape(-1, k)
    if model.attrs.get("has_bias"):
        W = np.vstack([W, np.reshape(model.bias, (1, k))])
    return W.ravel()


def _two_classes(local, loss, data, comm, report):
    """Map two class labels of any values to -1/+1 (the larger to +1) for a loss that needs -1/+1,
    as the estimators do; the mapping is recorded in the model (``positive``, ``negative``)."""
    classes = local.classes
    if (local.label_kind not in ("binary", "integer") or classes is None or len(classes) != 2
            or loss.check_labels(classes, local.label_kind) is None
            or loss.check_labels(np.array([-1.0, 1.0]), "binary") is not None):
        return
    map_one_vs_rest(local, float(classes[1]), data if isinstance(data, str) else "data", comm)
    if report is not None and comm.is_root:
        report(f"labels: {classes[0]:g} -> -1, {classes[1]:g} -> +1 (two classes; --positive LABEL "
               "chooses the +1 class)")


def option_groups(stopping, bundle, checkpointing, fields):
    """The three option objects of :func:`fit`: those given (or the defaults) with `fields` over them.

    Raises
    ------
    TypeError
        For a keyword that is no field of theirs.
    UsageError
        For a value the groups refuse (each validates itself when built).
    """
    grouped, unknown = split_keywords(fields)
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {next(iter(unknown))!r}")
    given = {Stopping: stopping, BundleOptions: bundle, Checkpointing: checkpointing}
    return tuple(dataclasses.replace(given[group] or group(), **grouped[group]) if grouped[group]
                 else given[group] or group() for group in (Stopping, BundleOptions, Checkpointing))


def _load(data, comm, party, bias, positive, label_column, report):
    """This rank's :class:`prbmrm.io.LocalData` of `data` as :func:`fit` takes it (collective);
    rank 0 reports what describes the input."""
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
    return local


def _check_task(loss_object, local, data, bias, comm):
    """Raise UsageError (InputError for structured examples, collectively) unless the loss suits the data."""
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


def _checkpoint_options(comm, local, callback, options, path, every, resume, stop, loss, regularizer, key, sums,
                        **run):
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
                             max_iter=run["max_iter"], stop=stop, key=key, sums=sums)
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


def _absolute_files(params):
    """`params` with file names made absolute, so `prbmrm.cli.predict` finds them from any directory."""
    return {name: os.path.abspath(value) if isinstance(value, str) and os.path.isfile(value) else value
            for name, value in params.items()}


def build_model(result, local, loss, ranks, seconds, *, lam, loss_name, loss_params, solver, reg, reg_params,
                bias, data, options):
    """Return the :class:`prbmrm.model.Model` of a run: weights, training summary and label mapping.

    Parameters
    ----------
    result : prbmrm.solvers.Result or prbmrm.solvers.path.PathResult
        Rank 0's result of :func:`fit`.
    local : prbmrm.io.LocalData
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
             "iterations": last.nit, "status": last.status, "converged": bool(last.success),
             "message": last.message,
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
