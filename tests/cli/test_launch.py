"""Launch checks: the rank count must match what the launcher started.

Two mis-launches would otherwise run silently: N copies that each come up as
a 1-rank MPI job (a launcher that does not speak to mpi4py's MPI library:
``srun`` without a working ``--mpi`` plugin, another MPI's ``mpiexec``), and
a rank count other than the Slurm job's ``SLURM_NTASKS`` without a launcher
of the MPI library's own. The launchers' variables are set by hand in
subprocesses; ``mpiexec`` inside an allocation runs under a real ``mpiexec -n 2``.
The templates in slurm/ run on a real Slurm in tests/cli/test_slurm.py.
"""

import os
import subprocess
import sys

import pytest

from helpers import REPO, mpiexec, run_ranks
from prbmrm.cli import shard
from prbmrm.distributed.comm import (LAUNCHER_SIZE_VARIABLES, LAUNCHER_VARIABLES, ONE_NODE_ENVIRONMENT, SLURM_TASKS_VARIABLES,
                         SerialComm, check_launch, launched_by_mpi, one_node)
from prbmrm.errors import CollectiveError

TIMEOUT = 60


def only_errors(stderr):
    # mpi4py itself warns about a foreign launcher's variables (RuntimeWarning lines).
    return [line for line in stderr.splitlines() if ": error" in line]


@pytest.mark.parametrize("variable", ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"])
def test_copy_started_as_a_singleton_fails_clearly(tmp_path, variable):
    out = tmp_path / "m.h5"
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--out", str(out)], timeout=TIMEOUT,
                             env={variable: "4"})
    assert completed.returncode == 2
    errors = only_errors(completed.stderr)
    assert len(errors) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert errors[0].startswith(f"prbmrm.cli.train: error: {variable}=4: ")
    assert "each runs as its own 1-rank MPI job" in errors[0] or "has 1 rank: start it with srun" in errors[0]
    assert not out.exists()


def test_two_copies_from_srun_without_pmi_both_stop(tmp_path):
    """What ``srun -n 2`` without a PMI plugin mpi4py's MPI speaks starts: two 1-rank jobs."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_SIZE_VARIABLES + SLURM_TASKS_VARIABLES}
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    out = tmp_path / "m.h5"
    copies = [subprocess.Popen([sys.executable, "-m", "prbmrm.cli.train", "--out", str(out)],
                               env=dict(env, SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
                                        SLURM_PROCID=str(rank)),
                               cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
              for rank in (0, 1)]
    try:
        results = [(copy.communicate(timeout=TIMEOUT), copy.returncode) for copy in copies]
    finally:
        for copy in copies:
            copy.kill()
    for (stdout, stderr), returncode in results:
        assert returncode == 2 and stdout == ""
        errors = only_errors(stderr)
        assert len(errors) == 1, stderr
        assert "SLURM_STEP_NUM_TASKS=2: 2 processes were started" in errors[0]
        assert "MPICH" in errors[0] and "srun --mpi=pmi2" in errors[0]
    assert not out.exists()


def test_predict_checks_the_launch_too(tmp_path):
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.predict", "--model", str(tmp_path / "none.h5"),
                                 "--data", str(tmp_path)], timeout=TIMEOUT,
                             env={"PMI_SIZE": "3"})
    assert completed.returncode == 2
    errors = only_errors(completed.stderr)
    assert len(errors) == 1 and "PMI_SIZE=3: 3 processes were started" in errors[0], completed.stderr


def test_mpiexec_inside_an_allocation_trusts_the_mpi_library(tmp_path):
    """hydra starts its daemons with ``srun -N 1 -n 1``: the ranks see SLURM_NTASKS=1, PMI_SIZE=2."""
    out = tmp_path / "m.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--quiet", "--out", str(out)], timeout=TIMEOUT,
                             env={"SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_ID": "7"})
    assert completed.returncode == 0, completed.stderr
    assert out.exists()


def test_matching_slurm_ntasks_under_mpiexec_trains(tmp_path):
    out = tmp_path / "m.h5"
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--quiet", "--out", str(out)], timeout=TIMEOUT,
                             env={"SLURM_NTASKS": "2", "SLURM_NPROCS": "2"})
    assert completed.returncode == 0, completed.stderr
    assert out.exists()


# ---- MPI only where a launcher may have started the process ----

# One write of the whole line: print writes its arguments one by one, and under mpiexec (unbuffered)
# the two ranks' pieces interleaved ("MPICommMPIComm 2 True").
WHICH_COMM = ("import sys; from prbmrm.distributed.comm import get_comm; comm = get_comm(); "
              "sys.stdout.write(f\"{type(comm).__name__} {comm.size} {'mpi4py' in sys.modules}\\n\")")


@pytest.mark.parametrize("ranks", [0, 1, 2])
def test_mpi_is_loaded_only_under_a_launcher(ranks):
    """A plain process never imports mpi4py; ``mpiexec -n 1`` and ``-n 2`` still initialise MPI."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES + SLURM_TASKS_VARIABLES}
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    command = [sys.executable, "-c", WHICH_COMM]
    if ranks:
        command = [mpiexec(), "-n", str(ranks), *command]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL, timeout=600)
    assert completed.returncode == 0, completed.stderr
    expected = {0: ["SerialComm 1 False"], 1: ["SerialComm 1 True"], 2: ["MPIComm 2 True"] * 2}[ranks]
    assert sorted(completed.stdout.splitlines()) == expected, completed.stdout


