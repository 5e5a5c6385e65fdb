"""The distributed risk oracle ``risk(w) -> (R_emp(w), a)`` (paper 000, Alg. 5).

Rank 0 runs the solver and calls the oracle; every other rank sits in
:meth:`DistributedRisk.serve`. One evaluation is::

    rank 0:   [w, flag]  --Bcast-->  every rank
    every rank: (risk_sum, grad_sum) of each of its canonical blocks of rows
              <--ONE Allreduce: int64 fixed-point limbs of the blocks' sums (2 (d + 1) words; (d + 1) after
                 set_limbs(1)) and every rank's status (failure, signals caught)-->   R = risk_sum / m,  a = grad_sum / m

The flag rides with ``w``: no extra message stops the workers. A service may make the points instead (BMRM's copy
of its planes on every rank, :mod:`prbmrm.solvers.mirror`): then every serving rank waits for a short message,
and an evaluation is::

    rank 0:   [payload (t + 1 words: BMRM's multipliers and a checksum of w), its length, POINT]  --Bcast-->
    every rank: w = service.point(payload), the blocks' sums at w, the same ONE Allreduce, service.evaluated(w)

while any other message is announced by a short one (LONG) and follows whole; the short message grows by
doubling when a payload needs it (RESIZE), and the service's end (DETACH) brings back long messages. Sums are formed per canonical block of rows (which do
not depend on the rank count, :func:`prbmrm.io.load_local`) and added exactly
(:meth:`prbmrm.distributed.comm.SerialComm.exact_sum`): any number of ranks computes bitwise the same R and a, and
BMRM takes the same path. A failure on any rank at any point of its evaluation rides in the same Allreduce, so every
rank raises the same error together. A rank holding several blocks of sparse data with many columns keeps each
block's partial sum on its columns only (:class:`prbmrm.distributed.comm.SupportRows`, :data:`COMPACT_PARTIALS`).
A scalar loss on CSR data makes one pass over the nonzeros for ``f = X w`` and one over those of the rows with
``l' != 0`` for ``X^T l'``, per group of consecutive blocks (:func:`prbmrm.kernels.blocks.csr_scalar_pass`; compiled
on large data of at most 2^16 columns, :func:`prbmrm.kernels.blocks.csr_compiled_pass`); on large dense data one
compiled pass reads each row once for both (:func:`prbmrm.kernels.blocks.dense_scalar_pass`).

A line search (:meth:`DistributedRisk.line`, for LS-BMRM) is a session of the same loop::

    rank 0:   [w_b, LINE], then d  --Bcast-->  every rank: F0 = X w_b, dF = X d once,
                                               and the loss's line objects of its blocks
    per round of K <= 16 trial steps:
    rank 0:   [eta_1..eta_K, lo, hi, K, flag]  --Bcast-->  every rank: its blocks' sums
              of losses, left and right slopes at F0 + eta_j dF
              <--reproducible Allreduce (3 K values per block)--
              <--Allreduce-max (2 K values)-- the breakpoints nearest each eta_j

so a round makes no pass over X (O(K log m_local) for piecewise-linear losses, O(K m_local) for the others) and
moves a few numbers per rank; a scalar loss gives one line object per group of blocks of up to 8,192 rows, which
keeps each block's sums apart (:meth:`prbmrm.losses.Loss.lines`). A structured loss
(:class:`prbmrm.structured.StructuredLoss`) runs the same loop on blocks of ragged examples; it has no scores
``X w``, so :meth:`DistributedRisk.line` declines and line searches go through ``risk(w)``. Solvers that need more
than ``risk(w)`` (Pragam keeps dual variables on every rank) attach a service: :meth:`DistributedRisk.attach`
builds it on every rank, and each :meth:`DistributedRisk.request` runs one of its collective steps everywhere.

Every message a serving rank acts on is a fixed-shape float64 buffer whose flag must be one of the closed table
of kinds above; a service is named by its entry in :data:`SERVICES` and built with JSON arguments. An unknown
kind or service stops every serving rank with a :class:`~prbmrm.distributed.messages.ProtocolError` naming rank 0.

Imports: numpy; of prbmrm: :mod:`prbmrm.distributed.comm`, :mod:`prbmrm.distributed.exact`, :mod:`prbmrm.errors`,
:mod:`prbmrm.kernels.blocks`, :mod:`prbmrm.distributed.messages`.
"""

import importlib
import math
import time

import numpy as np

from .comm import SupportRows
from .exact import FixedPointSum, chunks
from ..errors import CollectiveError, JointError, PrbmrmError
from ..kernels.blocks import (block_gradients, block_groups, block_scores, chunk_bounds, compiled_passes,
                      csr_compact_pass, csr_compiled_pass, csr_groups, csr_scalar, csr_scalar_pass, dense_scalar_pass,
                      row_block, row_range, same_index_dtype)
from ..kernels.order import Workspace
from .messages import ProtocolError

_EVALUATE, _STOP, _FAIL, _LINE, _END, _ATTACH, _REQUEST = 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0
_GATHERED = 7.0  # evaluate a non-decomposable loss on rank 0 from the gathered scores (its loss is not spread)
# The short message of a service that makes the points (:meth:`DistributedRisk.evaluate_point`): evaluate at the
# service's point; a long message follows; the short message grows to the capacity in word 0; the service ends.
_POINT, _LONG, _RESIZE, _DETACH = 8.0, 9.0, 10.0, 11.0
_LIMBS = 12.0  # the exact sums take the limbs in word 0 from now on

