"""The distributed risk oracle ``risk(w) -> (R_emp(w), a)`` (paper 000, Alg. 5).

Rank 0 runs the solver and calls the oracle; every other rank sits in
:meth:`DistributedRisk.serve`. One evaluation is::

    rank 0:   [w, flag]  --Bcast-->  every rank
    every rank: (risk_sum, grad_sum) of each of its blocks (shard files)
              <--reproducible Allreduce (d + 1 values)-->  R = risk_sum / m,  a = grad_sum / m

The flag rides with ``w`` so no extra message is needed to stop the workers.
Sums are formed per canonical block of rows (one per shard file) and added
with :meth:`prbmrm.comm.SerialComm.reproducible_sum`, so 1, 2 or 3 ranks
holding the same shards compute bitwise the same R and a, and BMRM takes the
same path on any number of ranks.
"""

import time

import numpy as np
import scipy.sparse as sp

from .errors import CollectiveError, PrbmrmError

_EVALUATE, _STOP, _FAIL = 0.0, 1.0, 2.0

# Rows per chunk of a block are chosen so that one chunk's nonzeros (12 bytes each)
# stay in the last-level cache between the two passes f = X w and X^T l'(f): one
# memory pass over X instead of two (1.3-1.5x faster on a 20M-nonzero shard).
_CHUNK_NONZEROS = 2**18


class DistributedRisk:
    """Empirical risk of a loss over the shards of all ranks.

    Parameters
    ----------
    loss : prbmrm.losses.Loss
        The loss; its ``loss_gradient`` runs on this rank's shard.
    X : scipy.sparse.csr_matrix or ndarray
        This rank's examples (with the bias column appended if any).
    y : ndarray
        This rank's labels.
    n_total : int
        Number of examples over all ranks: R_emp is the sum divided by it.
    comm : prbmrm.comm.SerialComm or MPIComm
        The communicator.
    blocks : sequence of int, optional
        Local row boundaries ``[0, n_1, ..., n_local]`` of the canonical
        blocks (:attr:`prbmrm.data.LocalData.blocks`); one block by default.
    qid : ndarray, optional
        This rank's query ids, handed to the loss with each block.

    Attributes
    ----------
    dim : int
        Length of ``w``: features times the loss's ``n_outputs``.
    last_seconds : dict
        Seconds spent by this rank in the last evaluation, under ``"risk"``
        (its own data pass) and ``"comm"`` (broadcast and Allreduce, which
        include waiting for the slowest rank).
    total_seconds : dict
        The same, summed over all evaluations.
    evaluations : int
        Number of evaluations so far.
    observer : callable or None
        Called on every rank at each evaluation, before the sums travel, as
        ``observer(w, partials)``: the w evaluated and this rank's partial
        sums (one row per block, gradient then risk; views, valid until the
        next evaluation). Party mode's audit log is one.
    """

    def __init__(self, loss, X, y, n_total, comm, blocks=None, qid=None):
        self.loss = loss
        self.n_total = int(n_total)
        self.comm = comm
        self.dim = X.shape[1] * loss.n_outputs
        bounds = [0, X.shape[0]] if blocks is None else list(blocks)
        self._blocks = [(_row_block(X, a, b), y[a:b], None if qid is None else qid[a:b])
                        for a, b in zip(bounds[:-1], bounds[1:])]
        # Chunks never cross a block, so sums stay the same on any number of ranks;
        # a query must stay whole, so losses with query ids keep their blocks whole.
        self._chunks = [[(_row_block(X, a + s, a + t), y[a + s:a + t], None)
                         for s, t in _chunk_bounds(X, a, b)] if qid is None else [block]
                        for block, a, b in zip(self._blocks, bounds[:-1], bounds[1:])]
        self._n_parts = int(comm.allreduce_sum(np.array([len(self._blocks)], dtype=np.int64))[0])
        if not loss.decomposable:
            # Labels and query ids travel to rank 0 once; per iteration only scores do.
            self._counts = comm.gather_counts(X.shape[0])
            self._all_y = comm.gather_scalars(y)
            self._all_qid = None if qid is None else comm.gather_scalars(qid)
        self._message = np.zeros(self.dim + 1)  # w, then the control flag
        self._partials = np.empty((len(self._blocks), self.dim + 1))  # per block: gradient, risk
        self._sums = np.zeros(self.dim + 1)
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
        self.total_seconds = {"risk": 0.0, "comm": 0.0}
        self.evaluations = 0
        self.observer = None
        self._received_seconds = 0.0
        self._deferred_error = None

    def __call__(self, w):
        """Return ``(R_emp(w), a)`` with ``a`` a subgradient of R_emp at `w` (rank 0 only).

        Returns
        -------
        risk : float
        subgradient : ndarray of shape (dim,)
            A new array, owned by the caller.
        """
        self._message[:-1] = w
        self._message[-1] = _EVALUATE
        started = time.perf_counter()
        self.comm.bcast_array(self._message)
        self._evaluate(time.perf_counter() - started)
        if self._deferred_error is not None:
            error, self._deferred_error = self._deferred_error, None
            raise error
        return self._sums[-1] / self.n_total, self._sums[:-1] / self.n_total

    def _evaluate(self, bcast_seconds):
        started = time.perf_counter()
        w = self._message[:-1]
        if self.loss.decomposable:
            for partial, chunks in zip(self._partials, self._chunks):
                partial[:] = 0.0
                for X, y, qid in chunks:
                    risk, gradient = self.loss.loss_gradient(w, X, y, qid)
                    partial[-1] += risk
                    partial[:-1] += gradient.ravel()
            exchange = 0.0
        else:
            exchange = self._multivariate_partials(w)
        computed = time.perf_counter()
        if self.observer is not None:
            self.observer(w, self._partials)
        self._sums = self.comm.reproducible_sum(self._partials, self._n_parts)
        self.last_seconds = {"risk": computed - started - exchange,
                             "comm": bcast_seconds + exchange + time.perf_counter() - computed}
        for key, seconds in self.last_seconds.items():
            self.total_seconds[key] += seconds
        self.evaluations += 1

    def _multivariate_partials(self, w):
        """Fill the partial sums of a non-decomposable loss; return the seconds spent exchanging.

        Scores go to rank 0, per-example coefficients come back, and each rank
        forms ``X.T @ c`` of its blocks: only m scalars each way cross ranks.
        """
        scores = np.concatenate([X @ w for X, _, _ in self._blocks])
        started = time.perf_counter()
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
        start = 0
        for partial, (X, _, _) in zip(self._partials, self._blocks):
            stop = start + X.shape[0]
            partial[:-1] = X.T @ local[start:stop]
            partial[-1] = 0.0
            start = stop
        # The risk is known on rank 0 alone: it enters the sum once.
        self._partials[0, -1] = risk_sum
        return exchange

    def serve(self):
        """Answer rank 0's evaluations until it stops (every rank but 0).

        Raises
        ------
        CollectiveError
            If rank 0 stopped because of an error; the message is rank 0's.
        """
        while self.receive() is not None:
            self.answer()

    def receive(self):
        """Wait for rank 0's next message (every rank but 0): the w to evaluate, or None to stop.

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
        self.comm.bcast_array(self._message)
        flag = self._message[-1]
        if flag == _STOP:
            return None
        if flag == _FAIL:
            raise CollectiveError(self.comm.bcast_object(None))
        self._received_seconds = time.perf_counter() - started
        return self._message[:-1]

    def answer(self):
        """Evaluate this rank's share at the w just received; return ``(R_emp, a)`` of the sum."""
        self._evaluate(self._received_seconds)
        return self._sums[-1] / self.n_total, self._sums[:-1] / self.n_total

    def stop(self, error=None):
        """Release the serving ranks (rank 0 only); with `error`, make them raise its message."""
        self._message[-1] = _STOP if error is None else _FAIL
        self.comm.bcast_array(self._message)
        if error is not None:
            self.comm.bcast_object(str(error))


