"""Party mode: several data owners train one model; data stays home, only masked sums travel.

Rank r is party r. Each party reads only its own shard files, and every sum
of risks and gradients is a secure aggregation (:class:`prbmrm.party.secure.SecureComm`):
no party, rank 0 included, and nothing on the wire ever carries one party's
risk or gradient, only their sum over all parties. Rank 0 is also the
coordinator: it keeps the bundle and sends each ``w`` to evaluate.

On top of that, optionally:

- ``verify_coordinator``: every party receives the aggregated plane anyway,
  so it runs its own copy of the solver on the same planes and checks that
  each w rank 0 sends is the one the solver prescribes (to round-off);
- an audit log per party: every w it was asked to evaluate, its own local
  risk and regularized risk, and a summary (paper 002, Sec. 4.1: "each data
  owner may check whether R_emp(w) + lam Omega(w) is decreasing on his
  portion of the data");
- differential privacy: each example's (loss, gradient) is clipped to norm C
  and each party adds a share of Gaussian noise to its sums before masking,
  so that the shares of the parties outside any coalition of up to T make
  the whole noise; the (epsilon, delta) spent is accounted by dp-accounting's
  RDP accountant.

Against hostile parties: every message is typed (:mod:`prbmrm.distributed.messages`),
keys are signed and checked against a roster (:mod:`prbmrm.party.keys`), every
party checks each aggregated plane (:mod:`prbmrm.party.guard`), and only masked
sums carry data (:data:`PARTY_SOLVERS`).

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.party.guard`, :mod:`prbmrm.io`,
:mod:`prbmrm.io.loader`, :mod:`prbmrm.io.shards`, :mod:`prbmrm.party.keys`, :mod:`prbmrm.losses`,
:mod:`prbmrm.losses.vector`, :mod:`prbmrm.distributed.messages`, :mod:`prbmrm.options`, :mod:`prbmrm.party.privacy`,
:mod:`prbmrm.distributed.oracle`, :mod:`prbmrm.party.secure`, :mod:`prbmrm.solvers`.
"""

import dataclasses
import json
import math
import os
import time
import warnings

import numpy as np

from ..io import LocalData, collectively, list_shards
from ..io.loader import read_shard_rows
from ..io.shards import spec_label, survey_shards
from ..errors import CollectiveError, CoordinatorError, InputError, PrbmrmError, UsageError
from .guard import AggregateCheck, dp_noise_bound
from ..losses import ScalarLoss
from ..losses.vector import VectorLoss
from ..distributed.messages import ProtocolError, expect_array
from ..options import PartySettings
from .privacy import ClippedLoss, PrivacyBudget
from ..distributed.oracle import run_distributed
from ..solvers import HISTORY_COLUMNS, Result


REPLAYABLE_SOLVERS = ("bmrm", "proximal", "lbfgs")
"""Solvers a party can replay: they talk to the ranks through risk evaluations alone (no line
search or service rounds), so each party can rerun them on the aggregated planes."""

PARTY_SOLVERS = ("bmrm", "lsbmrm", "proximal", "lbfgs", "sublbfgs")
"""Solvers party mode runs: every sum they need is masked (line searches go through risk(w));
``smooth_lbfgs`` runs too with ``--allow-score-sharing``, whose scores it uses."""


class LeakWarning(UserWarning):
    """Party mode was asked to run a loss whose distributed form sends per-example values."""


def party_path(template, rank):
    """Fill a path template such as ``'site-{rank}.h5'`` for party `rank` (a path without a field is kept)."""
    try:
        return template.format(rank=rank)
    except (KeyError, IndexError, ValueError) as error:
        raise UsageError(f"{template!r}: not a path template with the field {{rank}} ({error})") from None


