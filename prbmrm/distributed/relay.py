"""The node relay: where a node's ranks share cores, its ranks wait for the iteration's collectives in the kernel.

MPI moves a nonblocking collective on only inside the ranks' MPI calls. A
rank waiting for a broadcast or an Allreduce must therefore poll it
(:class:`prbmrm.distributed.watch.Watch`), and each round of MPI's tree waits
until its next rank wakes up and polls. Where a node runs more ranks than it
has cores (:func:`prbmrm.distributed.watch.ranks_share_cores`), every such
wake-up takes a core from a rank that computes its share of the risk, and
the wake-ups grow with the ranks: at 64 ranks on 2 cores, about 20 a rank
and iteration, 44% of the job's CPU in the interpreter.

Here one rank of each node, its leader (the node's lowest rank), alone takes
part in MPI's collectives, among the leaders of all nodes. Every other rank
of the node sends its buffer to the leader over a Unix socket and then
sleeps in ``poll`` until the result comes back: one wake-up a collective,
when its result is there. The leader combines its node's buffers in node
rank order (it too sleeps in ``poll`` until the next one is there), takes
part in MPI's collective of the leaders, and sends the result to each rank.

- Only the iteration's collectives travel so: :meth:`NodeRelay.bcast` from
  rank 0 (``w``, the solvers' messages) and :meth:`NodeRelay.allreduce`
  (sum, maximum, minimum: the exact sums' int64 limbs, whose sum is
  bitwise the same in any order). Everything else stays MPI's.
- Silent ranks are still found: a relay wait is a wait of the
  :class:`~prbmrm.distributed.watch.Watch`, which pings the ranks after the
  rank timeout. A rank whose socket closes in an exchange (it died) is named
  at once by the rank at the other end, which ends the job.
- Every message is checked before it is used: a fixed header (sequence
  number, operation and type, byte count) must be the one expected, and the
  bytes go into a buffer of the size the receiver allocated itself. The socket lives
  in a directory only this user may enter, and the leader accepts a
  connection only from the process of the node rank it claims to be (its
  pid and user, from the kernel, where the system tells them).
- The inter-node part keeps MPI's O(log nodes) messages; inside a node the
  leader receives and sends one message per rank of the node, each one
  system call (a copy through the kernel).

kddcup99 on 64 ranks of 2 cores (``scripts/bench_wait.py --pattern``, the
iteration's communication alone): see docs/performance.md.

Imports: numpy; of prbmrm: :mod:`prbmrm.errors`, :mod:`prbmrm.distributed.watch`.
"""

import os
import select
import shutil
import socket
import struct
import sys
import tempfile
import time

import numpy as np

from ..errors import PrbmrmError
from .watch import abort

CONNECT_SECONDS = 60.0
"""How long a leader waits for its node's ranks to connect at start-up."""

EXIT_LOST_RANK = 6
"""Exit status of a job ended because a rank's socket closed in an exchange (as for a silent rank)."""

_OPERATIONS = {"broadcast": 1, "sum": 2, "maximum": 3, "minimum": 4}
_COMBINE = {"sum": np.add, "maximum": np.maximum, "minimum": np.minimum}
_DTYPES = {np.dtype(np.float64).char: 0, np.dtype(np.int64).char: 1}
_HEADER = struct.Struct("<3q")  # sequence number, operation and dtype, byte count


def mpi_operations(MPI):
    """MPI's reduction operations by the names the communicators use: sum, maximum, minimum."""
    return {"sum": MPI.SUM, "maximum": MPI.MAX, "minimum": MPI.MIN}


class NodeLinkError(PrbmrmError):
    """A rank's socket of the node relay closed or carried a message out of step."""


class Exchange:
    """Messages on the node's sockets in progress, one after the other, never blocking.

    A request for :meth:`prbmrm.distributed.watch.Watch.wait`: :meth:`Test` moves the
    exchange on as far as the sockets allow, :meth:`block` sleeps until the current
    message's socket is ready (or the time is up). A message is a list of byte views
    (header, payload), sent or received in one system call, without a copy.

    Parameters
    ----------
    relay : NodeRelay
        Told of a socket that fails (:meth:`NodeRelay.lost`) and keeps the ``poll`` objects.
    messages : list of (socket.socket, list of buffers, bool, int)
        In order: the non-blocking socket, the writable views to fill (received) or the
        buffers to send, whether it is sent, and the rank at the other end.
    """

    __slots__ = ("_relay", "_messages")

    def __init__(self, relay, messages):
        self._relay = relay
        self._messages = messages[::-1]  # (socket, byte views, send?, the rank at the other end), last first

    def Test(self):  # noqa: N802 (the name of mpi4py's requests, which the watch polls alike)
        """Move on; return True when every message is through."""
        messages = self._messages
        while messages:
            sock, views, send, peer = messages[-1]
            try:
                moved = sock.sendmsg(views) if send else sock.recvmsg_into(views)[0]
            except BlockingIOError:
                return False
            except OSError as error:
                self._relay.lost(peer, str(error))
            if moved == 0:
                self._relay.lost(peer, "its socket closed")
            while views and moved >= len(views[0]):
                moved -= len(views[0])
                views = views[1:]
            if not views:
                messages.pop()
                continue
            messages[-1] = (sock, [views[0][moved:]] + views[1:], send, peer)
        return True

    def block(self, seconds):
        """Sleep until the current message's socket is ready (or has failed), at most `seconds`."""
        if self._messages:
            sock, _, send, _ = self._messages[-1]
            self._relay.waiter(sock, send).poll(max(0, int(1000 * seconds)))