SHORT_WORDS = 64
"""The first capacity of the short message (it doubles when a payload needs more, one message more each time)."""

SERVICES = {}
"""The services a solver may attach, by name: the only code a message from rank 0 can select."""

SERVICE_MODULES = {"pragam": "prbmrm.solvers.pragam", "argsup": "prbmrm.solvers.sublbfgs",
                   "tron": "prbmrm.solvers.tron", "planes": "prbmrm.solvers.mirror",
                   "dcd": "prbmrm.solvers.dcd"}
"""The module that enters each service (solvers load on first use: a serving rank imports it on attach)."""

POINT_SERVICES = ("planes",)
"""The services that make the points (``points = True``, :meth:`DistributedRisk.evaluate_point`): refused where
:attr:`DistributedRisk.service_points` is False (party mode, whose parties check every w)."""

GATHERING_SERVICES = ("dcd",)
"""The services that gather every rank's rows onto rank 0: refused where :attr:`DistributedRisk.service_points`
is False too (party mode, whose data never leave their party)."""


def service(name):
    """Class decorator: enter a service class in :data:`SERVICES` under `name`."""
    def register(cls):
        cls.service_name = name
        SERVICES[name] = cls
        return cls
    return register


def _unexpected(what):
    return ProtocolError(f"rank 0 (the coordinator in party mode) sent {what}: not a message of the protocol",
                         agreed=False)


MAX_TRIALS = 16
"""Most trial steps of one round of a line search (one broadcast, one reduction)."""


COMPACT_PARTIALS = 0.125
"""A rank holding several blocks of a scalar loss on CSR data keeps each block's partial sum on the
block's columns only (:class:`prbmrm.distributed.comm.SupportRows`) when that takes at most this fraction of the
bytes of dense rows: gathering and scattering a support costs more per entry than adding dense rows
(d = 2^22, 2 blocks of a third of the bytes each: 0.13-0.18 s per evaluation against 0.11 s), so
only a large saving (many blocks, d in the millions) pays."""


def _partials_storage(csr, blocks, dim):
    """Return the per-block partial sums' storage and, for :class:`~prbmrm.distributed.comm.SupportRows`, the one
    dense row the blocks are computed into (else None)."""
    if csr and len(blocks) > 1:
        # The supports' sizes from one mark per column, set and cleared block by block (no sort of each
        # block's indices unless the supports are kept).
        mark, entries = np.zeros(dim + 1, dtype=bool), 0
        for X, _, _ in blocks:
            mark[X.indices] = True
            entries += np.count_nonzero(mark) + 1
            mark[X.indices] = False
        # 16 bytes per kept entry (int64 index, float64 value) against 8 per entry of a dense row.
        if 16 * entries <= COMPACT_PARTIALS * 8 * len(blocks) * (dim + 1):
            return SupportRows([np.unique(X.indices) for X, _, _ in blocks], dim + 1), np.zeros(dim + 1)
    return np.empty((len(blocks), dim + 1)), None  # per block: gradient, risk