def load_party(spec, comm, *, bias=False):
    """Load this party's own shard files; agree with the other parties on the data's format.

    Each party's files are a complete shard set of its own (``python -m
    prbmrm.cli.shard`` run on its data alone). The parties then exchange only
    their feature count, label kind, classes and whether they have query ids;
    the total number of examples is a secure sum.

    Parameters
    ----------
    spec : str or list of str
        This party's files (a directory, a glob or a file, as for
        :func:`prbmrm.io.list_shards`), or a list with one such entry per
        party, in rank order. A string may be a template with the field
        ``{rank}``, filled with this party's rank.
    comm : prbmrm.party.secure.SecureComm
    bias : bool

    Returns
    -------
    LocalData
        With ``row_offset`` 0: a party's place among the others' rows is not
        known to it.

    Raises
    ------
    CollectiveError
        On every rank, if any party's files are bad or the parties disagree.
    UsageError
        If a list does not hold one entry per party.
    """
    if isinstance(spec, (list, tuple)):
        if len(spec) != comm.size:
            raise UsageError(f"party mode needs one data path per party (--party-data, or the [privacy] "
                             f"table's data): got {len(spec)} for {comm.size} parties")
        spec = spec[comm.rank]
    else:
        spec = party_path(os.fspath(spec), comm.rank)

    def own_set():
        files = list_shards(spec)
        label = spec_label(spec, files)
        return survey_shards(files, label)

    metas = collectively(comm, own_set)
    mine = {"d": int(metas[0]["d"]), "kind": metas[0]["kind"], "has_qid": bool(metas[0]["has_qid"])}
    shared = [comm.bcast_object([mine, metas[0]["classes"]], root=r, limit=_FORMAT_BYTES)
              for r in range(comm.size)]
    comm.check(_malformed(shared) or _disagreement(shared))
    kind, classes = _label_union(shared)
    X, y, qid = collectively(comm, read_shard_rows, metas, bias)
    n_total = int(comm.allreduce_sum(np.array([len(y)], dtype=np.int64))[0])
    return LocalData(X=X, y=y, qid=qid, n_features=mine["d"], n_examples_total=n_total,
                     label_kind=kind, classes=classes, files=[m["path"] for m in metas],
                     bias=bool(bias), row_offset=0,
                     blocks=[0] + np.cumsum([m["n"] for m in metas]).tolist())


_FORMAT_BYTES = 1 << 16  # a party's data format: a few fields and its classes


def _malformed(shared):
    """A ProtocolError naming the first party whose data format message is not of the schema, or None."""
    for party, message in enumerate(shared):
        try:
            if not (isinstance(message, list) and len(message) == 2 and isinstance(message[0], dict)
                    and set(message[0]) == {"d", "kind", "has_qid"}):
                raise ValueError("not [{d, kind, has_qid}, classes]")
            fields, classes = message
            if not (type(fields["d"]) is int and fields["d"] > 0 and isinstance(fields["kind"], str)
                    and len(fields["kind"]) < 32 and type(fields["has_qid"]) is bool):
                raise ValueError(f"bad fields {str(fields)[:200]}")
            if classes is not None:
                expect_array(classes, np.float64, (None,), "classes")
        except ValueError as error:
            return ProtocolError(f"party {party} sent a malformed data format message: {error}")
    return None


# Label kinds of one label per example: each party's kind says which values its own labels
# take (one party may lack a class), so the parties' kinds combine through their values.
_VALUE_KINDS = ("binary", "integer", "real")


