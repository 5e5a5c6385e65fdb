"""Fixtures of the whole suite: the communicator, and each rank's own temporary directory under mpiexec."""

import os

import pytest


@pytest.fixture
def comm():
    """The communicator of this process: serial under plain pytest, MPI under mpiexec."""
    from prbmrm.distributed.comm import get_comm

    return get_comm()


def pytest_configure(config):
    # Under mpiexec every rank runs pytest: give each its own base temporary
    # directory (pytest_mpi's mpi_tmp_path shares rank 0's where a test needs it).
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    if rank is not None and config.option.basetemp:
        config.option.basetemp = os.path.join(config.option.basetemp, f"rank{rank}")
    config.addinivalue_line("markers", "distributed: rank-agnostic tests that tests/distributed/test_mpiexec.py "
                            "also runs under mpiexec -n 2 and -n 3")


def pytest_collection_modifyitems(config, items):
    # The slow modules first: on parallel workers (pytest-xdist) a test of several minutes that starts last
    # would run alone at the end. A stable sort keeps each module's own order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