class DistributedRisk:
    """Empirical risk of a loss over the shards of all ranks.

    Parameters
    ----------
    loss : prbmrm.losses.Loss
        The loss; its ``loss_gradient`` runs on this rank's shard.
    X : scipy.sparse.csr_matrix, ndarray or prbmrm.structured.RaggedExamples
        This rank's examples (with the bias column if any); a structured loss's ragged examples (with labels).
    y : ndarray or None
        This rank's labels (None for ragged examples, which hold theirs).
    n_total : int
        Number of examples over all ranks: R_emp is the sum divided by it.
    comm : prbmrm.distributed.comm.SerialComm or MPIComm
        The communicator.
    blocks : sequence of int, optional
        Local row boundaries ``[0, n_1, ..., n_local]`` of the canonical blocks (:attr:`prbmrm.io.LocalData.blocks`).
    qid : ndarray, optional
        This rank's query ids, handed to the loss with each block.

    Attributes
    ----------
    dim : int
        Length of ``w``: features times the loss's ``n_outputs``.
    last_seconds : dict
        Seconds spent by this rank in the last evaluation, under ``"risk"`` (its own data pass) and ``"comm"``
        (broadcast and Allreduce, which include waiting for the slowest rank).
    total_seconds : dict
        The same, summed over all evaluations.
    evaluations : int
        Number of evaluations so far.
    observer : callable or None
        Called on every rank at each evaluation, before the sums travel, as ``observer(w, partials)``: the w
        evaluated and this rank's partial sums (one row per block, gradient then risk; valid until the sum,
        which overwrites the first row): an array, or :class:`~prbmrm.distributed.comm.SupportRows` where each block's row is kept
        on its columns (indexing it gives dense rows). Party mode's audit log is one.
    inspector : callable or None
        Called on every rank after each evaluation's sum, as ``inspector(w, sums)`` (party mode's poisoning
        checks); it raises on every rank together or on none.
    fixed_point : prbmrm.distributed.exact.FixedPointSum
        The bounds of the exact sums, agreed by all ranks (a checkpoint keeps them).
    line_searches : bool
        False makes :meth:`line` decline (party mode: a line search's breakpoints travel as a maximum, in the clear).
    service_points : bool
        False tells solvers not to send the multipliers of their points (:meth:`evaluate_point`) nor to sum with
        one limb (:meth:`set_limbs`), and the serving ranks to refuse the services that gather the rows
        (:data:`GATHERING_SERVICES`): party mode, whose parties check the coordinator's w and sum securely.
    """

    def __init__(self, loss, X, y, n_total, comm, blocks=None, qid=None):
        self.loss = loss
        self.n_total = int(n_total)
        self.comm = comm
        self.dim = loss.weight_dim(X.shape[1])
        bounds = [0, X.shape[0]] if blocks is None else list(blocks)
        self._csr = csr_scalar(loss, X, qid)
        if self._csr:
            X = same_index_dtype(X)
        self._X, self._y, self._bounds = X, y, np.asarray(bounds, dtype=np.intp)
        self._line_groups = block_groups(self._bounds)
        self._blocks = [(row_block(X, a, b), row_range(y, a, b), row_range(qid, a, b))
                        for a, b in zip(bounds[:-1], bounds[1:])]
        self._partials, self._scratch = _partials_storage(self._csr, self._blocks, self.dim)
        self._n_parts, self._dense, self._csr_compiled = compiled_passes(
            loss, X, y, qid, self._bounds, self._partials, self._scratch is not None, comm)
        # Only the pass chosen is planned (a compiled pass needs neither groups nor chunks).
        if self._scratch is not None:
            # Compact rows are computed a block at a time; a block's sums do not depend on its group.
            self._groups = [csr_groups(X, y, [0, X.shape[0]]) for X, y, _ in self._blocks]
        elif self._csr and self._csr_compiled is None:
            self._groups = csr_groups(X, y, bounds)
        elif not self._csr and self._dense is None:
            # Chunks never cross a block, so sums stay the same on any number of ranks;
            # a query must stay whole, so losses with query ids keep their blocks whole.
            self._chunks = [[(row_block(X, a + s, a + t), row_range(y, a + s, a + t), None)
                             for s, t in chunk_bounds(X, a, b)] if qid is None else [block]
                            for block, a, b in zip(self._blocks, bounds[:-1], bounds[1:])]
        # For a loss evaluated on rank 0 (not spread): labels and query ids travel to rank 0 once, at
        # the first such evaluation; per iteration only scores do.
        self._qid, self._counts = qid, None
        # A spread loss's arrays (and the scores), kept from one evaluation to the next.
        self._work = Workspace()
        self.fixed_point = FixedPointSum(self.dim + 1, self._n_parts)
        self._message = np.zeros(self.dim + 1)  # w, then the control flag
        # While a service makes the points: [payload, its length, flag], what the serving ranks wait for.
        self._short = None
        self.service_points = True
        # The sums overwrite the first block's partials once those are encoded (every evaluation fills the
        # partials anew before reading them): no other array of length d + 1 where this rank holds a block.
        dense_rows = isinstance(self._partials, np.ndarray) and len(self._partials)
        self._sums = self._partials[0] if dense_rows else np.zeros(self.dim + 1)
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
        self.total_seconds = {"risk": 0.0, "comm": 0.0}
        self.evaluations = 0
        self.observer = self.inspector = None
        self.line_searches = True
        self._received_seconds, self._deferred_error = 0.0, None
        # Line search sessions: the direction, the trial message [etas, lo, hi, count, flag], the blocks' lines.
        self._direction = np.zeros(self.dim)
        self._trial = np.zeros(MAX_TRIALS + 4)
        self._lines = self._line_error = self._service = None
        self._line_open = False

    @property
    def blocks(self):
        """list of (X, y): this rank's canonical blocks of rows, in order (views, not copies)."""
        return [(X, y) for X, y, _ in self._blocks]

    @property
    def rows(self):
        """(X, y, bounds): this rank's rows and labels whole, and the local row boundaries of its canonical
        blocks (``[0, n_1, ..., n_local]``)."""
        return self._X, self._y, self._bounds

    @property
    def n_parts(self):
        """int: the number of canonical blocks over all ranks (see ``comm.reproducible_sum``)."""
        return self._n_parts

    @property
    def subgradient_out(self):
        """ndarray of shape (dim,): an `out` for :meth:`__call__` that takes no memory of its own.

        The oracle's sums of the gradient, which a call with this `out` scales in place into ``a``: it
        stays valid until the next evaluation. A solver that copies each ``a`` (BMRM's planes) needs no
        other array of length d for it.
        """
        return self._sums[:-1]

    def __call__(self, w, out=None):
        """Return ``(R_emp(w), a)`` with ``a`` a subgradient of R_emp at `w` (rank 0 only).

        Parameters
        ----------
        w : ndarray of shape (dim,)
        out : ndarray of shape (dim,), optional
            Where to write ``a`` (float64, not `w`) instead of a new array; :attr:`subgradient_out` costs nothing.

        Returns
        -------
        risk : float
        subgradient : ndarray of shape (dim,)
            `out`, or a new array, owned by the caller.
        """
        started = time.perf_counter()
        if self.comm.size == 1 and isinstance(w, np.ndarray) and w.dtype == np.float64 and w.shape == (self.dim,):
            # Nothing to send: the pass reads w, not a copy.
            self._evaluate(0.0, np.ascontiguousarray(w), self._gathers())
        else:
            # Rank 0's loss decides (smooth_lbfgs swaps it for a smoothed one on rank 0 alone).
            self._message[:-1] = w
            self._send(_GATHERED if self._gathers() else _EVALUATE)
            self._evaluate(time.perf_counter() - started, self._message[:-1], self._message[-1] == _GATHERED)
        return self._answer(out)

    def evaluate_point(self, payload, w, out=None):
        """Return ``(R_emp(w), a)`` at the point that the attached service makes of `payload` (rank 0 only).

        Only `payload` travels, in a short message, not `w`: every serving rank
        computes the point itself (``point(payload)`` of its service, which
        must give `w`, rank 0's point, bitwise; ``evaluated(w)`` of the service
        follows each evaluation). For a service with ``points = True``, on a
        decomposable loss; one broadcast of ``len(payload) + 2`` words and the
        evaluation's one Allreduce.

        Parameters
        ----------
        payload : array_like of float
            What the service needs to make the point.
        w : ndarray of shape (dim,)
            Rank 0's point.
        out : ndarray of shape (dim,), optional
            As for :meth:`__call__`.

        Returns
        -------
        risk : float
        subgradient : ndarray of shape (dim,)
        """
        started = time.perf_counter()
        payload = np.asarray(payload, dtype=np.float64)
        if len(payload) + 2 > len(self._short):
            capacity = max(2 * (len(self._short) - 2), len(payload))
            self._short[0], self._short[-1] = capacity, _RESIZE
            self.comm.bcast_array(self._short)
            self._short = np.zeros(capacity + 2)
        self._short[:len(payload)] = payload
        self._short[-2:] = len(payload), _POINT
        self.comm.bcast_array(self._short)
        self._evaluate(time.perf_counter() - started, w, False)
        return self._answer(out)

    def set_limbs(self, limbs):
        """Sum with `limbs` (2 or 1) integer words per component from the next evaluation on, on every rank
        (rank 0 only; :meth:`prbmrm.distributed.exact.FixedPointSum.set_limbs`): one limb halves the bytes of
        each Allreduce, and :meth:`error_bound` then bounds what it adds to the error."""
        if limbs not in (1, 2):
            raise ValueError(f"a fixed-point sum has 1 or 2 limbs, not {limbs!r}")
        if self.comm.size > 1:
            self._message[0] = limbs
            self._send(_LIMBS)
        self.fixed_point.set_limbs(limbs)

    def component_bounds(self, part):
        """Bounds on the errors of the last ``(a, R_emp)`` against the exact sums of the blocks' partials over m.

        Parameters
        ----------
        part : slice
            Components of ``[a, R_emp]`` (R_emp is component `dim`).

        Returns
        -------
        ndarray or None
            The bounds, the same on every rank; None with two limbs, whose error is far below the
            partials' own rounding (:mod:`prbmrm.distributed.exact`). With one limb: the sum's
            :meth:`~prbmrm.distributed.exact.FixedPointSum.error_bound` over m, plus the rounding of that
            division (at most ``2^-53 |value|``), rounded up.
        """
        bound = self.fixed_point.error_bound(self._sums, part)
        if bound is None:
            return None
        value = self._sums[part] / self.n_total  # with the bits of result()
        return (bound / self.n_total + np.ldexp(np.abs(value), -53) + 2.0 ** -1074) * (1.0 + 2.0 ** -40)

    def error_bound(self, w):
        """What the errors of the last ``(R_emp, a)``, evaluated at `w`, can add to its plane.

        Returns
        -------
        (float, float, float) or None
            With one limb, for the :meth:`component_bounds` e_r of R_emp and e of a: ``e_r``,
            ``sum_j e_j |w_j|`` and ``||e||_2`` (:func:`prbmrm.solvers.base.rounding_margin`); None with two
            limbs. Computed a chunk at a time: at d in the millions, no array of length d.
        """
        if self.fixed_point.limbs == 2:
            return None
        weighted = squares = 0.0
        for part in chunks(self.dim):
            bound = self.component_bounds(part)
            weighted += float(np.dot(bound, np.abs(w[part])))
            squares += float(np.dot(bound, bound))
        return float(self.component_bounds(slice(self.dim, None))[0]), weighted, math.sqrt(squares)

    def _answer(self, out):
        """``(R_emp, a)`` of the last sums, `a` in `out` if given; rank 0's deferred error first."""
        if self._deferred_error is not None:
            error, self._deferred_error = self._deferred_error, None
            raise error
        return self.result(out)

    def result(self, out=None):
        """Return ``(R_emp, a)`` of the last evaluation, on any rank (the same bits on every rank).

        Parameters
        ----------
        out : ndarray of shape (dim,), optional
            Where to write ``a`` instead of a new array.
        """
        return self._sums[-1] / self.n_total, np.divide(self._sums[:-1], self.n_total, out=out)

    def _send(self, flag):
        """Broadcast the long message with `flag` (rank 0); while a service makes the points, a short
        message says that it follows."""
        self._message[-1] = flag
        if self._short is not None:
            self._short[-1] = _LONG
            self.comm.bcast_array(self._short)
        self.comm.bcast_array(self._message)

    def _receive(self):
        """Wait for rank 0's next message (every rank but 0); return its flag."""
        while self._short is not None:
            self.comm.bcast_array(self._short)
            flag = self._short[-1]
            if flag == _RESIZE:
                capacity = int(self._short[0])
                if not 0 < capacity <= 2 * self.dim + 2 * SHORT_WORDS:
                    raise _unexpected(f"a short message of {capacity} words")
                self._short = np.zeros(capacity + 2)
                continue
            if flag != _LONG:
                return flag
            break
        self.comm.bcast_array(self._message)
        return self._message[-1]

    def _gathers(self):
        """Whether rank 0 evaluates the loss from the gathered scores: a non-decomposable loss not spread, or a
        communicator without the sort's collectives (party mode's, whose parties send their scores to rank 0
        alone, as its warning says)."""
        return not self.loss.decomposable and not (self.loss.spread and hasattr(self.comm, "alltoallv_array"))

    def _evaluate(self, bcast_seconds, w, gathered, error=None):
        """Evaluate this rank's share at `w` and sum over the ranks; with an `error` (this rank could not
        make its point; a decomposable loss) enter the sum as failed."""
        started = time.perf_counter()
        exchange = 0.0
        if self.loss.decomposable:
            # Whatever goes wrong here (a MemoryError, an interrupt, a bug), this rank still enters the
            # evaluation's one Allreduce, its failure in the status: no rank waits in another collective.
            try:
                if error is None:
                    self._decomposable_partials(w)
                    if self.observer is not None:
                        self.observer(w, self._partials)
            except BaseException as problem:  # noqa: B036 - re-raised on every rank below
                error = problem
        else:
            exchange, error = self._multivariate_partials(w, gathered)
            if self.observer is not None:
                self.observer(w, self._partials)
        computed = time.perf_counter()
        # Into the same array every time: a fresh one would be a second d-vector while the old one is still held.
        self.comm.exact_sum(self._partials, self.fixed_point, failed=error is not None, signal=self.comm.signalled,
                            out=self._sums)
        if not np.isfinite(self._sums[-1]):
            # Every rank sees the same sums and status: all check and raise together (none is left in serve()).
            try:
                self.comm.check(_described(error, self.comm.rank))
            except CollectiveError as failed:
                raise JointError(str(failed)) from error
        if self.inspector is not None:
            self.inspector(w, self._sums)
        self.last_seconds = {"risk": computed - started - exchange,
                             "comm": bcast_seconds + exchange + time.perf_counter() - computed}
        for key, seconds in self.last_seconds.items():
            self.total_seconds[key] += seconds
        self.evaluations += 1

    def _decomposable_partials(self, w):
        """Fill the partial sums of a decomposable loss at `w`, one row per block."""
        if self._scratch is not None:
            csr_compact_pass(self.loss, self._groups, w, self._scratch, self._partials)
        elif self._csr_compiled is not None:
            csr_compiled_pass(self._csr_compiled, self._X, w)
        elif self._csr:
            csr_scalar_pass(self.loss, self._groups, w, self._partials)
        elif self._dense is not None:
            dense_scalar_pass(self._dense, self._X, self._y, self._bounds, w, self._partials)
        else:
            for partial, pieces in zip(self._partials, self._chunks):
                partial[:] = 0.0
                for X, y, qid in pieces:
                    risk, gradient = self.loss.loss_gradient(w, X, y, qid)
                    partial[-1] += risk
                    partial[:-1] += gradient.ravel()

    def _multivariate_partials(self, w, gathered):
        """Fill the partial sums of a non-decomposable loss; return the seconds spent exchanging and the error.

        A :attr:`~prbmrm.losses.MultivariateLoss.spread` loss orders the scores
        across ranks and gives each rank the coefficients of its examples;
        otherwise scores go to rank 0 and per-example coefficients come back.
        Each rank forms ``X.T @ c`` of its blocks: only scalars cross ranks.
        """
        scores = block_scores(self._X, self._blocks, w, self._work.array("scores", self._X.shape[0], np.float64))
        if not gathered:
            return 0.0, self._spread_partials(scores)
        started = time.perf_counter()
        if self._counts is None:
            self._counts = self.comm.gather_counts(len(scores))
            self._all_y = self.comm.gather_scalars(self._y)
            self._all_qid = None if self._qid is None else self.comm.gather_scalars(self._qid)
        all_scores = self.comm.gather_scalars(scores)
        exchange = time.perf_counter() - started
        risk_sum, coefficients = 0.0, None
        if self.comm.is_root:
            try:
                risk_sum, coefficients = self.loss.coefficients(all_scores, self._all_y, self._all_qid)
            except Exception as error:
                # Finish this evaluation's collectives first, so that the other
                # ranks are back in serve() when rank 0 stops them with the error.
                self._deferred_error = error
                risk_sum, coefficients = np.nan, np.zeros(len(all_scores))
        started = time.perf_counter()
        local = self.comm.scatter_scalars(coefficients, self._counts)
        exchange += time.perf_counter() - started
        block_gradients(self._X, self._blocks, self._bounds, local, self._partials)
        self._partials[:, -1] = 0.0
        # The risk is known on rank 0 alone: it enters the sum once.
        self._partials[0, -1] = risk_sum
        return exchange, None

    def _spread_partials(self, scores):
        """The partial sums of a spread loss from this rank's `scores`; return the error, if any.

        The loss's own collectives run alike on every rank (its errors come from
        global counts, so every rank raises together); the seconds they take count as risk.
        """
        try:
            risks, local = self.loss.local_coefficients(scores, self._y, self.comm, self._bounds, work=self._work)
        except Exception as error:
            self._partials.fill(np.nan)
            return error
        block_gradients(self._X, self._blocks, self._bounds, local, self._partials)
        self._partials[:, -1] = risks
        return None

    def line(self, w, d):
        """Open a line search along ``w + eta d`` (rank 0 only; the other ranks follow in serve()).

        Every rank computes the scores ``F0 = X w`` and ``dF = X d`` of its
        rows once, and the loss's line object of each group of its blocks
        (:meth:`prbmrm.losses.Loss.lines`); each round of trial steps then
        costs O(K log m_local) per rank for piecewise-linear losses (O(K
        m_local) for the others), one small reproducible Allreduce and one
        Allreduce-max.

        Returns
        -------
        RiskLine or None
            The session, to be closed (``with`` closes it); None if the loss
            does not decompose over examples, needs query ids or is
            structured (it has no scores ``X w``), or :attr:`line_searches`
            is False: the caller then searches through ``risk(w)`` itself.
        """
        if (not self.loss.decomposable or self.loss.needs_qid or self.loss.structured
                or not self.line_searches):
            return None
        started = time.perf_counter()
        self._message[:-1] = w
        self._send(_LINE)
        self._direction[:] = d
        self.comm.bcast_array(self._direction)
        self._line_open = True
        comm_seconds = time.perf_counter() - started
        session = RiskLine(self, self._open_line())
        session.add_seconds(time.perf_counter() - started - comm_seconds, comm_seconds)
        return session

    def _open_line(self):
        """Set up this rank's part of a line search; return whether it is exact.

        An error is kept for the first round, which reports it on every rank.
        """
        self._line_error = None
        try:
            F0, dF, b = self.scores(self._message[:-1]), self.scores(self._direction), self._bounds
            # One line object per group of blocks, with the sums of each canonical block
            # apart: they do not depend on the ranks.
            self._lines = [self.loss.lines(F0[b[i]:b[j]], dF[b[i]:b[j]], row_range(self._y, b[i], b[j]),
                                           b[i:j + 1] - b[i]) for i, j in self._line_groups]
            return all(line.exact for line in self._lines)
        except Exception as error:
            self._line_error = error
            return False

    @property
    def groups(self):
        """list of (first, end, bounds, y): this rank's blocks ``first:end`` in groups of consecutive blocks
        of up to 8,192 rows (a larger block alone), their local row boundaries (``end - first + 1``
        values) and the labels of their rows (a view)."""
        b = self._bounds
        return [(i, j, b[i:j + 1], row_range(self._y, b[i], b[j])) for i, j in self._line_groups]

    def scores(self, v):
        """Return the scores ``X v`` of this rank's rows (:meth:`prbmrm.losses.Loss.scores`).

        In one product on CSR data (row by row, as per block), else per
        block: a BLAS product's sums may depend on the shape it is given,
        and a row's score must not depend on the blocks held with it.
        """
        if self._csr or len(self._blocks) < 2:
            return self.loss.scores(self._X, v)
        return np.concatenate([self.loss.scores(X, v) for X, _, _ in self._blocks])

    def _line_trial(self):
        """One round of trial steps of the open line search, on every rank.

        Returns ``(sums / m, nearest, risk seconds, comm seconds)``: the sums
        over all ranks of losses, left and right slopes (3 x K) and the
        breakpoints of all ranks nearest each step (2 x K, see
        :meth:`prbmrm.losses.line.PiecewiseLinearLine.evaluate`).

        Raises
        ------
        CollectiveError
            On every rank, with its message, if any rank failed to compute
            its part (in this round or in the session's set-up).
        """
        started = time.perf_counter()
        count = int(self._trial[-2])
        etas, (lo, hi) = self._trial[:count], self._trial[-4:-2]
        partials = np.full((len(self._blocks), 3, count), np.nan)
        ends = np.full((2, count), -np.inf)  # the largest breakpoint before, minus the smallest after
        error = self._line_error
        if error is None:
            try:
                for (i, j), line in zip(self._line_groups, self._lines):
                    sums, (below, above) = line.evaluate_parts(etas, lo, hi)
                    partials[i:j] = sums
                    np.maximum(ends, [below, -above], out=ends)
            except Exception as problem:
                error = problem
                partials[:] = np.nan
        computed = time.perf_counter()
        sums = self.comm.reproducible_sum(partials.reshape(len(self._blocks), -1), self._n_parts)
        if not np.all(np.isfinite(sums)):
            # Every rank sees the same sums, so every rank makes this collective call.
            self.comm.check(error)
        ends = self.comm.allreduce_max(ends.ravel()).reshape(2, count)
        ends[1] = -ends[1]
        return (sums.reshape(3, count) / self.n_total, ends, computed - started,
                time.perf_counter() - computed)

    def _close_line(self):
        self._lines = self._line_error = None
        self._line_open = False

    def _serve_line(self):
        """Answer the trials of a line search (every rank but 0); return the flag that ended it."""
        while True:
            self.comm.bcast_array(self._trial)
            flag = self._trial[-1]
            if flag != _EVALUATE:
                self._close_line()
                return flag
            try:
                self._line_trial()
            except CollectiveError:
                pass  # rank 0 raises it too, and then stops every rank with _FAIL

    def serve(self):
        """Answer rank 0's evaluations and line searches until it stops (every rank but 0).

        Raises
        ------
        CollectiveError
            If rank 0 stopped because of an error; the message is rank 0's.
        """
        while True:
            started = time.perf_counter()
            flag = self._receive()
            if flag in (_EVALUATE, _GATHERED) or (flag == _POINT and self._short is not None):
                w, error = self._message[:-1], None
                if flag == _POINT:
                    try:
                        w = self._service.point(self._short[:int(self._short[-2])])
                    except Exception as problem:  # rides in the sum's status: every rank raises it
                        error = problem
                self._evaluate(time.perf_counter() - started, w, flag == _GATHERED, error)
                if self._short is not None:
                    self._service.evaluated(w)
                continue
            if flag == _LIMBS and self._message[0] in (1.0, 2.0):
                self.fixed_point.set_limbs(int(self._message[0]))
                continue
            if flag == _DETACH and self._short is not None:
                self._service = self._short = None
                continue
            if flag == _LINE:
                self.comm.bcast_array(self._direction)
                self._open_line()
                flag = self._serve_line()
                if flag == _END:
                    continue
            if flag == _FAIL:
                raise CollectiveError(str(self.comm.bcast_object(None)))
            if flag == _ATTACH:
                self._service = self._build_service(self.comm.bcast_object(None))
                self._short = _short_message(self._service)
                continue
            if flag == _REQUEST and self._service is not None:
                self._service.handle(int(self._message[0]))
                continue
            if flag != _STOP:
                raise _unexpected(f"the message kind {float(flag)!r}")
            return

    def _build_service(self, message):
        """The service of the attach message ``[name, args]`` (every rank but 0)."""
        # A list (`in` takes any JSON value); without service points (party mode) none that makes the points
        # or gathers the rows.
        known = sorted(name for name in {*SERVICES, *SERVICE_MODULES}
                       if self.service_points or name not in POINT_SERVICES + GATHERING_SERVICES)
        if not (isinstance(message, list) and len(message) == 2 and isinstance(message[1], list) and message[0] in known):
            raise _unexpected(f"the service {str(message)[:100]!r} (known: {', '.join(known)})")
        if message[0] not in SERVICES:
            importlib.import_module(SERVICE_MODULES[message[0]])
        try:
            return SERVICES[message[0]](self, *message[1])
        except (TypeError, ValueError) as error:
            raise _unexpected(f"bad arguments for the service {message[0]!r} ({error})") from None

    def attach(self, factory, *args):
        """Build the service ``factory(self, *args)`` on every rank (rank 0 only); return rank 0's.

        A solver that keeps state on every rank (Pragam's dual variables of
        each rank's own examples) runs its collective steps as a service:
        `factory` is a class entered in :data:`SERVICES` (:func:`service`),
        and its name and the JSON `args` travel to the serving ranks, which
        build their own instance in :meth:`serve`; afterwards
        :meth:`request` runs ``service.handle(code)`` on every rank.

        The service must run the same collective calls on every rank and raise
        only on rank 0, after its last collective of a step (for instance on a
        problem the ranks agreed on through an Allreduce): rank 0's error then
        reaches the serving ranks through :meth:`stop`, as for the risk.
        """
        self._send(_ATTACH)
        self.comm.bcast_object([factory.service_name, list(args)])
        self._service = factory(self, *args)
        self._short = _short_message(self._service)
        return self._service

    def detach(self):
        """End the attached service whose points travel short (rank 0 only; see :meth:`evaluate_point`):
        long messages again, with ``w``."""
        if self._short is not None:
            self._short[-1] = _DETACH
            self.comm.bcast_array(self._short)
        self._service = self._short = None

    def request(self, code):
        """Run ``handle(code)`` of the attached service on every rank (rank 0 only).

        Parameters
        ----------
        code : int
            Which step; it rides in the broadcast message in place of ``w``.

        Returns
        -------
        object
            What rank 0's ``handle`` returned.
        """
        self._message[0] = code
        self._send(_REQUEST)
        return self._service.handle(code)

    def receive(self):
        """Wait for rank 0's next message (every rank but 0): the w to evaluate, or None to stop.

        For a party replaying the solver (``--verify-coordinator``), whose
        solver evaluates the risk only: no line searches or services.

        Returns
        -------
        ndarray or None
            A view of the w received, valid until the next call.

        Raises
        ------
        CollectiveError
            If rank 0 stopped because of an error; the message is rank 0's.
        """
        started = time.perf_counter()
        flag = self._receive()
        if flag == _STOP:
            return None
        if flag == _FAIL:
            raise CollectiveError(str(self.comm.bcast_object(None)))
        if flag not in (_EVALUATE, _GATHERED):
            raise _unexpected(f"the message kind {float(flag)!r} to a party replaying the solver")
        self._received_seconds = time.perf_counter() - started
        return self._message[:-1]

    def answer(self):
        """Evaluate this rank's share at the w just received; return ``(R_emp, a)`` of the sum."""
        self._evaluate(self._received_seconds, self._message[:-1], self._message[-1] == _GATHERED)
        return self.result()

    def stop(self, error=None):
        """Release the serving ranks (rank 0 only); with `error`, make them raise its message.

        Inside an open line search the flag travels in the trial message,
        the one the other ranks are waiting for.
        """
        flag = _STOP if error is None else _FAIL
        message = self._trial if self._line_open else self._message if self._short is None else self._short
        message[-1] = flag
        self.comm.bcast_array(message)
        self._close_line()
        if error is not None:
            self.comm.bcast_object(str(error))


