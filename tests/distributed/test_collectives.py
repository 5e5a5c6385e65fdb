"""One collective per risk evaluation: counted on the mpi4py communicator itself.

Each evaluation of the risk makes exactly two MPI calls on every rank: the broadcast of ``w`` (``Ibcast``)
and ONE ``Iallreduce`` that carries the sums and every rank's status, and nothing else: no rank-to-rank
messages (the former running sum passed P - 1 times), no second reduction. How many messages an Allreduce
takes is MPICH's business: recursive doubling for short buffers (log2 P rounds), Rabenseifner's
reduce-scatter and allgather for long ones (2 log2 P rounds, about 2 (P - 1)/P x 8 bytes per word per
rank): O(log P) messages on the critical path of an iteration, O(d) bytes per rank. The counts are checked
under ``mpiexec -n 2`` and ``-n 3`` (``test_counts_under_mpiexec``).
"""

import collections
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, load_svmlight, mpiexec, shared_shards
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.io import load_local
from prbmrm.losses import get_loss


class Counting:
    """An mpi4py communicator that counts the calls of its methods whose names start with a capital
    (``Ibcast``, ``Iallreduce``, ``Isend``...), and otherwise behaves as the one it wraps."""

    def __init__(self, comm):
        self._comm = comm
        self.calls = collections.Counter()

    def __getattr__(self, name):
        attribute = getattr(self._comm, name)
        if not name[:1].isupper() or name in ("Get_rank", "Get_size", "Dup", "py2f"):
            return attribute

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


@pytest.mark.distributed
def test_one_allreduce_and_one_broadcast_per_risk_evaluation(comm, mpi_tmp_path):
    if comm.size == 1:
        pytest.skip("counts MPI calls: run under mpiexec (test_counts_under_mpiexec)")
    from prbmrm.distributed.comm import MPIComm

    X, y = load_svmlight("a9a.xz", 123)
    directory = shared_shards(comm, mpi_tmp_path, X[:3000], y[:3000], parts=2)
    counted = Counting(comm.comm)
    mpi = MPIComm(counted)
    local = load_local(directory, mpi)
    oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, mpi, local.blocks)
    points = np.random.default_rng(0).normal(size=(6, oracle.dim))
    run_distributed(oracle, lambda risk: risk(points[0]))  # the first sum agrees on the fixed-point bounds
    counted.calls.clear()
    run_distributed(oracle, lambda risk: [risk(w) for w in points[1:]])
    # Per evaluation one broadcast of w and one Allreduce; one more broadcast releases the serving ranks.
    assert dict(counted.calls) == {"Ibcast": 5 + 1, "Iallreduce": 5}


@pytest.mark.parametrize("ranks", [2, 3])
def test_counts_under_mpiexec(ranks, tmp_path):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "pytest", "--with-mpi", "-n", "0", "-m", "distributed",
               "-q", "-p", "no:cacheprovider", "-o", "timeout_method=thread", "--timeout", "240",
               f"--basetemp={tmp_path}", "tests/distributed/test_collectives.py"]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert completed.stdout.count("1 passed") == ranks, completed.stdout[-4000:]
