"""No hang: a silent rank ends a job within --rank-timeout, a signal to any one rank stops it cleanly.

A 3-rank ``mpiexec`` job on the a9a demo options of test_checkpoint, one of
its ranks stopped with SIGSTOP (what a hung node or a cut network looks
like to the others) or signalled alone. The timeouts are short here; the
assertions allow generous margins for a loaded machine.
"""

import os
import signal
import time
import warnings

import pytest

from prbmrm.checkpoint import load_checkpoint
from prbmrm.model import load_model
from prbmrm.distributed.watch import EXIT_SILENT_RANK, PONG_SECONDS
from test_checkpoint import end_job, rank_pids, start_job

TIMEOUT = 3  # --rank-timeout of these jobs


@pytest.fixture
def stopped():
    """Stop processes with SIGSTOP; continue them (and so let them die) at the end."""
    pids = []
    yield lambda pid: (pids.append(pid), os.kill(pid, signal.SIGSTOP))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def ranks_end(path, within=10):
    """Whether every rank of the job marked `path` is gone within `within` seconds (the
    launcher may return while its proxies still take the ranks down)."""
    deadline = time.monotonic() + within
    while rank_pids(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    return rank_pids(path) == {}


@pytest.mark.parametrize("rank", [1, 0])
def test_a_stopped_rank_ends_the_job_naming_it(tmp_path, stopped, rank):
    job, path = start_job(tmp_path, 3, "--rank-timeout", str(TIMEOUT))
    pids = rank_pids(path)
    status, _, stderr = end_job(job, lambda: stopped(pids[rank]), within=TIMEOUT + 10)
    assert status == EXIT_SILENT_RANK, stderr
    assert f"rank {rank} of 3 stopped answering" in stderr
    assert stderr.count("stopped answering") == 1  # the lowest live rank alone says it
    assert ranks_end(path)  # the stopped rank is gone too


def test_sigterm_to_mpiexec_while_a_rank_is_stopped_ends_the_job(tmp_path, stopped):
    # A long timeout: the signal, not the timeout, must end this one.
    job, path = start_job(tmp_path, 3, "--rank-timeout", "600")
    pids = rank_pids(path)
    stopped(pids[2])
    # Ending at all is the property; how soon depends on the machine's load (6.6-7.5 s for the whole job
    # alone, beside stress-ng and beside a 16-rank job; once over 15 s in a full parallel suite run).
    status, seconds, stderr = end_job(job, lambda: job.send_signal(signal.SIGTERM), within=PONG_SECONDS + 60)
    assert status != 0, stderr
    assert "rank 2 of 3 stopped answering (after signal 15" in stderr
    if seconds > PONG_SECONDS + 10:
        warnings.warn(f"the job took {seconds:.1f} s to end after SIGTERM (the watch's {PONG_SECONDS} s + 10 s)")
    assert ranks_end(path)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_one_serving_rank_stops_the_job_with_a_checkpoint(tmp_path, signum):
    """Rank 2 alone gets the signal: it forwards it to rank 0, which ends the run cleanly."""
    job, path = start_job(tmp_path)
    pids = rank_pids(path)
    status, _, stderr = end_job(job, lambda: os.kill(pids[2], signum), within=10)
    assert status == 128 + signum, stderr
    assert f"interrupted by signal {signum}" in stderr and "Abort" not in stderr
    assert not (tmp_path / "model.h5").exists()
    model = load_model(str(tmp_path / "model.interrupted.h5"))
    assert model.attrs["iterations"] == load_checkpoint(path)[1]["iteration"]
