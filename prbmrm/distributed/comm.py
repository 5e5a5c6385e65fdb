"""The thin communication layer: the only module of prbmrm that imports mpi4py.

Every other module is serial code handed a communicator. Two communicators
share one interface:

- :class:`SerialComm` for a single process (no MPI at all);
- :class:`MPIComm` wrapping an ``mpi4py`` communicator.

The hot path (broadcast of ``w``, the Allreduce of risk and gradient, the
gather/scatter of per-example scalars) uses mpi4py's upper-case, buffer-based
calls on contiguous float64 arrays: no pickling. The rare control
messages (an error text, a configuration) travel as typed, size-limited
UTF-8 JSON (:mod:`prbmrm.distributed.messages`): no rank ever unpickles another's bytes.

Imports: mpi4py, numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.distributed.exact`,
:mod:`prbmrm.distributed.messages`, :mod:`prbmrm.distributed.relay`, :mod:`prbmrm.distributed.watch`.
"""

import os
import sys

import numpy as np

from ..errors import CollectiveError, UsageError
from .exact import FAILED, OVERFLOW
from .messages import MAX_OBJECT_BYTES, ProtocolError, decode, encode
from .relay import mpi_operations, node_relay
from .watch import DEFAULT_TIMEOUT, SPIN_SECONDS, Watch, abort, ranks_share_cores

# Where a launcher tells each process how many it started, innermost launcher
# first: MPICH's hydra, Intel MPI and Slurm's pmi2 plugin set PMI_SIZE, Open MPI
# OMPI_COMM_WORLD_SIZE, MVAPICH2's mpirun_rsh MV2_COMM_WORLD_SIZE, srun (any
# --mpi, also none and pmix, which sets no size of its own) SLURM_STEP_NUM_TASKS.
# An mpiexec inside a Slurm job starts its per-node daemons with srun, so its
# ranks may also see the daemons' SLURM_STEP_NUM_TASKS: the first one set wins.
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                           "SLURM_STEP_NUM_TASKS")
# Set by any launcher that may start this process as an MPI rank: the counts
# above, the PMI of MPICH's hydra, Intel MPI, Flux and Slurm's pmi2 plugin
# (PMI_RANK, PMI_FD or PMI_PORT), PMIx servers (Open MPI 5's prterun, srun
# --mpi=pmix), any srun step (SLURM_STEP_ID), Cray's ALPS and PALS. A process
# that sees none of them was started by no launcher, so MPI would only make
# it a 1-rank singleton: it need not load MPI at all.
LAUNCHER_VARIABLES = LAUNCHER_SIZE_VARIABLES + ("PMI_RANK", "PMI_FD", "PMI_PORT", "PMIX_RANK", "PMIX_NAMESPACE",
                                                "SLURM_STEP_ID", "ALPS_APP_PE", "PALS_RANKID")
