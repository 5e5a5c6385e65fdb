"""Waiting for a collective without hanging: polling with a deadline, liveness pings, stop requests.

A blocking MPI collective waits forever for a rank that stopped answering
(SIGSTOP, a dead node, a cut network), and spins a core while it waits.
:class:`Watch` replaces the wait: the collective is started nonblocking and
polled with ``Test``, sleeping between polls for a small fraction of the time
waited so far (so a long wait costs almost no CPU and a short one almost no
latency; the waiting thread's timer slack is set to 1 us, since Linux's
default of 50 us made every sleep last 60 us or more, which added 0.1-0.3 ms
to each wait of a millisecond). When a wait passes the rank timeout, the rank pings every other
rank on a duplicate communicator; a thread of each rank answers pings
whatever its main thread is doing (computing its risk share, solving the
QP), so a rank that does not answer within :data:`PONG_SECONDS` is silent,
not slow. The lowest-numbered live rank names the silent ranks and the job
ends (MPI_Abort, which makes the launcher kill every rank, the stopped one
too). If every rank answers, the wait goes on: a long computation is no
failure.

The same thread carries stop requests: a signal caught on any rank is
forwarded to rank 0, which ends the run at the next iteration (with a
checkpoint). A wait that starts or continues after a signal pings at once,
so a signal during a stall ends the job within seconds.

This module receives the ``mpi4py.MPI`` module from :mod:`prbmrm.distributed.comm`,
which alone imports mpi4py.

Imports: numpy; of prbmrm: nothing of prbmrm.
"""

import atexit
import ctypes
import os
import sys
import threading
import time

import numpy as np

DEFAULT_TIMEOUT = 60.0
"""Seconds a collective may wait before the other ranks are pinged (``--rank-timeout``)."""

PONG_SECONDS = 5.0
"""How long a ping waits for its answers; a live rank's thread answers within :data:`POLL_SECONDS`."""

POLL_SECONDS = 0.05
"""How often the answering thread looks for pings and stop requests."""

SPIN_SECONDS = 2e-4
"""A wait polls without sleeping this long first: most collectives complete within it."""

SLEEP_FRACTION = 0.02
"""Then it sleeps this fraction of the time waited so far (at most :data:`MAX_SLEEP`), which
bounds the latency added to a wait at about 2% of its length."""

MAX_SLEEP = 0.01

TIMER_SLACK_NS = 1000
"""The waiting thread's timer slack (Linux): by default the kernel lets a sleep overrun by 50 us,
so every sleep of a wait lasted at least 60 us, however short the time asked for."""

EXIT_SILENT_RANK = 6
"""Exit status of a job ended because a rank stopped answering."""

_PING, _PONG, _STOP = 1, 2, 3

ABORT_SECONDS = 1.0
"""How long MPI_Abort may take before the process exits by itself."""