def _disagreement(shared):
    """An InputError naming the first thing party 0 and another party disagree on, or None."""
    (first, first_classes), show = shared[0], lambda c: "[" + ", ".join(f"{v:g}" for v in c) + "]"
    for party, (theirs, classes) in enumerate(shared):
        for key, what in (("d", "the number of features"), ("has_qid", "query ids")):
            if theirs[key] != first[key]:
                return InputError(f"parties disagree on {what}: party 0 has {first[key]!r}, "
                                  f"party {party} has {theirs[key]!r}")
        kinds = {first["kind"], theirs["kind"]}
        if not kinds <= set(_VALUE_KINDS) and len(kinds) > 1:
            return InputError(f"parties disagree on the label kind: party 0 has {first['kind']!r}, "
                              f"party {party} has {theirs['kind']!r}")
        # Label sets and targets index the columns of y: they must be the same everywhere.
        if not kinds <= set(_VALUE_KINDS) and not np.array_equal(classes, first_classes):
            return InputError(f"parties disagree on the columns of y: party 0 has "
                              f"{show(first_classes)}, party {party} has {show(classes)}")
    return None


def _label_union(shared):
    """The label kind and classes of all parties' data together (as one conversion would find)."""
    kinds = {theirs["kind"] for theirs, _ in shared}
    if not kinds <= set(_VALUE_KINDS):
        return kinds.pop(), shared[0][1]
    if "real" in kinds:
        return "real", None
    classes = np.unique(np.concatenate([c for _, c in shared]))
    return ("binary" if classes.size == 2 else "integer"), classes


class AuditLog:
    """A party's own record of every query: JSON lines, one per w it was asked to evaluate.

    The first line describes the run (party, rows, lam, the parties' key
    fingerprints); each query line holds ``query``, ``w`` (exact: JSON
    keeps every float64 digit), ``local_risk`` (the mean loss over this
    party's rows, clipped under differential privacy; null for a
    non-decomposable loss, whose risk only rank 0 forms) and
    ``local_objective`` = lam Omega(w) + local_risk; the last line is always
    the ``summary`` of :meth:`close`, with how the run ended (``outcome``).
    Until then a provisional summary (outcome ``"unfinished: ..."``) follows
    the last line and is replaced by each new one, so a log ends with a
    summary even when its party is killed (SIGKILL included) or stopped.

    Parameters
    ----------
    path : str
    party : int
    n_local : int
    lam : float
    regularizer : object
        Provides ``value(w)``.
    decomposable : bool
    header : dict
        More fields for the first line.
    """

    def __init__(self, path, party, n_local, lam, regularizer, decomposable, header):
        self.path = path
        self._file = open(path, "w")
        self.n_local = n_local
        self.lam = lam
        self.regularizer = regularizer
        self.decomposable = decomposable
        self.objectives = []
        self.summary = None
        self._end = 0  # where the provisional summary starts
        self._write({"party": party, "rows": n_local, "lam": lam, "started": time.time(), **header})

    def _write(self, record, outcome=None):
        self._file.seek(self._end)
        self._file.truncate()
        self._file.write(json.dumps(record) + "\n")
        if outcome is None:
            self._end = self._file.tell()
            self._file.write(json.dumps({"summary": self._summary(
                "unfinished: the run stopped before this party closed its log (killed?)")}) + "\n")
        self._file.flush()

    def note(self, record):
        """Add a line, e.g. ``{"deviation": message}``."""
        self._write(record)

    def __call__(self, w, partials):
        """Record one query (an observer of the risk oracle)."""
        record = {"query": len(self.objectives) + 1}
        if self.decomposable and self.n_local:
            risk = float(np.sum(partials[:, -1])) / self.n_local
            objective = self.lam * float(self.regularizer.value(w)) + risk
            record.update(local_risk=risk, local_objective=objective)
            self.objectives.append(objective)
        else:
            record.update(local_risk=None, local_objective=None)
            self.objectives.append(math.nan)
        record["w"] = w.tolist()
        self._write(record)

    def close(self, outcome="completed"):
        """Write and return the summary: how the run ended, queries answered, the local objective's trend.

        Only the first call writes; later ones return the same summary.

        ``decreasing`` is the paper's check: is the local regularized risk
        of the last query below that of the first? ``queries_above_first``
        counts the queries whose local objective exceeded the first one's
        (BMRM's early iterates may; a run that keeps doing so deserves a look).
        """
        if self.summary is None:
            self.summary = self._summary(outcome)
            self._write({"summary": self.summary}, outcome)
            self._file.close()
        return self.summary

    def _summary(self, outcome):
        J = np.asarray(self.objectives)
        summary = {"outcome": outcome, "queries": len(J)}
        if len(J) and np.isfinite(J).all():
            summary.update(local_objective_first=float(J[0]), local_objective_last=float(J[-1]),
                           local_objective_best=float(J.min()), decreasing=bool(J[-1] < J[0]),
                           queries_above_first=int(np.count_nonzero(J > J[0])))
        return summary


