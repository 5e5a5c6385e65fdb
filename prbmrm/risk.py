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

    Attributes
    ----------
    dim : int
        Length of ``w``.
    last_seconds : dict
        Seconds spent by this rank in the last evaluation, under ``"risk"``
        (its own data pass) and ``"comm"`` (broadcast and Allreduce, which
        include waiting for the slowest rank).
    total_seconds : dict
        The same, summed over all evaluations.
    evaluations : int
        Number of evaluations so far.
    """

    def __init__(self, loss, X, y, n_total, comm, blocks=None):
        self.loss = loss
        self.n_total = int(n_total)
        self.comm = comm
        self.dim = X.shape[1]
        bounds = [0, X.shape[0]] if blocks is None else list(blocks)
        self._blocks = [(_row_block(X, a, b), y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        self._n_parts = int(comm.allreduce_sum(np.array([len(self._blocks)], dtype=np.int64))[0])
        self._message = np.zeros(self.dim + 1)  # w, then the control flag
        self._partials = np.empty((len(self._blocks), self.dim + 1))  # per block: gradient, risk
        self._sums = np.zeros(self.dim + 1)
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
        self.total_seconds = {"risk": 0.0, "comm": 0.0}
        self.evaluations = 0

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
        return self._sums[-1] / self.n_total, self._sums[:-1] / self.n_total

    def _evaluate(self, bcast_seconds):
        started = time.perf_counter()
        w = self._message[:-1]
        for partial, (X, y) in zip(self._partials, self._blocks):
            partial[-1], partial[:-1] = self.loss.loss_gradient(w, X, y)
        computed = time.perf_counter()
        self._sums = self.comm.reproducible_sum(self._partials, self._n_parts)
        self.last_seconds = {"risk": computed - started,
                             "comm": bcast_seconds + time.perf_counter() - computed}
        for key, seconds in self.last_seconds.items():
            self.total_seconds[key] += seconds
        self.evaluations += 1

    def serve(self):
        """Answer rank 0's evaluations until it stops (every rank but 0).

        Raises
        ------
        CollectiveError
            If rank 0 stopped because of an error; the message is rank 0's.
        """
        while True:
            started = time.perf_counter()
            self.comm.bcast_array(self._message)
            flag = self._message[-1]
            if flag == _STOP:
                return
            if flag == _FAIL:
                raise CollectiveError(self.comm.bcast_object(None))
            self._evaluate(time.perf_counter() - started)

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
        no rank is left waiting.
    """
    if not oracle.comm.is_root:
        oracle.serve()
        return None
    try:
        result = solve(oracle)
    except BaseException as error:
        oracle.stop(error)
        if isinstance(error, PrbmrmError):
            raise CollectiveError(str(error)) from error
        raise
    oracle.stop()
    return result
