"""Run the rank-agnostic tests (marker ``distributed``) under ``mpiexec -n 2`` and ``-n 3``.

Each run has a timeout, so a deadlock fails this test instead of hanging the
suite; inside the ranks pytest-timeout uses its thread method, which ends a
rank blocked in an MPI call.
"""

import sys

import pytest

from conftest import REPO, mpiexec


@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_tests_pass_under_mpiexec(ranks, tmp_path):
    import subprocess

    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "pytest", "--with-mpi", "-m",
               "distributed", "-q", "-p", "no:cacheprovider", "-o", "timeout_method=thread",
               "--timeout", "240", f"--basetemp={tmp_path}", "tests"]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                               stdin=subprocess.DEVNULL)
    summary = [line for line in completed.stdout.splitlines() if " passed" in line or " failed" in line]
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-3000:]
    assert len(summary) == ranks and all("failed" not in line for line in summary), summary