class CoordinatorCheck:
    """The risk oracle a verifying party hands its own copy of the solver.

    Called with the w this party's solver prescribes, it receives the w rank
    0 sent, compares the two, evaluates this party's share at rank 0's w (so
    the planes stay those of the run) and returns the aggregated plane.

    Parameters
    ----------
    oracle : prbmrm.distributed.oracle.DistributedRisk
    comm : prbmrm.party.secure.SecureComm
    tolerance : float
        Largest ``max |w_sent - w_own| / max |w_own|`` accepted (exact
        equality when w_own is 0).
    log : AuditLog, optional
        Where a deviation is also noted.
    """

    def __init__(self, oracle, comm, tolerance, log=None):
        self.oracle = oracle
        self.comm = comm
        self.tolerance = tolerance
        self.log = log
        self.queries = 0

    @property
    def last_seconds(self):
        """dict: the oracle's timings of the last evaluation."""
        return self.oracle.last_seconds

    def _deviated(self, what):
        message = (f"the coordinator deviated from the protocol: {what} (party {self.comm.rank} "
                   "replays the solver on the aggregated planes)")
        if self.log is not None:
            self.log.note({"deviation": message})
        self.comm.report_deviation(CoordinatorError(message))

    def __call__(self, w):
        self.queries += 1
        sent = self.oracle.receive()
        if sent is None:
            self._deviated(f"it stopped after {self.queries - 1} evaluations, where the solver "
                           "asks for another one")
            raise _Stopped
        self.check(sent, w, f"at evaluation {self.queries} the w it sent")
        return self.oracle.answer()

    def check(self, sent, own, what):
        """Report a deviation if `sent` differs from `own` by more than the tolerance."""
        scale = float(np.max(np.abs(own), initial=0.0))
        difference = float(np.max(np.abs(sent - own), initial=0.0))
        if not difference <= self.tolerance * scale:
            self._deviated(f"{what} differs from the one the solver prescribes by {difference:.3g} "
                           f"(max |w| {scale:.3g}, tolerance {self.tolerance:g} relative)")

    def finish(self):
        """After this party's solver stopped: the coordinator must stop too."""
        if self.oracle.receive() is not None:
            self._deviated(f"it asked for evaluation {self.queries + 1} after the solver stopped")
            self.oracle.answer()  # the sum carries the report: every rank raises


_RESULT_SCALARS = {"fun": float, "lower_bound": float, "gap": float, "nit": int, "status": int, "message": str}


def _result_message(result):
    """The typed message of rank 0's result (no bundle: the parties need the model and its history)."""
    message = {key: getattr(result, key) for key in _RESULT_SCALARS}
    message.update(w=result.w, w_last=result.w_last,
                   history={key: np.asarray(result.history[key], dtype=np.float64) for key in HISTORY_COLUMNS})
    return message


