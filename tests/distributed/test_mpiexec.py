"""Run the rank-agnostic tests (marker ``distributed``) under ``mpiexec -n 2`` and ``-n 3``.

Each run has a timeout, so a deadlock fails this test instead of hanging the
suite; inside the ranks pytest-timeout uses its thread method, which ends a
rank blocked in an MPI call.
"""

import re
import sys

import pytest

from helpers import HANG_SECONDS, REPO, mpiexec

pytestmark = pytest.mark.slow  # the rank-agnostic tests again under mpiexec -n 2 and -n 3


@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_tests_pass_under_mpiexec(ranks, tmp_path, request):
    import subprocess

    # The files of this session's rank-agnostic tests (all of them when this file runs alone): each rank
    # collecting the whole suite cost it 15 CPU s, against 10 for these files.
    files = sorted({str(item.path) for item in request.session.items if item.get_closest_marker("distributed")})
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "pytest", "--with-mpi", "-n", "0", "-m",
               "distributed", "-q", "-p", "no:cacheprovider", "-o", "timeout_method=thread",
               "--timeout", str(HANG_SECONDS), f"--basetemp={tmp_path}", *(files or ["tests"])]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=2 * HANG_SECONDS - 100,
                               stdin=subprocess.DEVNULL)
    assert completed.returncode == 0, completed.stdout[-6000:] + completed.stderr[-3000:]
    # Searched in the whole output: the ranks' summary lines may interleave on one line.
    passed = re.findall(r"(\d+) passed", completed.stdout)
    assert len(passed) == ranks and len(set(passed)) == 1 and int(passed[0]) > 0, completed.stdout[-3000:]
    assert not re.search(r"\d+ (failed|error)", completed.stdout), completed.stdout[-6000:]