class RiskLine:
    """An open line search of a :class:`DistributedRisk` along ``w + eta d`` (rank 0's end).

    Attributes
    ----------
    exact : bool
        True if the loss is piecewise linear along lines: every trial step
        then comes with the breakpoints nearest to it.
    points : int
        Trial steps a round may hold: :data:`MAX_TRIALS` if exact (a step
        costs O(log m) per rank), else 3 (a step costs O(m) per rank).
    seconds : dict
        Seconds of this session, under ``"risk"`` (this rank's work) and
        ``"comm"`` (broadcasts and Allreduces); also added to the oracle's
        ``total_seconds``.
    rounds : int
        Rounds of trial steps so far.
    """

    def __init__(self, oracle, exact):
        self._oracle = oracle
        self.exact = exact
        self.points = MAX_TRIALS if exact else 3
        self.seconds = {"risk": 0.0, "comm": 0.0}
        self.rounds = 0

    def add_seconds(self, risk, comm):
        """Count `risk` and `comm` seconds into this session and the oracle's totals."""
        for key, seconds in (("risk", risk), ("comm", comm)):
            self.seconds[key] += seconds
            self._oracle.total_seconds[key] += seconds

    def __call__(self, etas, lo, hi):
        """Return R_emp, its left and right slopes, and the nearest breakpoints at the steps `etas`.

        Parameters
        ----------
        etas : sequence of float
            At most :attr:`points` increasing steps in [lo, hi).
        lo, hi : float
            The bracket (hi may be inf).

        Returns
        -------
        ndarray of shape (5, K)
            Rows: ``R_emp(w + eta d)``, its left and right derivatives in eta,
            and around each step the largest breakpoint after the previous
            step (or lo) and the smallest before the next one (or hi); where
            there is none, or the search is not :attr:`exact`, the
            neighbouring step itself.
        """
        started = time.perf_counter()
        trial = self._oracle._trial
        trial[:len(etas)] = etas
        trial[-4:] = (lo, hi, len(etas), _EVALUATE)
        self._oracle.comm.bcast_array(trial)
        sent = time.perf_counter() - started
        sums, ends, risk, comm = self._oracle._line_trial()
        self.add_seconds(risk, comm + sent)
        self.rounds += 1
        return np.vstack([sums, ends])

    def close(self):
        """End the session: the other ranks go back to serving evaluations."""
        if self._oracle._line_open:
            started = time.perf_counter()
            self._oracle._trial[-1] = _END
            self._oracle.comm.bcast_array(self._oracle._trial)
            self._oracle._close_line()
            self.add_seconds(0.0, time.perf_counter() - started)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _short_message(service):
    """The short message a serving rank waits for while `service` makes the points, else None."""
    return np.zeros(SHORT_WORDS + 2) if getattr(service, "points", False) else None