def _result_from(message, dim):
    """The Result of rank 0's message, every field checked against its schema.

    Raises
    ------
    ProtocolError
        On every party alike (they all received the same bytes), naming the coordinator.
    """
    try:
        if not (isinstance(message, dict) and set(message) == {*_RESULT_SCALARS, "w", "w_last", "history"}):
            raise ValueError("not the fields of a result")
        scalars = {}
        for key, kind in _RESULT_SCALARS.items():
            value = message[key]
            if kind is float and type(value) is int:
                value = float(value)
            if type(value) is not kind:
                raise ValueError(f"{key} is a {type(value).__name__}, not a {kind.__name__}")
            scalars[key] = value
        history = message["history"]
        if not (isinstance(history, dict) and set(history) == set(HISTORY_COLUMNS)):
            raise ValueError("history: not the columns of a history")
        rows = len(history["iteration"]) if isinstance(history["iteration"], np.ndarray) else None
        history = {key: expect_array(history[key], np.float64, (rows,), f"history {key}") for key in history}
        return Result(w=expect_array(message["w"], np.float64, (dim,), "w"),
                      w_last=expect_array(message["w_last"], np.float64, (dim,), "w_last"),
                      history=history, **scalars)
    except ValueError as error:
        raise ProtocolError(f"the result the coordinator (party 0) sent is malformed: {error}") from None


class _Stopped(Exception):
    """The coordinator stopped before this party's solver did (already reported)."""


