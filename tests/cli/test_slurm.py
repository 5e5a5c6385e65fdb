"""The shipped slurm/ templates on a real Slurm (cluster/slurm_local.sh), as shipped.

The session fixture starts slurmctld, slurmd and munge in a temporary
directory with 4 virtual CPUs and stops them at the end; another starts a
4-node Slurm whose nodes are network-namespace hosts (one slurmd each, the
ranks talking TCP over the hosts' links). Without root, the Slurm daemons
(PRBMRM_SLURM_INSTALL=1 lets the script install them with apt-get) or
network namespaces, the tests are skipped with the reason. Each template is
submitted with sbatch (on the namespace cluster's login node), with the
pip-installed MPI, and the models are compared with a 1-process run bitwise:
sums over examples are exact in fixed point, so any rank count takes the
same path. The jobs run this checkout (PYTHONPATH), the one under test.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import REPO, load_svmlight, skip_without_network_namespaces
from prbmrm.distributed.comm import LAUNCHER_SIZE_VARIABLES, SLURM_TASKS_VARIABLES
from prbmrm.model import load_model

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("host")]  # daemons and namespaces are host-wide

SCRIPT = os.path.join(REPO, "cluster", "slurm_local.sh")
ROW = re.compile(r"^\s*(\d+)\s+-?\d\.\d+e[+-]\d+ ", re.MULTILINE)


@contextlib.contextmanager
def running_slurm(directory, cpus, nodes=1):
    """Start cluster/slurm_local.sh in `directory` and yield the environment its jobs and clients run in;
    stop it on the way out, whatever happened (a start that failed or timed out, a failing test)."""
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (slurmd starts jobs as their owners)")
    if shutil.which("slurmctld") is None and os.environ.get("PRBMRM_SLURM_INSTALL") != "1":
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm munge, or PRBMRM_SLURM_INSTALL=1)")
    try:
        started = subprocess.run(["bash", SCRIPT, "start", str(directory), str(cpus), str(nodes)],
                                 capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if started.returncode != 0:
            pytest.skip(f"cluster/slurm_local.sh could not start Slurm: {started.stderr.strip()[-500:]}")
        outer = LAUNCHER_SIZE_VARIABLES + SLURM_TASKS_VARIABLES
        env = {k: v for k, v in os.environ.items() if k not in outer and not k.startswith("SLURM_")}
        env.update(SLURM_CONF=str(directory / "slurm.conf"), PRBMRM_HOME=REPO,
                   PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]),
                   PYTHONPATH=os.pathsep.join([REPO, env.get("PYTHONPATH", "")]))
        yield env
    finally:
        subprocess.run(["bash", SCRIPT, "stop", str(directory)], timeout=180, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """The environment of a running single-node Slurm: SLURM_CONF, PRBMRM_HOME, PATH, PYTHONPATH."""
    with running_slurm(tmp_path_factory.mktemp("slurm"), 4) as env:
        yield env


@pytest.fixture(scope="module")
def slurm_nodes(tmp_path_factory):
    """The environment of a running 4-node Slurm, one network-namespace host per node (2 CPUs each)."""
    skip_without_network_namespaces()
    with running_slurm(tmp_path_factory.mktemp("slurm-nodes"), 2, nodes=4) as env:
        yield env


def make_shards(slurm, directory):
    """3000 rows of a9a cut into 4 shards by slurm/shard.sbatch, and the SVMlight file they came from."""
    from sklearn.datasets import dump_svmlight_file

    X, y = load_svmlight("a9a.xz")
    source = directory / "a9a-3000.txt"
    dump_svmlight_file(X[:3000], y[:3000], str(source), zero_based=False)
    sbatch(slurm, directory, "shard.sbatch", source, 4, "shards", "--quiet")
    assert sorted(os.listdir(directory / "shards")) == [f"part-{i:05d}.h5" for i in range(4)]
    return directory / "shards", source


@pytest.fixture(scope="module")
def shards(slurm, tmp_path_factory):
    return make_shards(slurm, tmp_path_factory.mktemp("a9a"))


def client(slurm):
    """How a client command reaches this Slurm: on the namespace cluster's login node, or here."""
    return ["bash", SCRIPT, "run", os.path.dirname(slurm["SLURM_CONF"])]