def fine_timer_slack(nanoseconds=TIMER_SLACK_NS):
    """Let the calling thread's sleeps end within `nanoseconds` of the time asked (Linux; a no-op elsewhere).

    Returns
    -------
    bool
        Whether the slack was set.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(29, ctypes.c_ulong(nanoseconds), 0, 0, 0) == 0  # 29: PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        return False


def abort(MPI, status):
    """End the whole job: MPI_Abort, and exit with `status` if that has not ended this process soon.

    Under ``srun`` a step that Slurm is already ending ignores the abort
    request and leaves the process in MPI_Abort until the step's kill
    timeout; a process that exits non-zero on its own ends the step
    (``--kill-on-bad-exit``) or the ``mpiexec`` job as well.
    """
    sys.stdout.flush()
    sys.stderr.flush()
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
        forever with a blocking ``Wait``. Without ``MPI_THREAD_MULTIPLE`` no
        thread can answer pings, and waits always block.

    Attributes
    ----------
    remote_stop : int or None
        On rank 0: the signal another rank caught and forwarded.
    signalled : int or None
        The signal this rank caught (:meth:`request_stop`).
    """

    def __init__(self, MPI, comm, timeout=DEFAULT_TIMEOUT):
        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = float(timeout)
        self.remote_stop = None
        self.signalled = None
        self._forward = None
        self._pinged_for_signal = False
        self._round = 0
        self._sends, self._pings = [], []  # the answering thread's and the main thread's
        self._done = threading.Event()
        self._thread = None
        # Answering from a thread needs an MPI that allows calls from several threads at once.
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            fine_timer_slack()  # this (the main) thread is the one that waits
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
        """Record that this rank caught `signum`; rank 0 learns of it through the thread."""
        self.signalled = signum
        self._pinged_for_signal = False
        if self.rank != 0:
            self._forward = signum

    def wait(self, request, what):
        """Complete the nonblocking `request` of the collective `what`; end the job if a rank is silent."""
        if self.timeout <= 0 or self._thread is None:
            request.Wait()
            return
        started = time.monotonic()
        deadline = started + self.timeout
        while not request.Test():
            now = time.monotonic()
            waited = now - started
            if waited < SPIN_SECONDS:
                continue
            if now >= deadline or (self.signalled is not None and not self._pinged_for_signal):
                self._pinged_for_signal = self.signalled is not None
                silent = self.silent_ranks(request)
                if silent is None:
                    return  # the collective completed meanwhile
                if silent:
                    self._end(silent, what, waited)
                deadline = time.monotonic() + self.timeout
            time.sleep(min(MAX_SLEEP, waited * SLEEP_FRACTION))

    def silent_ranks(self, request=None):
        """Ping every other rank; return those that do not answer within :data:`PONG_SECONDS`.

        Returns None as soon as `request` (the collective being waited for)
        completes: then no one was silent, and a rank that finished its part
        may exit without answering.
        """
        MPI = self._MPI
        self._round += 1
        token = np.array([self._round], dtype=np.int64)
        others = [r for r in range(self.size) if r != self.rank]
        # Never completed if r is stopped: kept with their buffer until they are.
        self._pings = [(r, m) for r, m in self._pings if not r.Test()]
        self._pings += [(self.comm.Isend([token, MPI.INT64_T], dest=r, tag=_PING), token) for r in others]
        answered, reply, status = set(), np.empty(1, dtype=np.int64), MPI.Status()
        end = time.monotonic() + min(PONG_SECONDS, self.timeout)
        while len(answered) < len(others) and time.monotonic() < end:
            if request is not None and request.Test():
                return None
            if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_PONG, status=status):
                self.comm.Recv([reply, MPI.INT64_T], source=status.Get_source(), tag=_PONG)
                if reply[0] == self._round:  # an answer to an earlier round proves less
                    answered.add(status.Get_source())
            else:
                time.sleep(0.01)
        return [r for r in others if r not in answered]

    def _end(self, silent, what, waited):
        """Name the silent ranks (lowest live rank only) and end the whole job."""
        live = [r for r in range(self.size) if r not in silent]
        if self.rank == live[0]:
            names = ", ".join(map(str, silent))
            cause = (f"after signal {self.signalled}, " if self.signalled is not None else "")
            print(f"prbmrm: error: rank{'s' if len(silent) > 1 else ''} {names} of {self.size} stopped "
                  f"answering ({cause}{what} waited {waited:.0f} s, no answer to a ping within "
                  f"{min(PONG_SECONDS, self.timeout):.0f} s: a stopped or dead process, a lost node "
                  f"or network; --rank-timeout {self.timeout:g}): ending the job",
                  file=sys.stderr, flush=True)
        else:
            time.sleep(0.5)  # let the reporting rank print before anyone aborts
        abort(self._MPI, EXIT_SILENT_RANK)

    def _answer(self):
        """The thread: answer pings, and carry stop requests to rank 0."""
        MPI = self._MPI
        status, buf = MPI.Status(), np.empty(1, dtype=np.int64)
        while not self._done.wait(POLL_SECONDS):
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_PING, status=status):
                source = status.Get_source()
                self.comm.Recv([buf, MPI.INT64_T], source=source, tag=_PING)
                self._send(buf.copy(), source, _PONG)
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