def _row_block(X, start, stop):
    """Rows start:stop of X without copying the large arrays."""
    if not sp.issparse(X):
        return X[start:stop]
    indptr = X.indptr[start:stop + 1]
    return sp.csr_matrix((X.data[indptr[0]:indptr[-1]], X.indices[indptr[0]:indptr[-1]],
                          indptr - indptr[0]), shape=(stop - start, X.shape[1]), copy=False)


def _chunk_bounds(X, start, stop):
    """Row ranges, relative to `start`, of consecutive chunks of rows start:stop of about
    ``_CHUNK_NONZEROS`` nonzeros each."""
    if sp.issparse(X):
        nonzeros = X.indptr[start:stop + 1] - X.indptr[start]
    else:
        nonzeros = np.arange(stop - start + 1) * X.shape[1]
    cuts = np.searchsorted(nonzeros, np.arange(_CHUNK_NONZEROS, nonzeros[-1], _CHUNK_NONZEROS))
    edges = np.unique(np.concatenate([[0], cuts, [stop - start]]))
    return list(zip(edges[:-1], edges[1:]))


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
        no rank is left waiting. A CollectiveError raised by `solve` (every
        rank raised it together, e.g. from a secure sum) passes through.
    """
    if not oracle.comm.is_root:
        oracle.serve()
        return None
    try:
        result = solve(oracle)
    except CollectiveError:
        raise  # every rank raised it together: none is left waiting to be stopped
    except BaseException as error:
        oracle.stop(error)
        if isinstance(error, PrbmrmError):
            raise CollectiveError(str(error)) from error
        raise
    oracle.stop()
    return result
