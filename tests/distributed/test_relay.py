"""The node relay (where a node's ranks share cores): its collectives against sums made independently,
and a rank that leaves it, or speaks out of step, named at once.

The ranks run under ``taskset -c 0``: 3 ranks on one core share it on any machine, so the relay is on.
An exchange's socket work is checked on a socket pair."""

import os
import shutil

import pytest

from helpers import run_ranks

CORE = ["taskset", "-c", "0"]


@pytest.fixture
def one_core():
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed: cannot put the ranks on one core")
    if 0 not in os.sched_getaffinity(0):
        pytest.skip("the suite may not run on core 0 of this machine")


COLLECTIVES = """
import numpy as np
from prbmrm.distributed.comm import MPIComm

comm = MPIComm()
assert comm.relay is not None, "3 ranks on one core: the relay is on"
def part(rank, n, dtype):
    rng = np.random.default_rng([rank, n])
    if dtype == np.int64:
        return rng.integers(-2**60, 2**60, n)
    return rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
# Small, and larger than a socket's buffer: the exchanges go on over many system calls.
for n in (1, 118, 3 * 2**20 + 5):
    expected_int = part(0, n, np.int64)
    expected_float = part(0, n, np.float64)
    for rank in range(1, comm.size):
        expected_int = expected_int + part(rank, n, np.int64)  # int64 wraps alike in any order
        expected_float = expected_float + part(rank, n, np.float64)  # in rank order, as the leader adds
    mine_int, mine_float = part(comm.rank, n, np.int64), part(comm.rank, n, np.float64)
    assert np.array_equal(comm.allreduce_sum(mine_int.copy()), expected_int)
    assert np.array_equal(comm.allreduce_sum(mine_float.copy()), expected_float)
    everyone = [part(rank, n, np.float64) for rank in range(comm.size)]
    assert np.array_equal(comm.allreduce_max(mine_float), np.max(everyone, axis=0))
    assert np.array_equal(comm.allreduce_min(mine_float), np.min(everyone, axis=0))
    w = part(0, n, np.float64) if comm.rank == 0 else np.zeros(n)
    assert np.array_equal(comm.bcast_array(w), part(0, n, np.float64))
    # MPI's own collectives in between keep their order.
    assert comm.allgather_array(np.array([comm.rank, n])).tolist() == [[r, n] for r in range(comm.size)]
comm.barrier()  # every rank got here: its assertions held
if comm.rank == 0:
    print("ok", comm.size)
"""


@pytest.mark.usefixtures("one_core")
def test_relayed_collectives_equal_sums_made_independently():
    done, _ = run_ranks(3, ["-c", COLLECTIVES], prefix=CORE, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "ok 3\n"


LEAVER = """
import os, sys, time
import numpy as np
from prbmrm.distributed.comm import MPIComm
from prbmrm.distributed.relay import NodeLinkError

comm = MPIComm(timeout=3600)  # no ping for an hour: only the relay can name the lost rank in time
assert comm.relay is not None
comm.allreduce_sum(np.ones(4))
if comm.rank == {leaver}:
    os._exit(0)  # leaves without a word, as a plug-in calling os._exit would
try:
    if {mismatch} and comm.rank == 1:
        comm.allreduce_sum(np.ones(5))
    else:
        comm.allreduce_sum(np.ones(4))
        comm.allreduce_sum(np.ones(4))
except NodeLinkError as error:
    print(f"rank {{comm.rank}}: {{error}}", file=sys.stderr, flush=True)
    comm.abort(6)
time.sleep(3600)  # a rank nobody ends would hang the job: run_ranks's timeout fails the test
"""


@pytest.mark.usefixtures("one_core")
@pytest.mark.parametrize("leaver, named, mismatch", [
    (2, "rank 2 left the node relay (its socket closed)", False),
    (0, "rank 0 left the node relay (", False),  # its socket closed, or was reset
    (-1, "rank 1 sent message 2 (a sum of 40 bytes of float64) where message 2 (a sum of 32 bytes of float64) "
         "was due, in a sum over ranks", True),
])
def test_a_rank_that_leaves_or_speaks_out_of_step_is_named_at_once(leaver, named, mismatch):
    # The ranks' timeout is an hour, their last sleep too: the job ends only if the relay ends it.
    done, _ = run_ranks(3, ["-c", LEAVER.format(leaver=leaver, mismatch=mismatch)], prefix=CORE)
    if leaver >= 0 and "BAD TERMINATION" in done.stdout:
        # mpiexec (hydra) saw the rank leave without MPI_Finalize and ended the job itself, first.
        return
    # The naming rank aborts the job (status 6). Once a rank has left with status 0, MPICH's mpiexec ends
    # the job with that status, 0, as soon as another rank aborts.
    assert done.returncode != 0 or leaver >= 0, done.stderr[-3000:]
    assert named in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    # Named once: by the leader for a rank of its node, by the node's next rank for the leader.
    assert done.stderr.count("node relay") == 1, done.stderr[-3000:]


class Relay:
    """What an exchange needs of its relay: the poll objects, and word of a lost peer."""

    def __init__(self):
        self.lost_peers = []

    def waiter(self, sock, send):
        import select

        waiter = select.poll()
        waiter.register(sock, select.POLLOUT if send else select.POLLIN)
        return waiter

    def lost(self, peer, reason):
        self.lost_peers.append((peer, reason))
        raise ConnectionError(reason)


def test_an_exchange_goes_on_where_a_message_arrives_a_byte_at_a_time():
    import socket

    import numpy as np

    from prbmrm.distributed.relay import Exchange

    here, there = socket.socketpair()
    here.setblocking(False)
    header, payload = bytearray(24), np.zeros(5)
    relay = Relay()
    exchange = Exchange(relay, [(here, [memoryview(header), memoryview(payload).cast("B")], False, 1)])
    sent = bytes(range(24)) + np.arange(5.0).tobytes()
    for byte in range(len(sent)):
        assert not exchange.Test()  # the message is not through until its last byte
        there.send(sent[byte:byte + 1])
        exchange.block(1.0)
    assert exchange.Test()
    assert bytes(header) == bytes(range(24)) and payload.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # A peer that closes its end mid-message is lost, not waited for.
    exchange = Exchange(relay, [(here, [memoryview(header)], False, 7)])
    there.send(b"abc")
    there.close()
    exchange.block(1.0)
    with pytest.raises(ConnectionError):
        exchange.Test()
    assert relay.lost_peers == [(7, "its socket closed")]
    here.close()
