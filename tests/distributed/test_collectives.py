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
import scipy.sparse as sp

from helpers import REPO, load_svmlight, mpiexec, shared_shards
from prbmrm.distributed.comm import SerialComm
from prbmrm.distributed.oracle import SHORT_WORDS, DistributedRisk, run_distributed
from prbmrm.errors import JointError
from prbmrm.io import load_local
from prbmrm.losses import get_loss
from prbmrm.regularizers import get_regularizer
from prbmrm.solvers import mirror
from prbmrm.solvers.bmrm import minimize_bmrm


class Counting:
    """An mpi4py communicator that counts the calls of its methods whose names start with a capital
    (``Ibcast``, ``Iallreduce``, ``Isend``...), and otherwise behaves as the one it wraps."""

    def __init__(self, comm):
        self._comm = comm
        self.calls = collections.Counter()
        self.sizes = []  # words of each Ibcast
        self.reduced = []  # words of each Iallreduce

    def __getattr__(self, name):
        attribute = getattr(self._comm, name)
        if not name[:1].isupper() or name in ("Get_rank", "Get_size", "Dup", "py2f"):
            return attribute

        def counted(*args, **kwargs):
            self.calls[name] += 1
            if name == "Ibcast":
                self.sizes.append(len(args[0][0]))
            if name == "Iallreduce":
                self.reduced.append(len(args[1]))
            return attribute(*args, **kwargs)

        return counted

    def count_relay(self, mpi, monkeypatch):
        """Where the ranks share cores, `mpi`'s broadcasts from rank 0 and its Allreduces go through the
        node relay (:mod:`prbmrm.distributed.relay`), one relay call for each, in place of the MPI call."""
        relay = mpi.relay
        if relay is None:
            return
        bcast, allreduce = relay.bcast, relay.allreduce

        def relayed_bcast(buf, what):
            self.calls["Ibcast"] += 1
            self.sizes.append(len(buf))
            return bcast(buf, what)

        def relayed_allreduce(buf, operation, what):
            self.calls["Iallreduce"] += 1
            self.reduced.append(len(buf))
            return allreduce(buf, operation, what)

        monkeypatch.setattr(relay, "bcast", relayed_bcast)
        monkeypatch.setattr(relay, "allreduce", relayed_allreduce)


@pytest.mark.distributed
def test_one_allreduce_and_one_broadcast_per_risk_evaluation(comm, mpi_tmp_path, monkeypatch):
    if comm.size == 1:
        pytest.skip("counts MPI calls: run under mpiexec (test_counts_under_mpiexec)")
    from prbmrm.distributed.comm import MPIComm

    X, y = load_svmlight("a9a.xz", 123)
    directory = shared_shards(comm, mpi_tmp_path, X[:3000], y[:3000], parts=2)
    counted = Counting(comm.comm)
    mpi = MPIComm(counted)
    counted.count_relay(mpi, monkeypatch)
    local = load_local(directory, mpi)
    oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, mpi, local.blocks)
    points = np.random.default_rng(0).normal(size=(6, oracle.dim))
    run_distributed(oracle, lambda risk: risk(points[0]))  # the first sum agrees on the fixed-point bounds
    counted.calls.clear()
    run_distributed(oracle, lambda risk: [risk(w) for w in points[1:]])
    # Per evaluation one broadcast of w and one Allreduce; one more broadcast releases the serving ranks.
    assert dict(counted.calls) == {"Ibcast": 5 + 1, "Iallreduce": 5}


def sparse_oracle(comm, tmp_path):
    """Hashed-text-like rows of 2^16 columns (BMRM's bundle is sparse) in 4 shards, and the hinge oracle."""
    rng = np.random.default_rng(3)
    X = sp.random(800, 2 ** 16, density=3e-4, format="csr", random_state=rng)
    X.data[:] = 1.0
    y = np.where(X @ rng.standard_normal(2 ** 16) + 0.1 * rng.standard_normal(800) >= 0, 1.0, -1.0)
    directory = shared_shards(comm, tmp_path, X, y, parts=4)
    local = load_local(directory, comm)
    return DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, comm, local.blocks)


def bmrm(risk, iterations):
    regularizer = get_regularizer("l2")
    regularizer.prepare(risk.dim, 0.0)
    return minimize_bmrm(risk, np.zeros(risk.dim), 1e-3, regularizer, epsilon=0.0, rel_epsilon=0.0,
                         max_iter=iterations)


