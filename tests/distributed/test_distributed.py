"""Rank-agnostic tests: run serially by plain pytest and on 2 and 3 ranks by test_mpiexec.py.

Each compares the distributed computation with a serial one over the whole
data set that rank 0 makes itself, so "P ranks agree with 1 rank" is checked
for every P the suite runs under. Shard counts are chosen so ranks hold
uneven shares.
"""

import numpy as np
import pytest

from helpers import check_against_serial, check_run_against_serial, load_svmlight, shared_shards
from prbmrm.io import load_local
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk, run_distributed

pytestmark = pytest.mark.distributed


def dna_binary():
    X, y = load_svmlight("dna.scale.xz")
    return X, np.where(y == 3, 1.0, -1.0)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "least_squares"])
def test_risk_and_subgradient_equal_serial(comm, mpi_tmp_path, loss):
    X, y = dna_binary()
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 2)
    local = load_local(directory, comm)
    check_against_serial(lambda: get_loss(loss), local, comm, X, y)


@pytest.mark.parametrize("loss", ["hinge", "logistic", "least_squares"])
def test_bmrm_run_equals_serial_run(comm, mpi_tmp_path, loss):
    check_run_against_serial(comm, mpi_tmp_path, loss, 1e-3, epsilon=0, rel_epsilon=1e-4, max_iter=2000)


def test_collective_check_raises_on_every_rank(comm):
    from prbmrm.errors import CollectiveError

    problem = ValueError("bad shard on the last rank") if comm.rank == comm.size - 1 else None
    with pytest.raises(CollectiveError, match="bad shard on the last rank"):
        comm.check(problem)
    comm.check(None)


def test_gather_and_scatter_of_scalars(comm):
    local = np.arange(comm.rank + 2, dtype=np.float64) + 10 * comm.rank
    full = comm.gather_scalars(local)
    counts = comm.gather_counts(local.size)
    if comm.is_root:
        expected = np.concatenate([np.arange(r + 2) + 10.0 * r for r in range(comm.size)])
        np.testing.assert_array_equal(full, expected)
        full = 2 * full
    back = comm.scatter_scalars(full, counts)
    np.testing.assert_array_equal(back, 2 * local)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_gathered_arrays_reach_rank_0_alone_and_a_total_above_the_limit_is_refused(comm, dtype):
    from prbmrm.distributed.messages import ProtocolError

    local = (np.arange(comm.rank + 1) + 100 * comm.rank).astype(dtype)
    total = comm.size * (comm.size + 1) // 2
    full = comm.gatherv_array(local, total)
    if comm.is_root:
        expected = np.concatenate([np.arange(r + 1) + 100 * r for r in range(comm.size)]).astype(dtype)
        assert full.dtype == dtype
        np.testing.assert_array_equal(full, expected)
    else:
        assert full is None
    with pytest.raises(ProtocolError):  # on every rank alike, before any rank allocates the whole
        comm.gatherv_array(local, total - 1)


def test_rank_failure_in_the_solver_reaches_every_rank(comm):
    from prbmrm.errors import CollectiveError, InputError

    X = np.ones((comm.size * 2, 2))
    y = np.ones(comm.size * 2)
    rows = slice(2 * comm.rank, 2 * comm.rank + 2)
    oracle = DistributedRisk(get_loss("hinge"), X[rows], y[rows], len(y), comm)

    def failing(risk):
        risk(np.zeros(2))
        raise InputError("objective is not finite")

    with pytest.raises(CollectiveError, match="not finite"):
        run_distributed(oracle, failing)


class HingeFailingOnLabelTwo(type(get_loss("hinge"))):
    """The hinge loss, except that a block holding the label 2 makes it fail (a bug on one rank)."""

    def loss_gradient(self, w, X, y, qid=None):
        if np.any(y == 2):
            raise ZeroDivisionError("label two")
        return super().loss_gradient(w, X, y, qid)


@pytest.mark.timeout(60)
def test_a_rank_failing_inside_the_risk_stops_every_rank(comm):
    from prbmrm.errors import CollectiveError
    from prbmrm.solvers import minimize

    X = np.ones((comm.size * 2, 2))
    y = np.ones(comm.size * 2)
    y[-1] = 2.0  # only on the last rank
    rows = slice(2 * comm.rank, 2 * comm.rank + 2)
    oracle = DistributedRisk(HingeFailingOnLabelTwo(), X[rows], y[rows], len(y), comm)
    # Every rank raises the same message, naming the failing rank and the error's type,
    # and none is left waiting in a collective.
    with pytest.raises(CollectiveError, match=f"rank {comm.size - 1} failed computing its risk: "
                                              "ZeroDivisionError: label two"):
        run_distributed(oracle, lambda risk: minimize(risk, np.zeros(2), 1.0))
    comm.barrier()


class HingeThroughRankZero(__import__("prbmrm.losses", fromlist=["MultivariateLoss"]).MultivariateLoss):
    """The hinge loss computed the non-decomposable way: scores to rank 0, coefficients back."""

    name = "hinge_through_rank_zero"

    def coefficients(self, f, y, qid=None):
        active = y * f < 1.0
        return float(np.sum(np.maximum(0.0, 1.0 - y * f))), -y * active


def test_non_decomposable_path_equals_the_decomposable_one(comm, mpi_tmp_path):
    X, y = dna_binary()
    directory = shared_shards(comm, mpi_tmp_path, X, y, parts=comm.size + 1)
    local = load_local(directory, comm)
    points = np.random.default_rng(5).normal(size=(3, X.shape[1])) * 0.1
    results = []
    for loss in (HingeThroughRankZero(), get_loss("hinge")):
        oracle = DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks)
        results.append(run_distributed(oracle, lambda risk: [risk(w) for w in points]))
    if comm.is_root:
        for (r1, a1), (r2, a2) in zip(*results):
            assert r1 == pytest.approx(r2, rel=1e-12)
            np.testing.assert_allclose(a1, a2, rtol=1e-12, atol=1e-15)
