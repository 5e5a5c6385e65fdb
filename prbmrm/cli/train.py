"""Train a model: ``python -m prbmrm.cli.train``, a thin layer over :func:`prbmrm.training.fit`.

Run plainly for one process, or under ``mpiexec -n P`` (or ``python -m mpi4py
-m prbmrm.cli.train``) for P ranks, each reading its own block of shard files.
Without ``--data`` it trains on a small real data set shipped in the package.

The command-line layer only: argument parsing, the progress table, the JSON
log and what is printed; the training itself is :mod:`prbmrm.training`.
Imports: the library modules of prbmrm (training, checkpoint, party, ...).
"""

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import os
import shlex
import sys
import time
import warnings

import numpy as np

from ..version import __version__
from .common import ArgumentParser, program, run
from .config import add_config_options, config_section, parse_configured
from ..params import parse_params
from ..checkpoint import SignalFlag
from ..distributed.watch import DEFAULT_ITERATION_TIMEOUT, DEFAULT_TIMEOUT
from ..errors import ConvergenceWarning, InputError, UsageError
from ..io.files import OutputClaim
from ..losses import LOSSES
from ..model import check_writable
from ..party.session import Party, party_path
from ..plugins import PluginHelp
from ..regularizers import REGULARIZERS
from .shard import add_label_column_option
from ..solvers import MAX_ITER_STATUS, SOLVERS
from ..solvers.path import LamPath, PathResult
from ..options import BundleOptions, Checkpointing, PartySettings, Stopping, add_arguments, from_namespace
from ..training import ProgressTable, chain, fit