@pytest.mark.distributed
def test_bmrm_broadcasts_its_multipliers_not_w(comm, mpi_tmp_path, monkeypatch):
    # Every rank keeps a copy of the planes (solvers/mirror.py): an iteration after the first
    # broadcasts alpha and a checksum (t + 3 words), not w (d + 1), and makes one Allreduce.
    if comm.size == 1:
        pytest.skip("counts MPI calls: run under mpiexec (test_counts_under_mpiexec)")
    from prbmrm.distributed.comm import MPIComm

    counted = Counting(comm.comm)
    mpi = MPIComm(counted)
    counted.count_relay(mpi, monkeypatch)
    oracle = sparse_oracle(mpi, mpi_tmp_path)
    run_distributed(oracle, lambda risk: risk(np.zeros(risk.dim)))  # agrees on the fixed-point bounds
    counted.calls.clear()
    counted.sizes.clear()
    retries = oracle.fixed_point.retries
    n = 12
    result = run_distributed(oracle, lambda risk: bmrm(risk, n))
    # Long: one limb, the attach message, w0, two limbs and the stop; short: w0's herald, n - 1
    # multipliers, the detach; the attach's JSON (its length, then its bytes: 2) and its check (an Allreduce).
    long = [size for size in counted.sizes if size == oracle.dim + 1]
    assert len(long) == 5 and counted.calls["Ibcast"] == n + 8
    assert counted.sizes.count(SHORT_WORDS + 2) == n + 1
    assert counted.calls["Iallreduce"] == 1 + n + 2 * (oracle.fixed_point.retries - retries)
    # Each evaluation's sums travel as one int64 limb per component (solvers/bmrm.py: single_limb).
    sums = [size for size in counted.reduced if size > 1]
    assert sums.count(oracle.dim + 1 + len(oracle.fixed_point.status)) == n
    if comm.is_root:
        expected = bmrm(sparse_oracle(SerialComm(), mpi_tmp_path / "serial"), n)
        assert result.nit == n
        np.testing.assert_array_equal(result.w, expected.w)
        np.testing.assert_array_equal(result.history["lower_bound"], expected.history["lower_bound"])


@pytest.mark.distributed
def test_a_copy_of_the_planes_that_gives_another_w_fails_on_every_rank(comm, mpi_tmp_path, monkeypatch):
    if comm.size == 1:
        pytest.skip("needs ranks that copy the planes: run under mpiexec (test_counts_under_mpiexec)")
    if not comm.is_root:
        monkeypatch.setattr(mirror, "checksum", lambda w: -1.0)
    oracle = sparse_oracle(comm, mpi_tmp_path)
    with pytest.raises(JointError, match="copy of the planes gives another w"):
        run_distributed(oracle, lambda risk: bmrm(risk, 5))


@pytest.mark.parametrize("ranks", [2, 3])
def test_counts_under_mpiexec(ranks, tmp_path):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "pytest", "--with-mpi", "-n", "0", "-m", "distributed",
               "-q", "-p", "no:cacheprovider", "-o", "timeout_method=thread", "--timeout", "240",
               f"--basetemp={tmp_path}", "tests/distributed/test_collectives.py"]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert completed.stdout.count("3 passed") == ranks, completed.stdout[-4000:]


def test_a_party_refuses_a_service_that_makes_the_points_or_gathers_the_rows():
    # Party mode (service_points False): its parties check every w, so the coordinator may not send multipliers,
    # and their rows stay theirs, so it may not gather them (dcd).
    from prbmrm.distributed.messages import ProtocolError
    from prbmrm.solvers import dcd

    X, y = np.array([[1.0, 1.0], [-1.0, 1.0]]), np.array([1.0, -1.0])
    oracle = DistributedRisk(get_loss("hinge"), X, y, 2, SerialComm())
    oracle.service_points = False
    for message in (["planes", [0.001, "l2", {}, 10, 0, 0]], ["dcd", [0.001, 0]]):
        with pytest.raises(ProtocolError, match=r"known: argsup, pragam, tron\)"):
            oracle._build_service(message)
    oracle.service_points = True
    assert type(oracle._build_service(["planes", [0.001, "l2", {}, 10, 0, 0]])) is mirror.PlaneMirror
    assert type(oracle._build_service(["dcd", [0.001, 0]])) is dcd.DualDescentRanks