def _describe(header):
    """A message header in words: 'message 7 (a sum of 40 bytes of float64)'."""
    sequence, kind, nbytes = _HEADER.unpack(header)
    operation = {code: name for name, code in _OPERATIONS.items()}.get(kind // 16, f"operation {kind // 16}")
    dtype = {code: np.dtype(char).name for char, code in _DTYPES.items()}.get(kind % 16, f"type {kind % 16}")
    return f"message {sequence} (a {operation} of {nbytes} bytes of {dtype})"


def _bytes(array):
    return memoryview(array).cast("B")


class NodeRelay:
    """The node relay of one communicator (collective to create: see :func:`node_relay`).

    Parameters
    ----------
    MPI : module
        ``mpi4py.MPI``.
    comm : mpi4py.MPI.Intracomm
    node : mpi4py.MPI.Intracomm
        The ranks of `comm` on this node (``Split_type(COMM_TYPE_SHARED)``, keyed by rank); freed here.
    watch : prbmrm.distributed.watch.Watch
        Waits for the relay's exchanges and MPI requests, and pings the ranks after the rank timeout.

    Attributes
    ----------
    leader : bool
        Whether this rank takes part in MPI's collectives for its node.
    """

    def __init__(self, MPI, comm, node, watch):
        self._MPI = MPI
        self._watch = watch
        self._sequence = 0
        self.node_rank, self.node_size = node.Get_rank(), node.Get_size()
        # The comm ranks of the node's ranks, and their pids for the leader's check of who connects.
        ids = np.array([comm.Get_rank(), os.getpid()], dtype=np.int64)
        members = np.empty((self.node_size, 2), dtype=np.int64)
        node.Allgather([ids, MPI.INT64_T], [members, MPI.INT64_T])
        self._ranks, self._pids = members[:, 0].tolist(), members[:, 1].tolist()
        self.leader = self.node_rank == 0
        self._mpi_operations = mpi_operations(MPI)
        self._waiters = {}
        self.leaders = comm.Split(0 if self.leader else MPI.UNDEFINED, comm.Get_rank())
        if self.leader:
            self._peers = self._accept(MPI, node)
        else:
            self._leader = self._connect(MPI, node)
        node.Free()

    # ---- set-up --------------------------------------------------------------------------------------

    def _accept(self, MPI, node):
        """Leader: listen in a private directory, tell the node where, accept each rank's connection."""
        directory = tempfile.mkdtemp(prefix="prbmrm-")  # mode 0700: only this user may connect
        path = os.path.join(directory, "relay")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(self.node_size)
            self._bcast_path(MPI, node, path)
            peers = [None] * self.node_size
            end = time.monotonic() + CONNECT_SECONDS
            strangers = 0
            while None in peers[1:]:
                listener.settimeout(max(0.0, end - time.monotonic()))
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    missing = [self._ranks[r] for r in range(1, self.node_size) if peers[r] is None]
                    raise NodeLinkError(f"ranks {missing} did not connect to rank {self._ranks[0]} within "
                                        f"{CONNECT_SECONDS:g} s ({strangers} other processes tried)") from None
                sock.settimeout(max(0.0, end - time.monotonic()))
                try:
                    claimed = int.from_bytes(sock.recv(4).ljust(4, b"\0"), "little")
                except OSError:
                    claimed = 0  # silent, or gone: not a rank of this node
                if not 0 < claimed < self.node_size or peers[claimed] is not None or not self._vouched(sock, claimed):
                    sock.close()  # a process that is not the rank it claims to be: not let in
                    strangers += 1
                    continue
                sock.setblocking(False)
                peers[claimed] = sock
            return peers
        finally:
            listener.close()
            shutil.rmtree(directory, ignore_errors=True)

    def _vouched(self, sock, node_rank):
        # The kernel's word on the connecting process, where it gives it (Linux): the rank's pid and our user.
        if not hasattr(socket, "SO_PEERCRED"):
            return True
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid == self._pids[node_rank] and uid == os.getuid()

    def _bcast_path(self, MPI, node, path):
        # Typed bytes, no pickle: a fixed buffer the size of the longest socket path.
        buf = np.zeros(256, dtype=np.uint8)
        if path is not None:
            encoded = os.fsencode(path)
            buf[:len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        node.Bcast([buf, MPI.UINT8_T], root=0)
        return os.fsdecode(buf.tobytes().rstrip(b"\0"))

    def _connect(self, MPI, node):
        """A rank that is not its node's leader: connect to the leader's socket and say which rank it is."""
        path = self._bcast_path(MPI, node, None)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_SECONDS)
        sock.connect(path)
        sock.sendall(self.node_rank.to_bytes(4, "little"))
        sock.setblocking(False)
        return sock

    @staticmethod
    def carries(buf):
        """Whether the relay takes `buf`: a C-contiguous float64 or int64 array."""
        return buf.dtype.char in _DTYPES and buf.flags.c_contiguous

    def waiter(self, sock, send):
        """A ``select.poll`` object that waits for `sock` to take data (`send`) or to have some."""
        key = (sock.fileno(), send)
        if key not in self._waiters:
            self._waiters[key] = select.poll()
            self._waiters[key].register(sock, select.POLLOUT if send else select.POLLIN)
        return self._waiters[key]

    # ---- the collectives -----------------------------------------------------------------------------

    def _header(self, operation, buf):
        """The next message's header: sequence number, operation and dtype, byte count."""
        self._sequence += 1
        return _HEADER.pack(self._sequence, 16 * _OPERATIONS[operation] + _DTYPES[buf.dtype.char], buf.nbytes)

    def _wait(self, messages, what):
        self._watch.wait(Exchange(self, messages), what)

    def _receive(self, sock, peer, header, payload, what):
        """Receive rank `peer`'s message into `payload` (a byte view), once its header is `header`."""
        received = bytearray(_HEADER.size)
        # Views, not the bytearray: a partial read goes on into the same memory (a slice of it would copy).
        self._wait([(sock, [memoryview(received), payload], False, peer)], what)
        if received != header:
            raise NodeLinkError(f"node relay: rank {peer} sent {_describe(received)} where {_describe(header)} "
                                f"was due, in {what}")

    def _send_all(self, header, buf, what):
        payload = _bytes(buf)
        self._wait([(self._peers[r], [header, payload], True, self._ranks[r]) for r in range(1, self.node_size)],
                   what)

    def bcast(self, buf, what):
        """Broadcast the contiguous float64 or int64 array `buf` in place from rank 0 (collective)."""
        header = self._header("broadcast", buf)
        if self.leader:
            if self.leaders.Get_size() > 1:
                self._watch.wait(self.leaders.Ibcast(buf, root=0), what)
            self._send_all(header, buf, what)
        else:
            self._receive(self._leader, self._ranks[0], header, _bytes(buf), what)
        return buf

    def allreduce(self, buf, operation, what):
        """Combine the contiguous float64 or int64 array `buf` over all ranks in place (collective).

        `operation` is ``"sum"``, ``"maximum"`` or ``"minimum"``. The leader combines
        its node's buffers in node rank order: a float64 sum is the same for the same
        ranks whatever the timing, an int64 sum for any ranks.
        """
        header = self._header(operation, buf)
        if self.leader:
            part = np.empty_like(buf)
            for node_rank in range(1, self.node_size):
                self._receive(self._peers[node_rank], self._ranks[node_rank], header, _bytes(part), what)
                _COMBINE[operation](buf, part, out=buf)
            if self.leaders.Get_size() > 1:
                self._watch.wait(self.leaders.Iallreduce(self._MPI.IN_PLACE, buf, op=self._mpi_operations[operation]),
                                 what)
            self._send_all(header, buf, what)
        else:
            # The result comes into `buf` only after this rank's part has left it: the leader answers
            # after it has every part.
            self._wait([(self._leader, [header, _bytes(buf)], True, self._ranks[0])], what)
            self._receive(self._leader, self._ranks[0], header, _bytes(buf), what)
        return buf

    def lost(self, peer, reason):
        """Rank `peer`'s socket failed in an exchange: end the job, naming it once.

        The leader names a lost rank of its node. Where the leader is lost, its
        node's lowest other rank names it and the others end quietly.
        """
        text = f"rank {peer} left the node relay ({reason}): it exited or was killed"
        if self.leader or self.node_rank == 1:
            raise NodeLinkError(text)
        time.sleep(0.5)
        abort(self._MPI, EXIT_LOST_RANK)


def node_relay(MPI, comm, watch, shared):
    """The node relay of `comm` if any node's ranks share cores, else None (collective).

    Parameters
    ----------
    MPI : module
        ``mpi4py.MPI``.
    comm : mpi4py.MPI.Intracomm
    watch : prbmrm.distributed.watch.Watch
        The communicator's watch.
    shared : bool
        Whether this node's ranks share cores (:func:`prbmrm.distributed.watch.ranks_share_cores`).
        Every rank must take the same path, so one node that shares decides for all.

    Returns
    -------
    NodeRelay or None
    """
    anywhere = np.array([int(shared)], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, [anywhere, MPI.INT64_T], op=MPI.MAX)
    if not anywhere[0]:
        return None
    try:
        return NodeRelay(MPI, comm, comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank()), watch)
    except (NodeLinkError, OSError) as error:
        # Before any command's error handling: say it here, and end the job (the node's ranks wait).
        print(f"prbmrm: error (rank {comm.Get_rank()}): could not set up the node relay: {error}", file=sys.stderr,
              flush=True)
        abort(MPI, EXIT_LOST_RANK)