# The task count of the Slurm job, or under srun of the step (SLURM_NPROCS is its old name).
SLURM_TASKS_VARIABLES = ("SLURM_NTASKS", "SLURM_NPROCS")
# Per launcher: the variables of its process count and of its count on this node.
_NODE_SIZE_VARIABLES = (("PMI_SIZE", "MPI_LOCALNRANKS"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                        ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"))

ONE_NODE_ENVIRONMENT = {"UCX_MEM_EVENTS": "no"}
"""Settings put in the environment, where it does not set them, before mpi4py loads the MPI library, when
the launcher started every rank on this node. Loading UCX (linked by the MPICH of the mpich wheel) patches
the memory functions for its registration cache of network transfers, which ranks of one node never make:
40 ms of each rank's start-up (a 2-rank run on a9a takes 0.2-0.5 s in all). The user's value wins."""


def one_node(environ=None):
    """Whether the launcher says that it started every rank on this node (from its environment alone).

    Parameters
    ----------
    environ : mapping, optional
        The environment holding the launcher's variables (by default this process's).

    Returns
    -------
    bool
        True if MPICH's hydra (``MPI_LOCALNRANKS``), Open MPI or MVAPICH2
        counts as many processes on this node as in all, or else the srun
        step runs on one node (``SLURM_STEP_NUM_NODES``, e.g. under
        ``--mpi=pmi2``); False when none says so.
    """
    environ = os.environ if environ is None else environ
    for total, local in _NODE_SIZE_VARIABLES:
        (_, size), (_, here) = _first_count((total,), environ), _first_count((local,), environ)
        if size is not None and here is not None:
            return here == size
    return _first_count(("SLURM_STEP_NUM_NODES",), environ)[1] == 1


def load_mpi():
    """Return mpi4py's ``MPI`` module; on one node (:func:`one_node`), put :data:`ONE_NODE_ENVIRONMENT` into
    ``os.environ`` first if this call loads the MPI library.

    Returns
    -------
    module
        ``mpi4py.MPI``.
    """
    if "mpi4py.MPI" not in sys.modules and one_node():
        for name, value in ONE_NODE_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    from mpi4py import MPI

    return MPI


class SupportRows:
    """Partial sums, one row per canonical block, each stored on its block's support only.

    Row i is zero (+0.0) outside ``index[i]``: a scalar loss's gradient of a
    block of CSR rows is zero on every column the block does not use, and
    its last entry (the risk) is always kept. Where a rank holds several
    blocks of data with millions of columns, this keeps their nonzeros, not
    ``blocks x n`` values. :meth:`SerialComm.exact_sum` rounds the stored
    entries as it rounds dense rows (a zero is a zero limb), so the result
    is bitwise the dense rows' sum.

    Parameters
    ----------
    supports : sequence of ndarray of int
        Per row, the increasing indices of its possible nonzeros, below ``n - 1``.
    n : int
        The length of a row.
    """

    def __init__(self, supports, n):
        self.index = [np.append(support, n - 1).astype(np.int64) for support in supports]
        self.values = [np.zeros(len(index)) for index in self.index]
        self.shape = (len(self.index), n)

    @property
    def nbytes(self):
        """int: the bytes of the stored indices and values."""
        return sum(index.nbytes + values.nbytes for index, values in zip(self.index, self.values))

    def store(self, i, row):
        """Keep the dense `row` (zero off the support) as row i."""
        np.take(row, self.index[i], out=self.values[i])

    def fill(self, value):
        """Set every stored entry to `value` (NaN: mark the sum as failed)."""
        for values in self.values:
            values.fill(value)

    def __array__(self, dtype=None, copy=None):
        # The dense rows, for what needs them whole (a secure sum, party mode's audit log).
        dense = np.zeros(self.shape)
        for row, index, values in zip(dense, self.index, self.values):
            row[index] = values
        return dense if dtype is None else dense.astype(dtype)

    def __getitem__(self, key):
        if isinstance(key, int):  # iteration would make the dense rows once per row
            raise TypeError("SupportRows: index the dense rows with a tuple or slice, e.g. partials[:, -1]")
        return np.asarray(self)[key]


class SerialComm:
    """Communicator of a single process; every collective is the identity.

    Attributes
    ----------
    rank : int
        Always 0.
    size : int
        Always 1.
    """

    rank = 0
    size = 1
    signalled = None
    """int or None: the signal this rank caught (:meth:`request_stop`), sent with every exact sum's status."""
    _status_stop = None  # a stop signal learnt from an exact sum's status words

    @property
    def is_root(self):
        """bool: True on rank 0, the rank that holds the bundle and prints."""
        return self.rank == 0

    def bcast_array(self, buf, root=0):
        """Broadcast the float64 array `buf` in place from `root`."""
        return buf

    def allreduce_sum(self, buf):
        """Sum the float64 or int64 array `buf` over all ranks, in place."""
        return buf

    def allreduce_max(self, values):
        """Return the element-wise maximum over ranks of a small float64 array."""
        return np.array(values, dtype=np.float64)

    def allreduce_min(self, values):
        """Return the element-wise minimum over ranks of a small float64 array."""
        return np.array(values, dtype=np.float64)

    def reproducible_sum(self, partials, n_parts, bound=None):
        """Sum float64 vectors over all ranks with a result independent of the rank count.

        Floating-point addition is not associative, so a plain Allreduce gives
        results that depend on how the rows were split over ranks, and BMRM
        amplifies such round-off differences from iteration to iteration.
        Here every partial sum is rounded once to a fixed-point integer on a
        per-component scale common to all ranks (one Allreduce-max), and the
        integers are added exactly (one Allreduce-sum of int64). The result is
        the same for any split of the same partials over any number of ranks,
        and as accurate as a floating-point sum: each partial keeps
        ``62 - log2(n_parts)`` bits relative to the largest one.

        Parameters
        ----------
        partials : ndarray of shape (k, n)
            This rank's partial sums, one row per canonical block of data.
        n_parts : int
            Number of partial sums over all ranks (bounds the integer sum).
        bound : array_like, optional
            A bound on every |partial|, per component or one for all, known
            alike on every rank: it sets the scale in place of the
            Allreduce-max, so the sum costs a single Allreduce. Each partial
            then keeps ``62 - log2(n_parts)`` bits relative to the bound
            (integers below it are summed exactly); the partials must be finite.

        Returns
        -------
        ndarray of shape (n,)
            The sum, or all NaN if any partial is not finite (without `bound`).
        """
        if bound is None:
            # A NaN would not survive MPI's max alike on every rank ((a > b) ? a : b is
            # taken in each rank's own order): send it as +inf, which always wins.
            local = np.max(np.abs(partials), axis=0, initial=0.0)
            largest = self.allreduce_max(np.where(np.isnan(local), np.inf, local))
        else:
            largest = np.broadcast_to(np.asarray(bound, dtype=np.float64), partials.shape[1:])
        if not np.all(np.isfinite(largest)):
            return np.full(partials.shape[1], np.nan)
        # Scale so that every |partial| < 2**bits and the sum of n_parts of them fits in int64.
        bits = 62 - int(np.ceil(np.log2(n_parts + 1)))
        shift = bits - np.frexp(largest)[1]
        fixed = np.rint(np.ldexp(partials, shift)).astype(np.int64).sum(axis=0)
        self.allreduce_sum(fixed)
        return np.ldexp(fixed.astype(np.float64), -shift)

    def exact_sum(self, partials, state, failed=False, signal=None, out=None):
        """Sum float64 partial sums, one per canonical block, over all ranks: exactly, in one Allreduce.

        Every block's partial is rounded once onto a fixed-point grid that
        all ranks share and the integer limbs are summed
        (:class:`prbmrm.distributed.exact.FixedPointSum`), with this rank's
        status (a failure, a signal caught) in the same buffer: the result
        is bitwise the same for any number of ranks and any reduction order,
        and no rank can wait in another collective than the others. Over MPI
        it is ONE ``Allreduce`` (``MPI.SUM`` on int64, upper-case: no
        pickle) of ``limbs n + STATUS_WORDS`` words per rank (2 limbs, or 1:
        :meth:`prbmrm.distributed.exact.FixedPointSum.set_limbs`); MPICH's allreduce
        (recursive doubling for short buffers, Rabenseifner's reduce-scatter
        then allgather for long ones) takes O(log P) messages on the
        critical path and moves O(n) bytes per rank. Only when a partial
        outgrows the bounds agreed so far (the first sum, then rarely) do
        an Allreduce-max and a second Allreduce follow, on every rank alike
        (every time for a `state` that does not remember its bounds).

        Parameters
        ----------
        partials : ndarray of shape (k, n) or SupportRows
            This rank's partial sums, one row per canonical block it holds.
        state : prbmrm.distributed.exact.FixedPointSum
            The bounds agreed so far; its status words hold the reduced status afterwards.
        failed : bool
            This rank failed computing `partials` (they are ignored).
        signal : int or None
            A signal this rank caught, which rank 0 learns from the status.
        out : ndarray of shape (n,), optional
            Where to write the sum (else a new array): the risk oracle's, kept from call to call.

        Returns
        -------
        ndarray of shape (n,)
            The sum (`out` if given); all NaN if any rank failed or a partial is not finite.
        """
        def failure():
            if out is None:
                return np.full(state.n, np.nan)
            out.fill(np.nan)
            return out

        # A rank alone: the Allreduces return what they are given, so its dense partials' limbs are decoded
        # a chunk at a time into `out` (FixedPointSum.encode), and no copy of the largest partials is made.
        alone = self.size == 1 and out is not None and not hasattr(partials, "index")
        direct = out if alone else None

        def agreed_largest():
            return state.largest if self.size == 1 else self.allreduce_max(state.largest)

        if not state.remember:
            state.measure(np.full((1, state.n), np.nan) if failed else partials)
            if not state.rescale(agreed_largest()):
                return failure()
        state.encode(partials, failed, signal, out=direct)
        if not alone:
            self.allreduce_sum(state.buffer)
        self._status_stop = state.signal() or self._status_stop
        if state.status[FAILED]:
            return failure()
        if state.status[OVERFLOW]:
            status = state.status.copy()
            if not state.rescale(agreed_largest()):
                return failure()
            state.encode(partials, failed, signal, out=direct)
            if not alone:
                self.allreduce_sum(state.buffer)
            state.status[:] = status
            state.status[OVERFLOW] = 0
        return out if alone else state.decode(out)

    def gather_counts(self, n_local):
        """Return the number of local items of every rank (on every rank)."""
        return np.array([n_local], dtype=np.int64)

    def gather_scalars(self, local, root=0):
        """Gather per-example float64 scalars to `root` in rank order.

        Returns the concatenated array on `root` and None elsewhere.
        """
        return np.ascontiguousarray(local, dtype=np.float64).copy()

    def scatter_scalars(self, full, counts, root=0):
        """Scatter the float64 array `full` (on `root`) back in blocks of `counts`."""
        return np.ascontiguousarray(full, dtype=np.float64).copy()

    def bcast_object(self, obj, root=0, limit=MAX_OBJECT_BYTES):
        """Broadcast a control message: data of the types of :mod:`prbmrm.distributed.messages` (never pickled).

        Raises
        ------
        ProtocolError
            On every rank, naming the rank that refused the message of
            `root` and why (not JSON, beyond `limit` bytes, a bad array).
        """
        return obj

    def check(self, error=None):
        """Collective error check: every rank calls it, every rank raises together.

        Parameters
        ----------
        error : Exception or None
            The error this rank found while validating its own input, if any.

        Raises
        ------
        CollectiveError
            On every rank, with the message of the lowest-numbered failing
            rank, if any rank passed an error.
        """
        if error is not None:
            raise CollectiveError(str(error)) from error

    def barrier(self):
        """Wait for every rank."""

    def set_rank_timeout(self, seconds):
        """Set ``--rank-timeout``: seconds a collective waits before checking the other ranks answer."""

    def set_iteration_timeout(self, seconds):
        """Set ``--iteration-timeout``: seconds a rank may compute between collectives (0: no deadline)."""

    def request_stop(self, signum):
        """Ask rank 0 to end the run at the next iteration: this rank caught `signum`."""

    def stop_requested(self):
        """Return the signal another rank caught and forwarded (rank 0), or None."""
        return None

    def abort(self, status=1):
        """End the whole job at once with exit status `status`."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    # ---- Collectives of the distributed sort of per-example scalars (P14 item 5) -------------------
    # Non-decomposable losses order their scores across ranks with these (a sample sort:
    # splitters from gathered samples, scores sent to the rank owning their range, counts
    # back): no rank ever holds every score. Typed buffers only (float64 or int64).

    def allgather_array(self, local):
        """Return the same-length 1-D float64 or int64 arrays of all ranks as rows, in rank order.

        Returns
        -------
        ndarray of shape (size, n)
        """
        return _typed(local)[None, :].copy()

    def allgatherv_array(self, local, limit):
        """Return the 1-D float64 or int64 arrays of all ranks concatenated in rank order.

        Parameters
        ----------
        local : array_like
            This rank's part (any length, possibly 0).
        limit : int
            The most items of the result; a larger total raises on every rank alike.

        Raises
        ------
        ProtocolError
            If the parts add up to more than `limit` items.
        """
        local = _typed(local)
        _check_total(self.gather_counts(local.size), limit, "a gather of samples")
        return local.copy()

    def gatherv_array(self, local, limit, root=0):
        """As :meth:`allgatherv_array`, but the result is on `root` alone (None elsewhere)."""
        return self.allgatherv_array(local, limit)

    def alltoallv_array(self, send, counts, limit, received_counts=None, allocate=np.empty):
        """Send consecutive parts of `send` to every rank; return what every rank sent here.

        Parameters
        ----------
        send : ndarray, float64 or int64
            The items for rank 0, then those for rank 1, ... (rows of a 2-D array travel whole).
        counts : array_like of int
            How many items (rows) go to each rank (``size`` values summing to ``len(send)``).
        limit : int
            The most items any rank accepts in all, the same on every rank: more, for any rank, raises
            on every rank alike.
        received_counts : array_like of int, optional
            How many items come from each rank, when this rank knows (e.g. the answer to an earlier
            exchange in the other direction): the counts need not travel, and `limit` is not used.
        allocate : callable, optional
            ``allocate(shape, dtype)`` makes the array received into (e.g. one kept from the last call).

        Returns
        -------
        received : ndarray
            The items from rank 0, then from rank 1, ... (the type and row width of `send`).
        matrix : ndarray of int64, shape (size, size)
            Row r: how many items rank r sent to each rank (only this rank's row and column when
            `received_counts` is given).

        Raises
        ------
        ProtocolError
            If any rank would receive more than `limit` items (on every rank).
        """
        send, counts = _typed_rows(send, counts, self.size)
        received = allocate(send.shape, send.dtype)
        received[...] = send
        return received, counts[None, :].copy()


_WATCHES = {}


class MPIComm(SerialComm):
    """Communicator over an ``mpi4py`` communicator (COMM_WORLD by default).

    Every collective is started nonblocking and completed by
    :meth:`prbmrm.distributed.watch.Watch.wait`: a rank that stops answering ends the job
    after `timeout` seconds instead of hanging it, and waiting ranks sleep
    instead of spinning a core. Where a node's ranks share cores, broadcasts
    from rank 0 and Allreduces go through the node relay
    (:mod:`prbmrm.distributed.relay`, :attr:`relay`), whose waiting ranks
    sleep in the kernel until their result is there.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Intracomm, optional
    timeout : float
        ``--rank-timeout``: seconds before a waiting rank checks that the
        others still answer (0: wait forever).

    Attributes
    ----------
    watch : prbmrm.distributed.watch.Watch
        The communicator's watch (one per MPI communicator).
    relay : prbmrm.distributed.relay.NodeRelay or None
        The node relay, where some node's ranks share cores.
    """

    def __init__(self, mpi_comm=None, timeout=DEFAULT_TIMEOUT):
        MPI = load_mpi()
        self._MPI = MPI
        self._operations = mpi_operations(MPI)
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # One watch (a duplicate communicator and a thread) per MPI communicator, however
        # many MPIComm wrap it: every rank creates the same wrappers in the same order.
        key = self.comm.py2f()
        if key not in _WATCHES:
            shared = ranks_share_cores(MPI, self.comm)
            watch = Watch(MPI, self.comm, timeout, spin=0.0 if shared else SPIN_SECONDS)
            _WATCHES[key] = watch, node_relay(MPI, self.comm, watch, shared)
        self.watch, self.relay = _WATCHES[key]
        self.watch.timeout = float(timeout)

    def _wait(self, request, what):
        self.watch.wait(request, what)

    def request_stop(self, signum):
        self.watch.request_stop(signum)

    def set_rank_timeout(self, seconds):
        self.watch.timeout = float(seconds)

    def set_iteration_timeout(self, seconds):
        self.watch.iteration_timeout = float(seconds)

    @property
    def signalled(self):
        return self.watch.signalled

    def stop_requested(self):
        # The watch's thread forwards a signal at once; the status of the exact sums at the latest.
        return self.watch.remote_stop if self.watch.remote_stop is not None else self._status_stop

    def _relays(self, buf):
        # The node relay takes the contiguous float64 and int64 arrays of the iteration's collectives.
        return self.relay is not None and self.relay.carries(buf)

    def bcast_array(self, buf, root=0):
        if root == 0 and self._relays(buf):
            return self.relay.bcast(buf, "a broadcast")
        self._wait(self.comm.Ibcast([buf, self._MPI.DOUBLE], root=root), "a broadcast")
        return buf

    def _allreduce(self, buf, operation, what):
        if self._relays(buf):
            return self.relay.allreduce(buf, operation, what)
        # mpi4py takes the MPI datatype from the array's buffer format.
        self._wait(self.comm.Iallreduce(self._MPI.IN_PLACE, buf, op=self._operations[operation]), what)
        return buf

    def allreduce_sum(self, buf):
        return self._allreduce(buf, "sum", "a sum over ranks")

    def allreduce_max(self, values):
        return self._allreduce(np.array(values, dtype=np.float64), "maximum", "a maximum over ranks")

    def allreduce_min(self, values):
        return self._allreduce(np.array(values, dtype=np.float64), "minimum", "a minimum over ranks")

    def gather_counts(self, n_local):
        counts = np.empty(self.size, dtype=np.int64)
        self._wait(self.comm.Iallgather([np.array([n_local], dtype=np.int64), self._MPI.INT64_T],
                                        [counts, self._MPI.INT64_T]), "a gather of counts")
        return counts

    def gather_scalars(self, local, root=0):
        local = np.ascontiguousarray(local, dtype=np.float64)
        counts = self.gather_counts(local.size)
        full = np.empty(int(counts.sum()), dtype=np.float64) if self.rank == root else None
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._wait(self.comm.Igatherv([local, self._MPI.DOUBLE],
                                      [full, (counts, displs), self._MPI.DOUBLE], root=root), "a gather")
        return full

    def scatter_scalars(self, full, counts, root=0):
        counts = np.asarray(counts, dtype=np.int64)
        local = np.empty(int(counts[self.rank]), dtype=np.float64)
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        send = None
        if self.rank == root:
            send = [np.ascontiguousarray(full, dtype=np.float64), (counts, displs),
                    self._MPI.DOUBLE]
        self._wait(self.comm.Iscatterv(send, [local, self._MPI.DOUBLE], root=root), "a scatter")
        return local

    def _bcast_bytes(self, data, root, limit):
        """Broadcast `data` (bytes, on `root`) with its length first; return it, or None beyond `limit`.

        Every rank reads the same length, so every rank skips a payload beyond
        `limit` alike: nothing is allocated for it.
        """
        length = np.array([len(data) if self.rank == root else 0], dtype=np.int64)
        self._wait(self.comm.Ibcast([length, self._MPI.INT64_T], root=root), "the length of a message")
        n = int(length[0])
        if not 0 <= n <= limit:
            return None
        buf = (np.frombuffer(data, dtype=np.uint8).copy() if self.rank == root
               else np.empty(n, dtype=np.uint8))
        self._wait(self.comm.Ibcast([buf, self._MPI.BYTE], root=root), "a message")
        return buf.tobytes()

    def _first_failing(self, failed):
        """The lowest rank with `failed` true (one Allreduce), or None if no rank failed."""
        first = int(self.allreduce_min([self.rank if failed else self.size])[0])
        return None if first == self.size else first

    def bcast_object(self, obj, root=0, limit=MAX_OBJECT_BYTES):
        data = self._bcast_bytes(encode(obj) if self.rank == root else b"", root, limit)
        if data is None:  # every rank, the sender included, read the same length
            raise ProtocolError(f"rank {root} sent a message beyond the limit of {limit} bytes (rank r is "
                                "party r in party mode)", sender=root)
        problem = None
        if self.rank != root:
            try:
                obj = decode(data, limit)
            except ValueError as error:
                problem = str(error)
        # Every rank learns whether any refused it, and which: no rank goes on alone.
        first = self._first_failing(problem is not None)
        if first is not None:
            why = self._bcast_bytes(problem.encode("utf-8")[:1000] if problem else b"", first, 1000)
            why = "" if why is None else why.decode("utf-8", "replace")
            raise ProtocolError(f"rank {first} refused the message of rank {root}: {why} (rank r is "
                                "party r in party mode)", sender=root)
        return obj

    def check(self, error=None):
        # One Allreduce finds the lowest failing rank; only then does a
        # message travel, so the error-free path costs a single collective.
        first = self._first_failing(error is not None)
        if first is None:
            return
        text = str(error).encode("utf-8")[:4000] if error is not None else b""
        message = self._bcast_bytes(text, first, 4000)
        message = "" if message is None else message.decode("utf-8", "replace")
        if error is not None:
            raise CollectiveError(message) from error
        raise CollectiveError(message)

    def barrier(self):
        self._wait(self.comm.Ibarrier(), "a barrier")

    def abort(self, status=1):
        abort(self._MPI, status)

    # ---- Collectives of the distributed sort of per-example scalars (P14 item 5) -------------------

    def _datatype(self, array):
        return self._MPI.DOUBLE if array.dtype == np.float64 else self._MPI.INT64_T

    def allgather_array(self, local):
        local = _typed(local)
        rows = np.empty((self.size, local.size), dtype=local.dtype)
        self._wait(self.comm.Iallgather([local, self._datatype(local)], [rows, self._datatype(local)]),
                   "a gather of counts")
        return rows

    def allgatherv_array(self, local, limit):
        local = _typed(local)
        counts = self.gather_counts(local.size)
        _check_total(counts, limit, "a gather of samples")
        full = np.empty(int(counts.sum()), dtype=local.dtype)
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._wait(self.comm.Iallgatherv([local, self._datatype(local)],
                                         [full, (counts, displs), self._datatype(local)]), "a gather of samples")
        return full

    def gatherv_array(self, local, limit, root=0):
        local = _typed(local)
        counts = self.gather_counts(local.size)
        _check_total(counts, limit, "a gather of rows")
        full = np.empty(int(counts.sum()), dtype=local.dtype) if self.rank == root else None
        displs = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._wait(self.comm.Igatherv([local, self._datatype(local)],
                                      [full, (counts, displs), self._datatype(local)], root=root), "a gather of rows")
        return full

    def alltoallv_array(self, send, counts, limit, received_counts=None, allocate=np.empty):
        send, counts = _typed_rows(send, counts, self.size)
        width = int(np.prod(send.shape[1:], dtype=np.int64))
        matrix = np.zeros((self.size, self.size), dtype=np.int64)
        if received_counts is None:
            # Every rank learns every rank's counts (one watched collective): all check alike.
            self._wait(self.comm.Iallgather([counts, self._MPI.INT64_T], [matrix, self._MPI.INT64_T]),
                       "the counts of a redistribution")
            totals = matrix.sum(axis=0)
            if np.any(matrix < 0) or not totals.max() <= limit:
                raise ProtocolError(f"a redistribution of scores: counts {matrix.tolist()} (rank r sends row "
                                    f"r), a rank would receive more than {limit} items")
        else:
            # A watched step first: the blocking exchange below starts with every rank here.
            self.barrier()
            matrix[:, self.rank] = np.asarray(received_counts, dtype=np.int64)
            matrix[self.rank] = counts
        received_counts = matrix[:, self.rank]
        received = allocate((int(received_counts.sum()),) + send.shape[1:], send.dtype)
        # Blocking: a watched collective above shows every rank here. Megabytes progress only
        # while a rank polls, and the watch's waits sleep between polls (0.3 s -> 20 s per
        # exchange of 2.5M scores).
        self.comm.Alltoallv(
            [send, (counts * width, np.concatenate(([0], np.cumsum(counts)[:-1])) * width), self._datatype(send)],
            [received, (received_counts * width, np.concatenate(([0], np.cumsum(received_counts)[:-1])) * width),
             self._datatype(send)])
        return received, matrix

# ---- Checks of the distributed sort's collectives (P14 item 5) ------------------------------------

def _typed(array):
    """`array` as a contiguous 1-D float64 or int64 array (the two types the sort's collectives move)."""
    array = np.ascontiguousarray(array)
    if array.dtype not in (np.float64, np.int64) or array.ndim != 1:
        raise TypeError(f"a collective of scalars takes a 1-D float64 or int64 array, not {array.dtype} "
                        f"of shape {array.shape}")
    return array


def _typed_rows(send, counts, size):
    """`send` (float64 or int64, 1-D or rows) and `counts` (int64), checked to agree."""
    send = np.ascontiguousarray(send)
    if send.dtype not in (np.float64, np.int64) or send.ndim not in (1, 2):
        raise TypeError(f"a redistribution takes a float64 or int64 array of items or rows, not {send.dtype} "
                        f"of shape {send.shape}")
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.shape != (size,) or np.any(counts < 0) or int(counts.sum()) != len(send):
        raise ValueError(f"alltoallv_array: {counts.tolist()} items for {size} ranks, {len(send)} given")
    return send, counts


def _check_total(counts, limit, what):
    """Raise the same ProtocolError on every rank if `counts` (alike on every rank) exceed `limit` in all."""
    total = float(np.sum(counts))
    if not total <= limit:
        raise ProtocolError(f"{what} of {total:.0f} items is beyond the limit of {limit} items")


def _first_count(names, environ):
    for name in names:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return name, int(value)
    return None, None


def launched_size(environ=None):
    """Return how many processes the launcher of this one started, from its environment.

    Reads only environment variables (never initialises MPI), so a serial
    command can tell that it was started as one of several copies.

    Parameters
    ----------
    environ : mapping, optional
        Defaults to ``os.environ``.

    Returns
    -------
    name : str or None
        The variable that says so (one of :data:`LAUNCHER_SIZE_VARIABLES`),
        None if no launcher variable is set.
    size : int
        The number of processes (1 if no launcher variable is set).
    """
    name, size = _first_count(LAUNCHER_SIZE_VARIABLES, os.environ if environ is None else environ)
    return name, size or 1


def _mpi_library():
    return " ".join(load_mpi().Get_library_version().split("\n")[0].split())


def check_launch(comm, environ=None):
    """Check that the MPI communicator has as many ranks as the launcher started.

    Two launch mistakes would otherwise run silently: N copies started as N
    independent single-process MPI jobs (``srun`` without a PMI plugin that
    the MPI library of mpi4py speaks, or the ``mpiexec`` of another MPI), each
    training on all the data and writing the same model file; and a rank
    count that differs from the Slurm job's task count (``SLURM_NTASKS``),
    e.g. a plain ``python`` in a batch script. The MPI library's own launcher count, when set, is trusted over
    the Slurm job's (an ``mpiexec`` inside an allocation may start any number
    of ranks). Collective: every rank calls it and every rank raises together.

    Parameters
    ----------
    comm : SerialComm or MPIComm
    environ : mapping, optional
        Defaults to ``os.environ``.

    Raises
    ------
    CollectiveError
        On every rank, with a message naming the variable and the fix (a
        copy started as a single-process job raises it in every copy).
    """
    environ = os.environ if environ is None else environ
    name, started = launched_size(environ)
    tasks_name, tasks = _first_count(SLURM_TASKS_VARIABLES, environ)
    error = None
    if comm.size == 1 and started > 1:
        error = UsageError(
            f"{name}={started}: {started} processes were started, but each runs as its own "
            f"1-rank MPI job and would do the whole job alone: the launcher does not speak "
            f"to the MPI library of mpi4py ({_mpi_library()}); start them with that library's "
            f"mpiexec, or srun --mpi=pmi2 (MPICH) or --mpi=pmix (Open MPI 5, PMIx builds), "
            f"see slurm/train.sbatch")
    elif name is not None and started != comm.size:
        error = UsageError(f"{name}={started} but MPI_COMM_WORLD has {comm.size} ranks")
    elif name is None and tasks is not None and tasks != comm.size:
        # Only without a launcher of its own: mpiexec inside an allocation starts its
        # daemons with srun -n 1, so its ranks see SLURM_NTASKS=1; the MPI library's
        # own count (PMI_SIZE, which agreed above) is the one to trust.
        fix = "start it with srun" if comm.size == 1 else f"start {tasks} ranks (srun, or mpiexec -n {tasks})"
        error = UsageError(f"{tasks_name}={tasks}: the Slurm job has {tasks} tasks but MPI_COMM_WORLD "
                           f"has {comm.size} rank{'s' if comm.size > 1 else ''}: {fix}, one rank per task")
    comm.check(error)


def launched_by_mpi(environ=None):
    """Whether a launcher may have started this process as an MPI rank, or MPI is loaded already.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (by default this process's).

    Returns
    -------
    bool
        True if any of :data:`LAUNCHER_VARIABLES` is set or mpi4py's MPI
        module is imported; False only for a process that MPI would make a
        1-rank singleton.
    """
    environ = os.environ if environ is None else environ
    return "mpi4py.MPI" in sys.modules or any(name in environ for name in LAUNCHER_VARIABLES)


def get_comm():
    """Return the communicator of this process.

    An :class:`MPIComm` over ``COMM_WORLD`` when the process was started by an
    MPI launcher with more than one rank, a :class:`SerialComm` otherwise. A
    process that no launcher started (:func:`launched_by_mpi`), e.g. a plain
    ``python -m prbmrm.cli.train``, never imports mpi4py nor initialises MPI
    (50-100 ms of its start-up); one that MPI is a single rank of works the same.

    Returns
    -------
    SerialComm or MPIComm
    """
    if not launched_by_mpi():
        return SerialComm()
    MPI = load_mpi()
    if MPI.COMM_WORLD.Get_size() == 1:
        return SerialComm()
    return MPIComm(MPI.COMM_WORLD)