def _described(error, rank):
    """`error`, or for an unexpected one (a bug, not a user's input) one that names its rank and type."""
    if error is None or isinstance(error, PrbmrmError):
        return error
    if isinstance(error, SystemExit):
        return RuntimeError(f"rank {rank} exited with status {error.code} while computing its risk")
    return RuntimeError(f"rank {rank} failed computing its risk: {type(error).__name__}: {error}")


def run_distributed(oracle, solve):
    """Run ``solve(oracle)`` on rank 0 while the other ranks serve the oracle.

    Parameters
    ----------
    oracle : DistributedRisk
    solve : callable
        Called on rank 0 with the oracle; its return value is returned there.

    Returns
    -------
    object or None
        What `solve` returned, on rank 0; None on the other ranks.

    Raises
    ------
    CollectiveError
        On every rank, with the same message, if `solve` raised a
        :class:`PrbmrmError` on rank 0. Any other exception is re-raised on
        rank 0 while the other ranks raise a CollectiveError with its text, so
        no rank is left waiting. A :class:`~prbmrm.errors.JointError` (every
        rank raised it inside one collective, e.g. a secure sum) passes through.
    """
    if not oracle.comm.is_root:
        oracle.serve()
        return None
    try:
        result = solve(oracle)
    except JointError:
        raise  # every rank raised it together: none is left waiting to be stopped
    except BaseException as error:
        oracle.stop(error)
        if isinstance(error, PrbmrmError):
            raise CollectiveError(str(error)) from error
        raise
    oracle.stop()
    return result