class JsonLog:
    """Appends each progress row to a JSON-lines file as the run goes (``--log-json``, rank 0).

    Each line is one JSON object with the columns of the model's
    ``/history`` (on a path also ``step`` and ``lam``), a non-finite value
    written as null. A fresh run empties the file when the log is created;
    a resumed run keeps the lines of the iterations before its first one
    (and drops any later ones, written after the checkpoint it resumes
    from), so the log holds every iteration once. Each line is then
    appended with one write and the file closed, so it always holds whole
    lines, those of the iterations done so far, also when the run fails or
    is killed (a record of how far it got). The model file, not the log,
    tells whether a run finished.

    Parameters
    ----------
    path : str
    resumes : bool
        The run may resume from a checkpoint: keep the earlier iterations' lines.

    Raises
    ------
    InputError
        If the file cannot be created.
    """

    def __init__(self, path, resumes=False):
        self.path = path
        self.resumes = resumes
        try:
            open(path, "a" if resumes else "w").close()
        except OSError as error:
            raise InputError(f"{path}: cannot write the --log-json file: {error.strerror or error}") from None

    def _keep_before(self, iteration):
        """Keep only the whole lines of the iterations before `iteration` (a resumed run's first)."""
        self.resumes = False
        with open(self.path, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                break  # a torn last line of a killed run
            if not (line.endswith(b"\n") and isinstance(row, dict) and isinstance(row.get("iteration"), int)
                    and row["iteration"] < iteration):
                break
            kept.append(line)
        if len(kept) < len(lines):
            with open(self.path, "wb") as f:
                f.writelines(kept)

    def __call__(self, row):
        if self.resumes:
            try:
                self._keep_before(row.iteration)
            except OSError as error:
                raise InputError(f"{self.path}: cannot write the --log-json file: "
                                 f"{error.strerror or error}") from None
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


def print_path(path):
    """Print one line per lambda of a path: its objective, bound, gap, iterations and status."""
    print(f"path of {len(path.lams)} lambdas, {sum(r.nit for r in path.results)} iterations in all:\n"
          f"{'lambda':>12} {'objective':>13} {'lower bound':>13} {'gap':>10} {'iter':>6}  status")
    for lam, result in zip(path.lams, path.results):
        print(f"{lam:12.6g} {result.fun:13.6e} {result.lower_bound:13.6e} {result.gap:10.3e} "
              f"{result.nit:6d}  {result.message}")


def build_parser():
    """Return the argument parser of ``python -m prbmrm.cli.train``."""
    parser = ArgumentParser(prog="prbmrm.cli.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="shard directory or glob of shard files "
                        "(python -m prbmrm.cli.shard makes them), or an SVMlight/LIBSVM, .npz or .csv file "
                        "(read on every rank, each keeping its rows); with --parties each party's, a "
                        "template such as 'site-{rank}.h5'; default: the embedded demo data")
    parser.add_argument("--loss", default="hinge", help=PluginHelp("loss: {names} (default hinge)", "loss", LOSSES))
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
    parser.add_argument("--solver", help=PluginHelp("solver: {names} (default: auto for one --lam with a "
                                                    "quadratic --reg: tron, proximal or bmrm by the loss and "
                                                    "the data, bmrm if it stalls; else bmrm)",
                                                    "solver", SOLVERS))
    parser.add_argument("--theta", type=float, help="lsbmrm: next plane at (1 - theta) w_b + theta w_t, "
                        "0 < theta <= 1 (default 0.9)")
    parser.add_argument("--solver-param", action="append", metavar="NAME=VALUE",
                        help="a parameter of the solver, e.g. mu=1e-6 for smooth_lbfgs (repeatable)")
    parser.add_argument("--reg", default="l2",
                        help=PluginHelp("regularizer: {names} (default l2)", "regularizer", REGULARIZERS))
    parser.add_argument("--reg-param", action="append", metavar="NAME=VALUE",
                        help="a parameter of the regularizer, e.g. p=1.5 for lp (repeatable)")
    add_arguments(parser, Stopping)
    add_arguments(parser, BundleOptions)
    parser.add_argument("--bias", action="store_true", help="learn an offset (a constant feature, regularized)")
    parser.add_argument("--positive", type=float, metavar="LABEL",
                        help="one-vs-rest: map LABEL to +1 and every other label to -1 (as prbmrm.cli.shard "
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
    add_arguments(party, PartySettings)
    party.add_argument("--no-audit-log", action="store_true", help="write no audit log")
    return parser


def add_checkpoint_arguments(parser):
    """Add the options of :class:`prbmrm.options.Checkpointing` and ``--rank-timeout``."""
    add_arguments(parser, Checkpointing)
    parser.add_argument("--rank-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="a rank waiting this long in a collective checks that the others still answer; "
                        f"one that does not ends the job, named (default {DEFAULT_TIMEOUT:g}; 0: wait forever)")
    parser.add_argument("--iteration-timeout", type=float, default=DEFAULT_ITERATION_TIMEOUT, metavar="SECONDS",
                        help="a rank that computes this long without reaching the next collective while "
                        "another waits for it (stuck, though it answers pings) ends the job, named "
                        f"(default {DEFAULT_ITERATION_TIMEOUT:g}; 0: no deadline)")


def _check_checkpoint_arguments(args, comm):
    """Check the checkpoint options (:class:`prbmrm.options.Checkpointing`) and that the checkpoint
    path is writable (collective); return the options with the checkpoint to resume from: ``--resume``,
    or with ``--resume-if-exists`` the ``--checkpoint`` file if rank 0 sees it.
    """
    if not (math.isfinite(args.rank_timeout) and args.rank_timeout >= 0):
        raise UsageError(f"--rank-timeout must be >= 0 seconds, got {args.rank_timeout:g}")
    if not (math.isfinite(args.iteration_timeout) and args.iteration_timeout >= 0):
        raise UsageError(f"--iteration-timeout must be >= 0 seconds, got {args.iteration_timeout:g}")
    checkpointing = from_namespace(Checkpointing, args)
    error = None
    if comm.is_root and args.checkpoint is not None:
        try:
            check_writable(args.checkpoint)
        except Exception as problem:
            error = problem
    comm.check(error)
    if not args.resume_if_exists:
        return checkpointing
    # Rank 0 alone reads the checkpoint: its view decides for every rank.
    found = comm.allreduce_max([comm.is_root and os.path.exists(args.checkpoint)])[0]
    return dataclasses.replace(checkpointing, resume=args.checkpoint if found else None, resume_if_exists=False)


# The options that mean nothing without --parties: those of PartySettings that are off by default.
_PARTY_ONLY = ("party_data", *(field.metadata.get("dest") or field.name for field in dataclasses.fields(PartySettings)
                               if field.metadata.get("flag") and field.default in (None, False)))


def party_data(args):
    """The `data` of :func:`fit`: ``--data``, or the ``--party-data`` list (given once with ``{rank}``: a template)."""
    paths = args.party_data
    if not paths:
        return args.data
    template = len(paths) == 1 and party_path(paths[0], 0) != party_path(paths[0], 1)
    return paths[0] if template else paths


def party_from_args(args):
    """Return the :class:`prbmrm.party.session.Party` of ``--parties`` and its options, or None."""
    if not args.parties:
        given = [name for name in _PARTY_ONLY if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --parties")
        return None
    if args.party_data and args.data:
        raise UsageError("give either --data (a template with {rank}) or --party-data, not both")
    if args.data is None and not args.party_data:
        raise UsageError("--parties needs each party's data: --data 'site-{rank}.h5' or --party-data")
    settings = from_namespace(PartySettings, args, **({"audit_log": None} if args.no_audit_log else {}))
    return Party(**dataclasses.asdict(settings))


def main(argv, comm):
    """Entry point of ``python -m prbmrm.cli.train``; returns the exit status."""
    with contextlib.ExitStack() as held:
        return _main(sys.argv[1:] if argv is None else list(argv), comm, held)


def _main(argv, comm, held):
    """:func:`main`, with `held` (an ExitStack) keeping this job's claims on its output files.

    The steps: parse, claim the outputs, train through :func:`prbmrm.training.fit` (which validates
    the options), write the model, report.
    """
    args = parse_configured(build_parser(), argv, comm)
    if args is None:  # --print-config
        return 0
    comm.set_rank_timeout(args.rank_timeout)
    comm.set_iteration_timeout(args.iteration_timeout)
    party = party_from_args(args)
    # In party mode each party that receives the model writes its own file.
    out = args.out if party is None else party_path(args.out, comm.rank)
    writes = comm.is_root if party is None else party.model_to is None or comm.rank in party.model_to
    log = _claim_outputs(args, out, writes, comm, held)
    checkpointing = _check_checkpoint_arguments(args, comm)
    verbose = comm.is_root and not args.quiet
    table = ProgressTable(args.print_every, note=_privacy_note(args, party)) if verbose else None
    phases = PhaseSeconds()
    started = time.perf_counter()
    # A run stopped at --max-iter says so in its last line (below), not as a Python warning.
    with SignalFlag(comm) as interrupted, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = fit(party_data(args), **fit_options(args), checkpointing=checkpointing, party=party,
                    callback=chain(table, log, phases), comm=comm, stop=interrupted,
                    report=print if verbose else None, names="flags",
                    record={key: value for key, value in vars(args).items() if key not in ("quiet", "print_every")})
    status = comm.bcast_object(interrupted.exit_status)
    if party is not None and not args.quiet and not comm.is_root:
        print_audit_summary(party)
    if model is None or (party is None and not comm.is_root):
        return status
    # An interrupted run's model is the best iterate so far: never under the final name.
    written = partial_name(out) if status else out
    if writes:
        model.save(written)
        if not status and os.path.exists(partial_name(out)):
            os.remove(partial_name(out))  # an earlier interrupted run's, now superseded
    if verbose:
        table.finish()
        _print_summary(model, phases.totals, time.perf_counter() - started, party)
        print(f"model written to {written}" if writes else "model not written here (--model-to)")
        if party is not None:
            print_audit_summary(party)
        if model.attrs.get("status") == MAX_ITER_STATUS:
            print(f"not converged: stopped at --max-iter {model.attrs['iterations']} with gap "
                  f"{model.attrs['gap']:.3g}, above the requested one (raise --max-iter, or --checkpoint and resume)")
    if interrupted.signum is not None and comm.is_root:
        print(_interrupted(argv, args, interrupted.signum, model, written, out, comm.size), file=sys.stderr, flush=True)
    return status


def _interrupted(argv, args, signum, model, written, out, ranks):
    """The message of a run stopped by signal `signum`: where its best iterate went, how to continue it."""
    resume = (f"checkpoint written to {args.checkpoint}; to continue: {resume_command(argv, args.checkpoint, ranks)}"
              if args.checkpoint else "no --checkpoint, so it cannot be resumed")
    return (f"{program('prbmrm.cli.train')}: interrupted by signal {signum} after iteration "
            f"{model.attrs['iterations']}; the best iterate so far written to {written}, not to {out}; {resume}")


def fit_options(args):
    """The keywords of :func:`prbmrm.training.fit` that the parsed options `args` give (not yet validated)."""
    return dict(loss=args.loss, loss_params=parse_params(args.loss_param, "--loss-param"), lam=lam_option(args),
                bias=args.bias, solver=args.solver, reg=args.reg, reg_params=parse_params(args.reg_param, "--reg-param"),
                stopping=from_namespace(Stopping, args), bundle=from_namespace(BundleOptions, args),
                theta=args.theta, solver_params=parse_params(args.solver_param, "--solver-param"),
                positive=args.positive, label_column=args.label_column)


def _claim_outputs(args, out, writes, comm, held):
    """Claim the output files before anything is written (collective); return the --log-json log or None."""
    error, log = None, None
    if writes:
        try:
            held.enter_context(OutputClaim({"--out": out, "--checkpoint": args.checkpoint if comm.is_root else None,
                                            "--log-json": args.log_json if comm.is_root else None}, "prbmrm.cli.train"))
            check_writable(out)
            resumes = args.resume is not None or args.resume_if_exists
            log = JsonLog(args.log_json, resumes) if args.log_json and comm.is_root else None
        except Exception as problem:
            error = problem
    comm.check(error)
    return log


def _privacy_note(args, party):
    """The line above the progress table of a run under differential privacy, else None."""
    if party is None or not party.private:
        return None
    return ("note: differential privacy adds noise to every risk and subgradient: the objective, "
            "lower bound and gap below are noisy, the lower bound is NOT certified, and the run "
            f"takes all {args.max_iter} iterations")


def _print_summary(model, totals, seconds, party):
    """Print the end of a run on rank 0: a path's table, party mode's lines, the result, the time."""
    result = model.result
    if isinstance(result, PathResult):
        print_path(result)
        result = result.last
    if party is not None:
        print(party_summary(party))
    a = model.attrs
    # This run's iterations only: a resumed history also holds the earlier runs' rows.
    print(f"{'converged' if result.success else 'stopped'} after {result.nit} iterations "
          f"({result.message}): objective {result.fun:.8g}, lower bound {result.lower_bound:.8g}, "
          f"gap {result.gap:.3g}\n"
          f"seconds: risk {totals['seconds_risk']:.3f}, subproblem {totals['seconds_subproblem']:.3f}, "
          f"comm {totals['seconds_comm']:.3f}, total {seconds:.3f} on {a['ranks']} rank(s); "
          f"{a['n_examples']} examples x {a['n_features']} features"
          f"{' + bias' if a['has_bias'] else ''}; {a['nonzeros']} of {model.w.size} weights nonzero")
    if "train_mean_delta" in a:
        print(f"training mean Delta {a['train_mean_delta']:.6g}")


def resume_command(argv, checkpoint, ranks):
    """The command that continues an interrupted run: this one (`argv`) resuming from `checkpoint`."""
    kept, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--resume":
            skip = True
        elif not word.startswith("--resume="):
            kept.append(word)
    if "--resume-if-exists" not in kept:
        kept += ["--resume", checkpoint]
    name = program("prbmrm.cli.train")
    launch = (f"mpiexec -n {ranks} " if ranks > 1 else "") + (name if name.startswith("prbmrm ")
                                                             else f"{os.path.basename(sys.executable)} -m {name}")
    return " ".join([launch, *map(shlex.quote, kept)])


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


def command(name="prbmrm.cli.train"):
    """Run the command as program `name` and exit with its status."""
    sys.exit(run(main, name))


if __name__ == "__main__":
    command()
