"""The watch's waits, on a fake communicator whose ranks never answer (no MPI job needed), and where ranks
spin before they sleep (under mpiexec)."""

import os

import pytest

from prbmrm.distributed import watch


class Request:
    """A nonblocking request that completes once `done()` says so."""

    def __init__(self, done=lambda: False):
        self.done = done

    def Test(self):
        return self.done()


class SilentComm:
    """Rank 0 of 3; the other ranks never answer (stopped processes)."""

    def __init__(self):
        self.sent = 0

    def Dup(self):
        return self

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 3

    def Isend(self, buffer, dest, tag):
        self.sent += 1
        return Request()

    def Iprobe(self, source, tag, status):
        return False


class Ended(Exception):
    pass


class FakeMPI:
    THREAD_MULTIPLE = 3
    INT64_T = None
    ANY_SOURCE = -1
    Status = object

    @staticmethod
    def Query_thread():
        return FakeMPI.THREAD_MULTIPLE


@pytest.fixture
def silent_watch(monkeypatch):
    monkeypatch.setattr(watch, "PONG_SECONDS", 0.2)
    monkeypatch.setattr(watch, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(watch, "SIGNAL_GRACE", 3.0)

    def abort(MPI, status):
        raise Ended(status)

    monkeypatch.setattr(watch, "abort", abort)
    comm = SilentComm()
    w = watch.Watch(FakeMPI, comm, timeout=600)
    yield w, comm
    w.close()


def test_a_signal_makes_the_wait_ping_at_once_and_name_the_silent_ranks(silent_watch, capsys):
    w, _ = silent_watch
    w.request_stop(15)
    with pytest.raises(Ended) as ended:
        w.wait(Request(), "the sum")
    assert ended.value.args == (watch.EXIT_SILENT_RANK,)
    assert "ranks 1, 2 of 3 stopped answering (after signal 15" in capsys.readouterr().err


def test_a_collective_completing_during_the_signals_ping_leaves_the_next_wait_to_ping(silent_watch, capsys):
    """The ranks took part in the first collective and stopped before the next; the first one's ping proves
    nothing about them, so the next wait pings at once rather than waiting out the signal's grace."""
    w, comm = silent_watch
    w.request_stop(15)
    w.wait(Request(lambda: comm.sent > 0), "the first sum")  # completes while its ping waits
    with pytest.raises(Ended) as ended:
        w.wait(Request(), "the next sum")
    assert ended.value.args == (watch.EXIT_SILENT_RANK,)
    assert "stopped answering (after signal 15, the next sum waited" in capsys.readouterr().err


class FakeClock:
    """``time`` for the watch: each reading advances the clock a microsecond (a poll's cost), sleeps advance
    it instead of waiting, and are recorded."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self):
        self.now += 1e-6
        return self.now

    def sleep(self, seconds):
        self.sleeps.append((self.now, seconds))
        self.now += seconds


def test_a_wait_sleeps_a_tenth_of_its_wait_at_most_half_a_millisecond_for_an_iterations_time(monkeypatch):
    """The tree collectives go on a round at each poll: waits as long as an iteration's keep polls at most
    0.5 ms apart; a long wait's polls spread to 2 ms apart, 500 a second."""
    clock = FakeClock()
    monkeypatch.setattr(watch, "time", clock)

    class NoThreads(FakeMPI):
        @staticmethod
        def Query_thread():
            return 0

    w = watch.Watch(NoThreads, SilentComm(), timeout=600)
    w.wait(Request(lambda: clock.now >= 2.0), "a long sum")
    assert all(s <= max(watch.MIN_SLEEP, 0.1 * at) for at, s in clock.sleeps)
    assert max(s for at, s in clock.sleeps if at < 0.05) == pytest.approx(5e-4)
    assert max(s for at, s in clock.sleeps) == pytest.approx(2e-3)
    assert min(at for at, s in clock.sleeps) >= watch.SPIN_SECONDS
    # From 50 ms on the cap grows with the wait, 1% of it, to 2 ms at 0.2 s.
    ramp = [(at, s) for at, s in clock.sleeps if 0.05 <= at < 0.2]
    assert all(s <= 0.01 * at + 1e-9 for at, s in ramp) and max(s for at, s in ramp) > 1.5e-3
    late = [s for at, s in clock.sleeps if at >= 0.2]
    assert late and all(s == pytest.approx(2e-3) for s in late)
    # The first 0.2 s take 256 polls (a 2 ms cap from 20 ms on would take about 130; 0.5 ms throughout, 400).
    assert sum(at < 0.2 for at, s in clock.sleeps) < 300


SPIN_OF_A_RANK = """
import os
import numpy as np
from prbmrm.distributed.comm import MPIComm
comm = MPIComm()
rows = comm.allgather_array(np.array([comm.rank, len(os.sched_getaffinity(0)), comm.watch.spin,
                                     comm.relay is not None]))
if comm.rank == 0:
    print(rows.tolist())
"""


@pytest.mark.parametrize("ranks, cores", [(2, None), (3, None), (2, "0"), (2, "0,1")])
def test_ranks_spin_before_sleeping_only_with_a_core_each(ranks, cores):
    """A wait spins only where the node's ranks have at least a core each (the union of their affinity
    masks): here 2 ranks on 2 cores spin, 3 ranks on 2 cores or 2 ranks restricted to one core do not,
    and relay their collectives through the node's leader (:mod:`prbmrm.distributed.relay`)."""
    import shutil

    from helpers import run_ranks

    if cores is not None and shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed: cannot restrict the ranks' cores")
    if cores is not None and not {int(cpu) for cpu in cores.split(",")} <= os.sched_getaffinity(0):
        pytest.skip(f"the suite may not run on cores {cores} of this machine")
    available = len(os.sched_getaffinity(0)) if cores is None else len(cores.split(","))
    if cores is None and available != 2:
        pytest.skip(f"this machine gives the suite {available} cores, the case is written for 2")
    prefix = [] if cores is None else ["taskset", "-c", cores]
    done, _ = run_ranks(ranks, ["-c", SPIN_OF_A_RANK], prefix=prefix)
    assert done.returncode == 0, done.stderr
    shared = ranks > available
    expected = [0.0 if shared else watch.SPIN_SECONDS, float(shared)]  # and where they share, the node relay
    assert done.stdout.strip() == str([[float(rank), float(available), *expected] for rank in range(ranks)])


class NodeOf:
    """A node communicator of `size` ranks whose masks all equal this rank's."""

    COMM_TYPE_SHARED, UINT8_T = 1, None

    def __init__(self, size):
        self.size, self.freed = size, False

    def Split_type(self, kind):
        return self

    def Get_size(self):
        return self.size

    def Allgather(self, send, receive):
        receive[0][:] = send[0]

    def Free(self):
        self.freed = True


@pytest.mark.parametrize("ranks, shared", [(4, False), (5, True)])
def test_without_affinity_masks_the_ranks_may_run_on_every_core(monkeypatch, ranks, shared):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    node = NodeOf(ranks)
    assert watch.ranks_share_cores(NodeOf, node) is shared
    assert node.freed