@pytest.mark.parametrize("variable", LAUNCHER_VARIABLES)
def test_every_launcher_variable_asks_for_mpi(variable):
    assert launched_by_mpi({variable: "0"})


def test_no_launcher_variable_no_mpi(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert not launched_by_mpi({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7", "PATH": "/usr/bin"})


@pytest.mark.parametrize("environ, expected", [
    ({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, True),  # hydra on one host
    ({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, False),  # hydra on two
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, False),
    ({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_LOCAL_SIZE": "2"}, True),
    ({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "1", "SLURM_STEP_NUM_NODES": "1"}, False),  # the launcher's count wins
    ({"PMI_SIZE": "2"}, False),
    ({"PMI_SIZE": "2", "SLURM_STEP_NUM_NODES": "1"}, True),  # srun --mpi=pmi2
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1"}, True),  # srun --mpi=pmix
    ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2"}, False),
    ({}, False),
])
def test_one_node_from_the_launchers_variables(environ, expected):
    assert one_node(environ) is expected


# Which environment the MPI library got: the C library's, which it reads, after MPI is loaded.
SEEN_ENVIRONMENT = ("import ctypes, sys; from prbmrm.distributed.comm import get_comm; comm = get_comm(); "
                    "getenv = ctypes.CDLL(None).getenv; getenv.restype = ctypes.c_char_p; "
                    "sys.stdout.write(f\"{comm.size} {(getenv(sys.argv[1].encode()) or b'-').decode()}\\n\")")


@pytest.mark.parametrize("user", [None, "yes"])
def test_one_node_settings_reach_the_mpi_library_unless_the_user_set_them(user):
    """mpiexec -n 2 on this host: every rank loads MPI with :data:`ONE_NODE_ENVIRONMENT` where the user set
    nothing, with the user's value where they did; a plain process sets nothing."""
    (name, value), = ONE_NODE_ENVIRONMENT.items()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES + SLURM_TASKS_VARIABLES + (name,)}
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    if user is not None:
        env[name] = user
    for command, expected in (([mpiexec(), "-n", "2"], [f"2 {user or value}"] * 2), ([], [f"1 {user or '-'}"])):
        completed = subprocess.run([*command, sys.executable, "-c", SEEN_ENVIRONMENT, name], capture_output=True,
                                   text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL, timeout=600)
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.splitlines() == expected, completed.stdout


# ---- check_launch on a given environment: which variable wins ----

class FourRanks(SerialComm):
    """A stand-in for a 4-rank communicator (check raises as on every rank)."""

    size = 4


@pytest.mark.parametrize("environ", [
    {},
    {"PMI_SIZE": "4"},
    {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "PMI_SIZE": "4"},  # srun --mpi=pmi2
    {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "PMIX_RANK": "0"},  # srun --mpi=pmix
    # mpiexec -n 4 in a 2-node job: its daemons' srun step count leaks into the ranks.
    {"PMI_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "4"},
    {"OMPI_COMM_WORLD_SIZE": "4", "SLURM_NPROCS": "4"},
    # mpiexec -n 4 in an allocation of another size: the MPI library's count is trusted.
    {"OMPI_COMM_WORLD_SIZE": "4", "SLURM_NTASKS": "8"},
    {"PMI_SIZE": "4", "SLURM_NTASKS": "1"},
    {"PMI_SIZE": "", "SLURM_NTASKS": "x"},  # blank or garbled values are not counts
])
def test_consistent_launches_pass(environ):
    check_launch(FourRanks(), environ)


@pytest.mark.parametrize("environ, message", [
    ({"PMI_SIZE": "3"}, "PMI_SIZE=3 but MPI_COMM_WORLD has 4 ranks"),
    ({"SLURM_NPROCS": "2"}, "SLURM_NPROCS=2: the Slurm job has 2 tasks but MPI_COMM_WORLD has 4 ranks"),
])
def test_inconsistent_launches_fail(environ, message):
    with pytest.raises(CollectiveError, match=message):
        check_launch(FourRanks(), environ)


def test_single_process_without_launcher_passes():
    check_launch(SerialComm(), {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"})


@pytest.mark.parametrize("variable", LAUNCHER_SIZE_VARIABLES + SLURM_TASKS_VARIABLES)
def test_every_launcher_variable_exposes_a_singleton(variable):
    with pytest.raises(CollectiveError, match=f"^{variable}=2: "):
        check_launch(SerialComm(), {variable: "2"})


# ---- prbmrm.cli.shard runs on one process: the same variables, read without MPI ----

@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_SIZE_VARIABLES + SLURM_TASKS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("variable", LAUNCHER_SIZE_VARIABLES)
def test_shard_refuses_several_copies(tmp_path, no_launcher, capsys, variable):
    source = tmp_path / "in.txt"
    source.write_text("1 1:1\n-1 2:1\n")
    no_launcher.setenv(variable, "2")
    assert shard.main([str(source), "-p", "2", "-o", str(tmp_path / "o")]) == 2
    error = capsys.readouterr().err
    assert f"runs on one process, and {variable}=2 says 2 were started" in error
    assert not (tmp_path / "o").exists()


def test_shard_runs_in_a_batch_script_of_a_larger_job(tmp_path, no_launcher, capsys):
    """A batch script sees the job's SLURM_NTASKS but is one process: sharding there is fine."""
    source = tmp_path / "in.txt"
    source.write_text("1 1:1\n-1 2:1\n")
    no_launcher.setenv("SLURM_NTASKS", "8")
    assert shard.main([str(source), "-p", "2", "-o", str(tmp_path / "o"), "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path / "o")) == ["part-00000.h5", "part-00001.h5"]
