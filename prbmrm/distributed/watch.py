"""Waiting for a collective without hanging: polling with a deadline, liveness pings, stop requests.

A blocking MPI collective waits forever for a rank that stopped answering
(SIGSTOP, a dead node, a cut network), and spins a core while it waits.
:class:`Watch` replaces the wait: the collective is started nonblocking and
polled with ``Test``, sleeping between polls for a small fraction of the time
waited so far (so a long wait costs almost no CPU and a short one almost no
latency). When a wait passes the rank timeout, the rank pings every other
rank on a duplicate communicator; a thread of each rank answers pings
whatever its main thread is doing (computing its risk share, solving the
QP), so a rank that does not answer within :data:`PONG_SECONDS` is silent,
not slow. The lowest-numbered live rank names the silent ranks and the job
ends (MPI_Abort, which makes the launcher kill every rank, the stopped one
too). If every rank answers, the wait goes on: a long computation is no
failure, unless it lasts longer than the progress deadline
(``--iteration-timeout``): each answer says whether its rank waits in a
collective or computes, and since when; a rank computing past the deadline
(stuck in a loop, yet answering pings) is named and the job ends.

The same thread carries stop requests: a signal caught on any rank is
forwarded to rank 0, which ends the run at the next iteration (with a
checkpoint). A wait that starts or continues after a signal pings at once,
so a signal during a stall ends the job within seconds; a wait still going
:data:`SIGNAL_GRACE` seconds after a signal, or a second signal, ends the job.

This module receives the ``mpi4py.MPI`` module from :mod:`prbmrm.distributed.comm`,
which alone imports mpi4py.

Imports: numpy; of prbmrm: nothing of prbmrm.
"""

import atexit
import os
import sys
import threading
import time

import numpy as np

DEFAULT_TIMEOUT = 60.0
"""Seconds a collective may wait before the other ranks are pinged (``--rank-timeout``)."""

PONG_SECONDS = 5.0
"""How long a ping waits for its answers; a live rank's thread answers within :data:`POLL_SECONDS`."""

POLL_SECONDS = 0.25
"""How often the answering thread looks for pings and stop requests (a ping waits :data:`PONG_SECONDS`
for its answer, so a quarter of a second costs no detection, and 4 wake-ups a second cost no CPU)."""

SPIN_SECONDS = 5e-5
"""A wait polls without sleeping this long first: a collective whose peers are ready completes within it.
Only where every rank of the node has a core of its own (:func:`ranks_share_cores`): where ranks share
cores, a spinning rank takes the time of one that works, as Open MPI's ``mpi_yield_when_idle`` reasons.
kddcup99 on 64 ranks of 2 cores (``bench_scale.py --ranks 8 64``, 300 iterations, 4 interleaved rounds):
communication 34.1-36.4 ms per iteration without the spin against 38.2-40.4 ms with it."""

SLEEP_FRACTION = 0.1
"""Then it sleeps this fraction of the time waited so far, at least :data:`MIN_SLEEP` and at most
:func:`sleep_after`'s cap: the latency a sleep adds is at most 10% of the wait, or :data:`MIN_SLEEP` (the rest
of the time its core serves the ranks that work; the former 2% made that about 50 ln(t / 0.2 ms) polls)."""

MIN_SLEEP = 1e-4

ITERATION_SLEEP = 5e-4
"""The longest sleep while a wait is as short as an iteration's (up to :data:`ITERATION_WAIT`). Each
round of a tree broadcast or Allreduce goes on only when its next rank polls, so a cap of c adds up
to c per round, 2 log2 P rounds an iteration; and a collective of large buffers moves in chunks, each
waiting for the peer's next poll. kddcup99, 64 ranks on 2 cores (iterations of about 40 ms,
``bench_scale.py --ranks 8 64``, interleaved): communication 35 ms per iteration with this cap against
41 ms with the former rule (10% of the wait up to :data:`MAX_SLEEP`), unchanged at 8 ranks."""

ITERATION_WAIT = 0.05
"""Seconds of waiting after which the cap grows (:func:`sleep_after`)."""

MAX_SLEEP = 2e-3
"""The longest sleep of a long wait (rank 0's long subproblem, a slow rank): 500 polls a second, about
1% of a core (a 5 s wait costs 0.05-0.07 CPU s; at :data:`ITERATION_SLEEP`'s 2,000 polls a second, 0.2)."""


