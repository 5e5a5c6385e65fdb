"""Errors end the job: a fault injected on one rank (rank 0 included) of an ``mpiexec -n 2`` or ``-n 3`` job,
at its 20th risk evaluation, gives one message naming the rank and the error and a non-zero exit, in plain
and party mode; a rank stuck in a loop that answers pings is named after ``--iteration-timeout``; SIGTERM
ends a job whose rank is stuck.

The faults are injected by ``fault_driver.py`` (it patches the oracle from outside; production code has no
hook). The deadlines are hang guards, not speed checks.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, load_svmlight, mpiexec, run_ranks
from prbmrm.distributed.watch import EXIT_SILENT_RANK, SIGNAL_GRACE

DRIVER = os.path.join(REPO, "tests", "distributed", "fault_driver.py")
RUN = ["--solver", "bmrm", "--lam", "1e-6", "--rel-epsilon", "1e-9", "--max-iter", "400", "--quiet",
       "--rank-timeout", "5"]
HANG = 120  # seconds: far beyond --rank-timeout + 10 s even on a loaded machine


def errors(completed):
    """The lines of the job's own messages (not the launcher's)."""
    return [line for line in completed.stderr.splitlines() if line.startswith(("prbmrm", "prbmrm.cli.train"))]


def fault_run(tmp_path, ranks, kind, rank, *options):
    completed, _ = run_ranks(ranks, [DRIVER, kind, str(rank), "20", *RUN, "--out", str(tmp_path / "m.h5"),
                                     *options], timeout=HANG)
    assert not (tmp_path / "m.h5").exists()
    return completed


@pytest.mark.parametrize("ranks, rank", [(2, 0), (2, 1), (3, 0), (3, 2)])
def test_an_exception_in_any_ranks_risk_evaluation_ends_the_job_naming_it(tmp_path, ranks, rank):
    completed = fault_run(tmp_path, ranks, "memory", rank)
    assert completed.returncode == 2, completed.stderr
    assert errors(completed) == [f"prbmrm.cli.train: error: rank {rank} failed computing its risk: "
                                 "MemoryError: injected"], completed.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_an_exception_in_rank_0s_solver_ends_the_job(tmp_path, ranks):
    completed = fault_run(tmp_path, ranks, "solver", 0)
    assert completed.returncode == 1, completed.stderr
    assert errors(completed) == [f"prbmrm.cli.train: error: rank 0 of {ranks} ran out of memory "
                                 "(injected in the solver)"], completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize("rank", [0, 2])
def test_a_rank_that_exits_is_reported_as_exited_with_its_status(tmp_path, rank):
    completed = fault_run(tmp_path, 3, "exit", rank)
    assert completed.returncode != 0, completed.stderr
    assert errors(completed) == [f"prbmrm.cli.train: error: rank {rank} exited with status 3 while computing "
                                 "its risk"], completed.stderr


@pytest.mark.parametrize("ranks, rank", [(2, 1), (3, 0)])
def test_a_rank_stuck_in_a_loop_that_answers_pings_is_named_after_the_iteration_timeout(tmp_path, ranks, rank):
    completed = fault_run(tmp_path, ranks, "stuck", rank, "--iteration-timeout", "3")
    assert completed.returncode == EXIT_SILENT_RANK, completed.stderr
    found = errors(completed)
    assert len(found) == 1 and found[0].startswith(f"prbmrm: error: rank {rank} of {ranks} made no progress for "), \
        completed.stderr
    assert "--iteration-timeout 3" in found[0]


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """The first 3000 rows of a9a over 3 parties, each converted on its own."""
    from prbmrm.io import write_shards

    root = tmp_path_factory.mktemp("sites")
    X, y = load_svmlight("a9a.xz", 123)
    bounds = [0, 900, 2100, 3000]
    for r in range(3):
        write_shards(X[bounds[r]:bounds[r + 1]], y[bounds[r]:bounds[r + 1]], root / f"site-{r}", 1)
    return root


@pytest.mark.parametrize("rank", [0, 1])
def test_party_mode_an_exception_in_any_partys_evaluation_ends_the_job(sites, tmp_path, rank):
    completed, _ = run_ranks(3, [DRIVER, "memory", str(rank), "20", "--parties", "--data", f"{sites}/site-{{rank}}",
                                 "--bias", "--lam", "1e-5", "--rel-epsilon", "1e-9", "--quiet", "--rank-timeout", "5",
                                 "--audit-log", f"{tmp_path}/audit-{{rank}}.jsonl",
                                 "--out", f"{tmp_path}/m-{{rank}}.h5"], timeout=HANG)
    assert completed.returncode == 2, completed.stderr
    assert errors(completed) == [f"prbmrm.cli.train: error: rank {rank} failed computing its risk: "
                                 "MemoryError: injected"], completed.stderr
    assert not list(tmp_path.glob("m-*.h5"))


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_ends_a_job_whose_rank_is_stuck(tmp_path, signals):
    """One SIGTERM to mpiexec: the waiting ranks end the job once the stop has not come within SIGNAL_GRACE
    seconds; a second one ends it at once. (No progress deadline here: the signal must do it.)"""
    command = [mpiexec(), "-n", "3", sys.executable, DRIVER, "stuck", "1", "5", *RUN, "--rank-timeout", "600",
               "--iteration-timeout", "0", "--out", str(tmp_path / "m.h5")]
    job = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    time.sleep(15)  # started, and rank 1 stuck at its 5th evaluation (a hang guard, not a speed check)
    for _ in range(signals):
        job.send_signal(signal.SIGTERM)
        time.sleep(2)
    try:
        _, stderr = job.communicate(timeout=SIGNAL_GRACE + HANG)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        pytest.fail("SIGTERM did not end the job")
    assert job.returncode == 128 + signal.SIGTERM, stderr
    expected = "after signal 15: ending the job" if signals == 2 else "did not stop within 30 s of signal 15"
    assert expected in stderr, stderr
