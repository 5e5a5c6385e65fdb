"""The distributed risk oracle ``risk(w) -> (R_emp(w), a)`` (paper 000, Alg. 5).

Rank 0 runs the solver and calls the oracle; every other rank sits in
:meth:`DistributedRisk.serve`. One evaluation is::

    rank 0:   [w, flag]  --Bcast-->  every rank
    every rank: (risk_sum, grad_sum) on its own shard
              <--Allreduce (d + 1 float64)-->  R = risk_sum / m,  a = grad_sum / m

The flag rides with ``w`` so no extra message is needed to stop the workers.
"""

import time

import numpy as np

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

    Attributes
    ----------
    dim : int
        Length of ``w``.
    last_seconds : dict
        Seconds spent by this rank in the last evaluation, under ``"risk"``
        (its own data pass) and ``"comm"`` (broadcast and Allreduce, which
        include waiting for the slowest rank).
    evaluations : int
        Number of evaluations so far.
    """

    def __init__(self, loss, X, y, n_total, comm):
        self.loss = loss
        self.X = X
        self.y = y
        self.n_total = int(n_total)
        self.comm = comm
        self.dim = X.shape[1]
        self._message = np.zeros(self.dim + 1)  # w, then the control flag
        self._sums = np.zeros(self.dim + 1)  # gradient sum, then the risk sum
        self.last_seconds = {"risk": 0.0, "comm": 0.0}
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
        risk_sum, grad_sum = self.loss.loss_gradient(self._message[:-1], self.X, self.y)
        computed = time.perf_counter()
        self._sums[:-1] = grad_sum
        self._sums[-1] = risk_sum
        self.comm.allreduce_sum(self._sums)
        self.last_seconds = {"risk": computed - started,
                             "comm": bcast_seconds + time.perf_counter() - computed}
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