def sleep_after(waited):
    """Seconds a wait sleeps before its next poll, after `waited` seconds: :data:`SLEEP_FRACTION` of the wait,
    at least :data:`MIN_SLEEP`; at most :data:`ITERATION_SLEEP` up to :data:`ITERATION_WAIT`, then at most 1%
    of the wait, up to :data:`MAX_SLEEP` (reached after 0.2 s)."""
    cap = min(MAX_SLEEP, max(ITERATION_SLEEP, waited * ITERATION_SLEEP / ITERATION_WAIT))
    return min(cap, max(MIN_SLEEP, waited * SLEEP_FRACTION))


BLOCK_SECONDS = 0.25
"""The longest a wait that can sleep until its request is ready (a node relay's exchange,
:mod:`prbmrm.distributed.relay`) sleeps before it looks at signals and the rank timeout again."""

SIGNAL_GRACE = 30.0
"""Seconds a job may take to stop cleanly after a signal (the next iteration's checkpoint); a rank
still waiting in a collective after that ends the job: a signal always ends it."""

DEFAULT_ITERATION_TIMEOUT = 3600.0
"""Seconds a rank may compute without entering a collective (``--iteration-timeout``) before a
waiting rank names it and ends the job; 0: no deadline."""

EXIT_SILENT_RANK = 6
"""Exit status of a job ended because a rank stopped answering, or made no progress."""

_PING, _PONG, _STOP = 1, 2, 3

ABORT_SECONDS = 1.0
"""How long MPI_Abort may take before the process exits by itself."""


OUTPUT_SECONDS = 1.0
"""How long a rank that ends the job waits before MPI_Abort: the launcher exits once a rank aborts, and
drops what the ranks printed that it has not yet forwarded (an error message lost so, under load)."""


def ranks_share_cores(MPI, comm):
    """Whether the ranks of `comm` on this node outnumber the cores they may run on (collective).

    The cores are the union of the node's ranks' CPU affinity masks: ranks
    bound one to a core each have the node's cores to themselves; unbound
    ranks, or several bound to one core, share them. Where the system has
    no affinity masks (macOS), every rank may run on every core.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        mask = np.zeros(os.cpu_count() or 1, dtype=np.uint8)
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(mask.size)
        mask[[cpu for cpu in cpus if cpu < mask.size]] = 1
        masks = np.empty((node.Get_size(), mask.size), dtype=np.uint8)
        node.Allgather([mask, MPI.UINT8_T], [masks, MPI.UINT8_T])
        return node.Get_size() > int(np.count_nonzero(masks.any(axis=0)))
    finally:
        node.Free()


def abort(MPI, status):
    """End the whole job: MPI_Abort, and exit with `status` if that has not ended this process soon.

    What this rank printed gets :data:`OUTPUT_SECONDS` to reach the launcher first.

    Under ``srun`` a step that Slurm is already ending ignores the abort
    request and leaves the process in MPI_Abort until the step's kill
    timeout; a process that exits non-zero on its own ends the step
    (``--kill-on-bad-exit``) or the ``mpiexec`` job as well.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(OUTPUT_SECONDS)
    timer = threading.Timer(ABORT_SECONDS, os._exit, (status,))
    timer.daemon = True
    timer.start()
    MPI.COMM_WORLD.Abort(status)