class Party:
    """Party mode: its options, then its state during :func:`prbmrm.training.fit`.

    Parameters
    ----------
    model_to : sequence of int, optional
        The parties that receive the final model (:func:`fit` returns it
        there); every party by default.
    allow_score_sharing : bool
        Accept a non-decomposable loss, whose per-example scores (and, once,
        labels) every party sends to rank 0 unmasked; warns with
        :class:`LeakWarning`.
    verify_coordinator : bool
        Every party replays the solver and checks each w of rank 0.
    tolerance : float
        Relative tolerance of that check.
    audit_log : str or None
        Path template of each party's audit log (``{rank}`` is filled); None: none.
    dp_epsilon, dp_delta : float, optional
        Differential privacy target over the whole run (both or neither).
    dp_clip : float
        Per-example clipping norm C of (loss, gradient).
    dp_coalition : int, optional
        T: the privacy target holds against any T colluding parties (0 to
        P - 1); P - 2 by default, the coalitions secure aggregation resists.
    signing_key : str, optional
        Path template of this party's signing key file (``{rank}`` is filled;
        :mod:`prbmrm.party.keys`); a fresh, unauthenticated key if not given.
    roster : str, optional
        The roster file every party holds: the expected signing key of each
        party. Without it keys are not authenticated (compare the printed
        fingerprints out of band).

    Attributes
    ----------
    comm : prbmrm.party.secure.SecureComm
        Set by :meth:`start`.
    budget : PrivacyBudget or None
    audit_summary : dict or None
        This party's audit summary, after the run.
    """

    def __init__(self, *, model_to=None, allow_score_sharing=False, verify_coordinator=False,
                 tolerance=1e-9, audit_log="audit-{rank}.jsonl", dp_epsilon=None, dp_delta=None,
                 dp_clip=1.0, dp_coalition=None, signing_key=None, roster=None):
        self.model_to = None if model_to is None else sorted(set(int(r) for r in model_to))
        self.allow_score_sharing = allow_score_sharing
        self.verify_coordinator = verify_coordinator
        self.tolerance = float(tolerance)
        self.audit_log = audit_log
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.dp_clip = float(dp_clip)
        self.dp_coalition = dp_coalition
        self.signing_key = signing_key
        self.roster = roster
        self.comm = None
        self.budget = None
        self.audit_summary = None
        self._audit = None
        self._check_options()

    @property
    def private(self):
        """bool: differential privacy is on."""
        return self.dp_epsilon is not None

    def _check_options(self):
        PartySettings(**{field.name: getattr(self, field.name) for field in dataclasses.fields(PartySettings)})

    def start(self, comm, *, solver, max_iter):
        """Check the run's options against party mode and agree on the keys (collective)."""
        if self.model_to is not None and not all(0 <= r < comm.size for r in self.model_to):
            raise UsageError(f"--model-to names parties {self.model_to}, but there are {comm.size} "
                             f"(0 to {comm.size - 1})")
        if solver not in PARTY_SOLVERS + (("smooth_lbfgs",) if self.allow_score_sharing else ()):
            raise UsageError(f"party mode runs solvers whose every message is a masked sum "
                             f"({', '.join(PARTY_SOLVERS)}; smooth_lbfgs with --allow-score-sharing), not "
                             f"{solver!r}" + (": it needs maxima over the parties, which would travel in "
                                              "the clear" if solver.startswith("pragam") else ""))
        if self.verify_coordinator and solver == "smooth_lbfgs":
            raise UsageError("--verify-coordinator cannot replay solver 'smooth_lbfgs': rank 0 alone "
                             "evaluates its smoothed loss")
        if self.verify_coordinator and solver not in REPLAYABLE_SOLVERS:
            raise UsageError(f"--verify-coordinator replays solvers that only evaluate the risk "
                             f"({', '.join(REPLAYABLE_SOLVERS)}), not {solver!r}")
        noise_std = 0.0
        if self.private:
            if solver != "proximal":
                # BMRM's first step goes to -a/lam: a noisy plane from that far lies above the risk
                # near the optimum by |<noise, w_1>| and the cutting-plane model stalls there.
                raise UsageError(f"differential privacy runs with --solver proximal (got {solver!r}): "
                                 "its steps stay near the prox-center, where noisy planes are accurate, "
                                 "and it makes one release per iteration")
            if self.dp_coalition is None:
                self.dp_coalition = comm.size - 2
            if not 0 <= self.dp_coalition < comm.size:
                raise UsageError(f"--dp-coalition must be 0 to {comm.size - 1} (parties - 1), "
                                 f"got {self.dp_coalition}")
            self.budget = PrivacyBudget(self.dp_epsilon, self.dp_delta, max_iter)
            noise_std = self.budget.share(self.dp_clip, comm.size, self.dp_coalition)
        # Imported here: cryptography costs a plain (non-party) run's start-up ~0.1 s.
        from .keys import load_roster, load_signing_key
        from .secure import SecureComm

        key = roster = None
        problem = None
        try:
            if self.signing_key is not None:
                key = load_signing_key(party_path(self.signing_key, comm.rank))
            if self.roster is not None:
                roster = load_roster(self.roster)
        except InputError as error:
            problem = error
        comm.check(problem)
        self.comm = SecureComm(comm, noise_std, key, roster, allow_scores=self.allow_score_sharing)
        return self.comm

    def check_loss(self, loss):
        """Refuse (or, if allowed, warn about) a loss whose distributed form leaks per-example values.

        Returns the loss the oracle evaluates: the loss itself, or under
        differential privacy its :class:`ClippedLoss`. Call after ``loss.prepare``.
        """
        if not loss.decomposable:
            leak = (f"loss {loss.name!r} is not decomposable: every iteration each party's per-example "
                    "scores f_i = <w, x_i> go to rank 0 unmasked, and before the first one its "
                    "labels (and query ids); rank 0 returns per-example coefficients")
            if not self.allow_score_sharing:
                raise UsageError(f"{leak}; pass --allow-score-sharing to accept that, or use a "
                                 "decomposable loss")
            warnings.warn(f"party {self.comm.rank}: {leak}", LeakWarning, stacklevel=2)
        if not self.private:
            return loss
        if not isinstance(loss, (ScalarLoss, VectorLoss)):
            raise UsageError(f"differential privacy clips each example's loss and gradient: loss "
                             f"{loss.name!r} has no per-example gradient (scalar and multiclass "
                             "losses do)")
        return ClippedLoss(loss, self.dp_clip)

    def attach(self, oracle, local, lam, regularizer, loss):
        """Hook the audit log, the privacy accountant and the poisoning checks to the oracle."""
        oracle.line_searches = False  # their breakpoints would travel as a maximum
        oracle.service_points = False  # parties see each w, and their secure sums have their own precision
        noise_bound = None
        if self.private:
            total_std = self.comm.noise_std * math.sqrt(self.comm.size)
            noise_bound = dp_noise_bound(local.n_examples_total, self.dp_clip, total_std, oracle.dim)
        floor = loss.risk_floor if math.isfinite(loss.risk_floor) else None
        oracle.inspector = AggregateCheck(self.comm, local.n_examples_total, floor, noise_bound)
        observers = []
        if self.audit_log is not None:
            self._audit = AuditLog(party_path(self.audit_log, self.comm.rank), self.comm.rank,
                                   local.n_local, lam, regularizer, loss.decomposable,
                                   {"parties": self.comm.size, "files": local.files,
                                    "key_fingerprints": self.comm.fingerprints,
                                    "keys_authenticated": self.comm.authenticated})
            observers.append(self._audit)
        if self.budget is not None:
            observers.append(self.budget.spend)
        if observers:
            oracle.observer = lambda *args: [observer(*args) for observer in observers]

    def run(self, oracle, solve):
        """Run `solve` on rank 0, serve or replay it on the other parties; hand out the result.

        Returns
        -------
        prbmrm.solvers.Result or None
            On the parties of `model_to` (rank 0 always has it): None elsewhere.
        """
        comm = self.comm
        own = None
        outcome = "error"
        try:
            if comm.is_root:
                result = run_distributed(oracle, solve)
            elif self.verify_coordinator:
                own = self._replay(oracle, solve)
            else:
                oracle.serve()
            message = comm.bcast_object(_result_message(result) if comm.is_root else None)
            problem = None
            if not comm.is_root:
                try:
                    result = _result_from(message, oracle.dim)
                except ProtocolError as error:
                    problem = error
            try:
                comm.check(problem)  # every party read it, or every party stops
            except CollectiveError as error:
                raise ProtocolError(str(error), sender=0) from None
            if own is not None:
                CoordinatorCheck(oracle, comm, self.tolerance, self._audit).check(result.w, own.w,
                                                                                  "the final model")
            comm.settle()
            outcome = "completed"
        except BaseException as error:
            outcome = f"error: {error}" if isinstance(error, PrbmrmError) else f"{type(error).__name__}"
            raise
        finally:
            if self._audit is not None:
                self.audit_summary = self._audit.close(outcome)
        if comm.is_root or self.model_to is None or comm.rank in self.model_to:
            return result
        return None

    def _replay(self, oracle, solve):
        check = CoordinatorCheck(oracle, self.comm, self.tolerance, self._audit)
        try:
            own = solve(check)
        except _Stopped:
            return None
        except CollectiveError:
            raise
        except PrbmrmError:
            # This replay failed where rank 0 did not fail yet: answer it until it stops.
            oracle.serve()
            raise
        check.finish()
        return own

    def model_attrs(self):
        """Model-file attributes of party mode (on rank 0 after the run)."""
        attrs = {"parties": self.comm.size,
                 "secure_aggregation": "pairwise masks in Z_2^64, X25519 + HKDF-SHA256 + ChaCha20",
                 "fixed_point_exponent": self.comm.exponent, "fixed_point_rescales": self.comm.rescales,
                 "key_fingerprints": self.comm.fingerprints, "keys_authenticated": self.comm.authenticated,
                 "verify_coordinator": self.verify_coordinator, "lower_bound_certified": not self.private}
        if self.private:
            # The accountant's epsilon holds against any coalition of up to dp_coalition parties.
            attrs.update(dp_epsilon=self.budget.spent(), dp_delta=self.dp_delta, dp_coalition=self.dp_coalition,
                         dp_target_epsilon=self.dp_epsilon, dp_noise_multiplier=self.budget.noise_multiplier,
                         dp_clip=self.dp_clip, dp_evaluations=self.budget.evaluations)
        return attrs