def command(slurm, *args, timeout=60):
    done = subprocess.run(client(slurm) + list(map(str, args)), env=slurm, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{args[0]}: {done.stderr}"
    return done.stdout


def sbatch(slurm, workdir, template, *args, wait=True, options=(), **env):
    """Submit slurm/TEMPLATE from another directory with -D WORKDIR (and sbatch `options`); return the job id."""
    options = ["--parsable", "-D", workdir, *options] + (["--wait"] if wait else [])
    done = subprocess.run(client(slurm) + ["sbatch", *options, os.path.join(REPO, "slurm", template),
                                           *map(str, args)],
                          env=dict(slurm, **env), cwd="/", capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 or not wait, done.stderr
    return done.stdout.strip().split(";")[0]


def sacct(slurm, name):
    """The job completion records of the jobs named `name` (sacct -c: the local Slurm has no
    accounting database, and its completion log knows no array ids, so jobs are found by name)."""
    lines = command(slurm, "sacct", "-c", "-o", "JobID%-8,JobName%-20,State,ExitCode,NCPUS,Elapsed").splitlines()
    lines = [line for line in lines if f" {name} " in line]
    print("\n".join(lines))  # shown with pytest -s: the record of the runs
    return "\n".join(lines)


def serial_w(shards, workdir, **options):
    """The 1-process run of the templates' command: with a checkpoint, as they write one (auto's pick then
    runs alone, without hand-over: dcd on these rows at lam 1e-2 and 1e-3, the proximal method at 1e-6)."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.training import run

    result, _, _ = run(str(shards), comm=SerialComm(), checkpoint=str(workdir / "serial.ckpt.h5"), **options)
    return result


def assert_same(model, result):
    assert model.attrs["iterations"] == result.nit
    assert np.array_equal(model.w, result.w), "the Slurm run's w differs from the 1-process run's"


def test_train_template_on_4_tasks_equals_one_process(slurm, shards, tmp_path):
    data, _ = shards
    job = sbatch(slurm, tmp_path, "train.sbatch", data, "model.h5", "--lam", "1e-3", "--quiet",
                 options=["--job-name=train-4"])
    assert "COMPLETED" in sacct(slurm, "train-4")
    model = load_model(str(tmp_path / "model.h5"))
    assert model.attrs["ranks"] == 4
    assert_same(model, serial_w(data, tmp_path, lam=1e-3))
    log = (tmp_path / f"train-4-{job}.out").read_text()
    assert "4 ranks, MPICH" in log and "Abort" not in log


def test_train_template_on_4_namespace_nodes_equals_one_process(slurm_nodes, tmp_path):
    """sbatch --nodes=4 slurm/train.sbatch, as shipped: a rank on each host, TCP over their links."""
    data, _ = make_shards(slurm_nodes, tmp_path)
    job = sbatch(slurm_nodes, tmp_path, "train.sbatch", data, "model.h5", "--lam", "1e-3", "--quiet",
                 options=["--nodes=4", "--job-name=train-nodes"])
    assert "COMPLETED" in sacct(slurm_nodes, "train-nodes")
    log = (tmp_path / f"train-nodes-{job}.out").read_text()
    assert f"job {job} (restart 0) on h[1-4]: 4 ranks, MPICH" in log and "Abort" not in log, log
    model = load_model(str(tmp_path / "model.h5"))
    assert model.attrs["ranks"] == 4
    assert_same(model, serial_w(data, tmp_path, lam=1e-3))


def test_lambda_sweep_as_a_job_array(slurm, shards, tmp_path):
    data, source = shards
    # Two ranks per array task: both tasks run at once on the 4 CPUs.
    job = sbatch(slurm, tmp_path, "lambda_sweep.sbatch", data, "sweep", "--quiet", "--lam", "9",
                 options=["--array=0-1", "--ntasks=2"], LAMBDAS="1e-2 1e-3", VALID=str(source))
    records = sacct(slurm, "prbmrm-sweep")
    assert records.count("COMPLETED") == 2, records
    for task, lam in enumerate(("1e-2", "1e-3")):
        model = load_model(str(tmp_path / "sweep" / f"model-lam{lam}.h5"))
        lam = float(lam)
        assert model.attrs["lam"] == lam and model.attrs["ranks"] == 2  # the array's lambda wins over --lam
        assert_same(model, serial_w(data, tmp_path, lam=lam))
        log = (tmp_path / f"prbmrm-sweep-{job}_{task}.out").read_text()
        assert f"3000 examples from {source}: accuracy" in log


def wait_for(predicate, what, timeout=300):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what} ({timeout} s)")
        time.sleep(0.5)


def rows_since(log, restart):
    """Iteration numbers printed by run `restart` (0 the first) of a requeued job's log."""
    text = log.read_text() if log.exists() else ""
    start = text.find(f"(restart {restart})")
    return [] if start < 0 else [int(n) for n in ROW.findall(text[start:])]


def state(slurm, job):
    """The job's state in squeue ('' once it has left the queue)."""
    return command(slurm, "squeue", "-h", "-j", job, "-o", "%T").strip()


def running(slurm, job):
    return state(slurm, job) != ""


def restart_now(slurm, job):
    """Wait for the requeued job to be pending, then let it start at once.

    Slurm holds a requeued job back for 120 s (its begin time); a cluster
    user waits, the test moves the begin time to 5 s from now: slurmd
    refuses to start a job it is still ending ("Job credential revoked").
    """
    wait_for(lambda: state(slurm, job) == "PENDING", "the job to be requeued")
    command(slurm, "scontrol", "update", f"JobId={job}", "StartTime=now+5")


@pytest.mark.timeout(900)
def test_preempted_and_requeued_job_resumes_and_equals_one_process(slurm, shards, tmp_path):
    """scontrol requeue twice (SIGTERM), then SIGUSR1 to the batch script (--signal=B:USR1@...)."""
    data, _ = shards
    # Long enough that each interrupt lands while a run trains: 300 iterations took 0.35 CPU s in one
    # process, so the third run could end between the poll that saw its rows and the signal.
    options = dict(lam=1e-6, epsilon=0.0, rel_epsilon=0.0, max_iter=2000)
    job = sbatch(slurm, tmp_path, "train.sbatch", data, "model.h5", "--lam", "1e-6", "--epsilon", "0",
                 "--rel-epsilon", "0", "--max-iter", "2000", "--print-every", "1", wait=False,
                 options=["--job-name=requeued"])
    log = tmp_path / f"requeued-{job}.out"
    for restart, interrupt in enumerate((["scontrol", "requeue", job], ["scontrol", "requeue", job],
                                         ["scancel", "--batch", "--signal=USR1", job])):
        wait_for(lambda: len(rows_since(log, restart)) >= 5, f"run {restart} to train")
        command(slurm, *interrupt)
        restart_now(slurm, job)
        wait_for(lambda: rows_since(log, restart + 1) or not running(slurm, job), f"run {restart + 1}")
    wait_for(lambda: not running(slurm, job), "the job to end")
    text = log.read_text()
    # The completion log records each requeue as the job's state then, PENDING.
    states = [line.split()[2] for line in sacct(slurm, "requeued").splitlines()]
    assert states == ["PENDING"] * 3 + ["COMPLETED"], states
    # The log was appended to: every run's lines are there, each resumed where the last stopped.
    assert text.count("interrupted by signal 15") == 2 and text.count("interrupted by signal 10") == 1, text
    assert "requeueing job" in text and "Abort" not in text
    firsts = [rows_since(log, restart)[0] for restart in range(4)]
    assert firsts[0] == 1 and all(a < b for a, b in zip(firsts, firsts[1:])), firsts
    model = load_model(str(tmp_path / "model.h5"))
    assert not (tmp_path / "model.interrupted.h5").exists()  # the finished run removed it
    assert_same(model, serial_w(data, tmp_path, **options))


def job_ranks(job):
    """PIDs of the python ranks of Slurm job `job`, by SLURM_PROCID."""
    pids = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                python = os.path.basename(f.read().split(b"\0")[0]).startswith(b"python")
        except OSError:
            continue
        if python and environ.get(b"SLURM_JOB_ID") == job.encode() and b"SLURM_STEP_ID" in environ \
                and environ.get(b"SLURM_STEP_ID") != b"4294967291":  # not the batch script's own
            pids[int(environ[b"SLURM_PROCID"])] = int(pid)
    return pids


def test_kill_9_of_a_rank_ends_the_step(slurm, shards, tmp_path):
    data, _ = shards
    job = sbatch(slurm, tmp_path, "train.sbatch", data, "model.h5", "--lam", "1e-7", "--rel-epsilon", "0",
                 "--max-iter", "100000", "--print-every", "1", wait=False, options=["--job-name=killed"])
    log = tmp_path / f"killed-{job}.out"
    wait_for(lambda: len(rows_since(log, 0)) >= 5 and len(job_ranks(job)) == 4, "the job to train")
    os.kill(job_ranks(job)[1], signal.SIGKILL)
    wait_for(lambda: not job_ranks(job), "the other ranks to end", timeout=10)
    wait_for(lambda: not running(slurm, job), "the job to end", timeout=60)
    assert "FAILED" in sacct(slurm, "killed")
    assert not (tmp_path / "model.h5").exists()


LATE_SIGNAL_JOB = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=late-%j.out
set -euo pipefail
. "$PRBMRM_HOME/cluster/env.sh"
echo "restart ${SLURM_RESTART_COUNT:-0}"
prbmrm_step python -c "
import time
from prbmrm.checkpoint import SignalFlag
from prbmrm.distributed.comm import get_comm
comm = get_comm()
with SignalFlag(comm):
    pass  # the training, over
open(f'trained-{comm.rank}', 'w').close()
time.sleep(10)  # the model being written when Slurm's signal comes
"
"""


def test_a_signal_after_training_neither_kills_the_ranks_nor_requeues_the_job(slurm, tmp_path):
    """SIGUSR1 to the batch script (--signal=B:USR1@...) while the ranks finish after training."""
    script = tmp_path / "late.sbatch"
    script.write_text(LATE_SIGNAL_JOB)
    job = command(slurm, "sbatch", "--parsable", "-D", tmp_path, "--job-name=late-signal", script).strip()
    wait_for(lambda: all((tmp_path / f"trained-{rank}").exists() for rank in range(2)), "the ranks to train")
    command(slurm, "scancel", "--batch", "--signal=USR1", job)
    wait_for(lambda: "COMPLETED" in sacct(slurm, "late-signal") or state(slurm, job) == "PENDING",
             "the job to end")
    records = sacct(slurm, "late-signal")
    log = (tmp_path / f"late-{job}.out").read_text()
    assert records.split()[2:4] == ["COMPLETED", "0:0"], records + log
    assert "SIGUSR1 came, but the step ended with status 0" in log and "requeueing" not in log, log