class Watch:
    """Timeout-capable waiting, liveness pings and stop forwarding for one MPI communicator.

    Collective to create (it duplicates `comm`).

    Parameters
    ----------
    MPI : module
        ``mpi4py.MPI``.
    comm : mpi4py.MPI.Intracomm
    timeout : float
        Seconds a wait may last before the other ranks are pinged; 0 waits
        forever. Without ``MPI_THREAD_MULTIPLE`` no thread can answer pings,
        and waits never ping. Waits poll with sleeps either way: a blocking
        ``Wait`` of MPICH spins a core.
    spin : float
        Seconds a wait polls before its first sleep (:data:`SPIN_SECONDS`; 0 where ranks share cores).

    Attributes
    ----------
    iteration_timeout : float
        ``--iteration-timeout``: seconds a rank may compute without entering a
        collective while another waits for it; past it, the waiting rank
        names it and ends the job (0: no deadline).
    remote_stop : int or None
        On rank 0: the signal another rank caught and forwarded.
    signalled : int or None
        The signal this rank caught (:meth:`request_stop`).
    """

    def __init__(self, MPI, comm, timeout=DEFAULT_TIMEOUT, spin=SPIN_SECONDS):
        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(timeout)
        self.spin = float(spin)
        self.iteration_timeout = DEFAULT_ITERATION_TIMEOUT
        self.remote_stop = None
        self.signalled = None
        self._signalled_at = None
        self._busy_since = time.monotonic()
        self._forward = None
        self._pinged_for_signal = False
        self._round = 0
        self._sends, self._pings = [], []  # the answering thread's and the main thread's
        self._done = threading.Event()
        self._thread = None
        # Answering from a thread needs an MPI that allows calls from several threads at once.
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self._thread = threading.Thread(target=self._answer, name="prbmrm-watch", daemon=True)
            self._thread.start()
            # Before mpi4py's MPI_Finalize (atexit runs last-registered first).
            atexit.register(self.close)

    def close(self):
        """Stop the answering thread (before MPI_Finalize)."""
        if self._thread is not None:
            self._done.set()
            self._thread.join()
            self._thread = None

    def request_stop(self, signum):
        """Record that this rank caught `signum`; rank 0 learns of it through the thread and the sums' status.

        A second signal a second or more after the first ends the job at once (a terminal's Ctrl-C
        may reach a rank twice within milliseconds, from the terminal and from the launcher).
        """
        if self.signalled is not None:
            if time.monotonic() - self._signalled_at < 1.0:
                return
            self._report(f"rank {self.rank} of {self.size} got signal {signum} after signal {self.signalled}: "
                         "ending the job")
            abort(self._MPI, 128 + signum)
        self.signalled = signum
        self._signalled_at = time.monotonic()
        self._pinged_for_signal = False
        if self.rank != 0:
            self._forward = signum

    def wait(self, request, what):
        """Complete the nonblocking `request` of the collective `what`; end the job if a rank is silent,
        makes no progress for :attr:`iteration_timeout` seconds, or a signal was not obeyed in time.

        `request` has MPI's ``Test()``; one that also has ``block(seconds)`` (an exchange of the node
        relay, :class:`prbmrm.distributed.relay.Exchange`) sleeps in it, at most :data:`BLOCK_SECONDS`
        at a time, instead of polling."""
        self._busy_since = None  # waiting is no computation: the progress deadline does not run
        try:
            # A request that can sleep in the kernel till it is ready (a node relay's exchange) sleeps
            # first, till then: the common wait, shorter than this, costs one wake-up and no checks.
            block = getattr(request, "block", None)
            if block is not None:
                block(BLOCK_SECONDS)
            self._wait(request, what)
        finally:
            self._busy_since = time.monotonic()

    def _check_after(self, busiest=0.0):
        """Seconds until the next ping: the rank timeout, or when the busiest rank would pass the deadline."""
        if self.iteration_timeout > 0:
            return max(0.5, min(self.timeout, self.iteration_timeout - busiest + 0.1))
        return self.timeout

    def _wait(self, request, what):
        watched = self.timeout > 0 and self._thread is not None
        started = time.monotonic()
        deadline = started + self._check_after() if watched else float("inf")
        block = getattr(request, "block", None)
        while not request.Test():
            now = time.monotonic()
            waited = now - started
            if waited < self.spin and block is None:
                continue
            if watched and (now >= deadline or (self.signalled is not None and not self._pinged_for_signal)):
                self._pinged_for_signal = self.signalled is not None
                answer = self.silent_ranks(request)
                if answer is None:
                    # The collective completed meanwhile, so this ping proved nothing: the next wait pings
                    # again at once (a rank stopped after this collective would otherwise go unnamed).
                    self._pinged_for_signal = False
                    return
                silent, busy = answer
                if silent:
                    self._end(silent, what, waited)
                stuck = {r: age for r, age in busy.items() if 0 < self.iteration_timeout < age}
                if stuck:
                    self._end_stuck(stuck, what)
                deadline = time.monotonic() + self._check_after(max(busy.values(), default=0.0))
            if self.signalled is not None and now - self._signalled_at > SIGNAL_GRACE:
                time.sleep(0.2 * min(self.rank, 10))  # the lowest waiting rank speaks and ends the job first
                self._report(f"rank {self.rank} of {self.size}: the job did not stop within {SIGNAL_GRACE:g} s "
                             f"of signal {self.signalled} ({what} waited {waited:.0f} s): ending it")
                abort(self._MPI, 128 + self.signalled)
            if block is None:
                time.sleep(sleep_after(waited))
            else:
                block(min(BLOCK_SECONDS, max(0.0, deadline - time.monotonic())))

    def silent_ranks(self, request=None):
        """Ping every other rank; return those that do not answer within :data:`PONG_SECONDS`.

        Returns None as soon as `request` (the collective being waited for)
        completes: then no one was silent, and a rank that finished its part
        may exit without answering. Otherwise ``(silent, busy)``: the ranks
        that did not answer, and for each rank that answered while computing
        (not waiting in a collective), the seconds since it left its last one.
        """
        MPI = self._MPI
        self._round += 1
        token = np.array([self._round], dtype=np.int64)
        others = [r for r in range(self.size) if r != self.rank]
        # Never completed if r is stopped: kept with their buffer until they are.
        self._pings = [(r, m) for r, m in self._pings if not r.Test()]
        self._pings += [(self.comm.Isend([token, MPI.INT64_T], dest=r, tag=_PING), token) for r in others]
        answered, busy, reply, status = set(), {}, np.empty(2, dtype=np.int64), MPI.Status()
        end = time.monotonic() + min(PONG_SECONDS, self.timeout)
        while len(answered) < len(others) and time.monotonic() < end:
            if request is not None and request.Test():
                return None
            if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_PONG, status=status):
                source = status.Get_source()
                self.comm.Recv([reply, MPI.INT64_T], source=source, tag=_PONG)
                if reply[0] == self._round:  # an answer to an earlier round proves less
                    answered.add(source)
                    if reply[1] >= 0:
                        busy[source] = reply[1] / 1000.0
            else:
                time.sleep(0.01)
        return [r for r in others if r not in answered], busy

    @staticmethod
    def _report(text):
        """Print `text` as the job's error (on this rank: the caller decides who speaks)."""
        print(f"prbmrm: error: {text}", file=sys.stderr, flush=True)

    def _end(self, silent, what, waited):
        """Name the silent ranks (lowest live rank only) and end the whole job."""
        live = [r for r in range(self.size) if r not in silent]
        if self.rank == live[0]:
            names = ", ".join(map(str, silent))
            cause = (f"after signal {self.signalled}, " if self.signalled is not None else "")
            self._report(f"rank{'s' if len(silent) > 1 else ''} {names} of {self.size} stopped "
                         f"answering ({cause}{what} waited {waited:.0f} s, no answer to a ping within "
                         f"{min(PONG_SECONDS, self.timeout):.0f} s: a stopped or dead process, a lost node "
                         f"or network; --rank-timeout {self.timeout:g}): ending the job")
        else:
            time.sleep(0.5)  # let the reporting rank print before anyone aborts
        abort(self._MPI, EXIT_SILENT_RANK)

    def _end_stuck(self, stuck, what):
        """Name the ranks past the progress deadline (lowest waiting rank only) and end the whole job."""
        waiting = [r for r in range(self.size) if r not in stuck]
        if self.rank == waiting[0]:
            many = len(stuck) > 1
            self._report(f"rank{'s' if many else ''} {', '.join(map(str, sorted(stuck)))} of {self.size} made "
                         f"no progress for {max(stuck.values()):.0f} s: computing without reaching the next "
                         f"collective, though {'they answer' if many else 'it answers'} pings ({what} waits; "
                         f"--iteration-timeout {self.iteration_timeout:g}): ending the job")
        else:
            time.sleep(0.5)
        abort(self._MPI, EXIT_SILENT_RANK)

    def _answer(self):
        """The thread: answer pings, and carry stop requests to rank 0."""
        MPI = self._MPI
        status, buf = MPI.Status(), np.empty(1, dtype=np.int64)
        while not self._done.wait(POLL_SECONDS):
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_PING, status=status):
                source = status.Get_source()
                self.comm.Recv([buf, MPI.INT64_T], source=source, tag=_PING)
                busy_since = self._busy_since  # None while the main thread waits in a collective
                age = -1 if busy_since is None else int(1000 * (time.monotonic() - busy_since))
                self._send(np.array([buf[0], age], dtype=np.int64), source, _PONG)
            if self.rank == 0:
                while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_STOP, status=status):
                    self.comm.Recv([buf, MPI.INT64_T], source=status.Get_source(), tag=_STOP)
                    self.remote_stop = int(buf[0])
            elif self._forward is not None:
                self._send(np.array([self._forward], dtype=np.int64), 0, _STOP)
                self._forward = None

    def _send(self, message, dest, tag):
        # Nonblocking: a stopped receiver must not stop this thread; the buffer lives until done.
        self._sends = [(r, m) for r, m in self._sends if not r.Test()]
        self._sends.append((self.comm.Isend([message, self._MPI.INT64_T], dest=dest, tag=tag), message))
