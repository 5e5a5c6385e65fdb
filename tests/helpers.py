"""What the tests share: the real data sets of ../shared/data, mpiexec runs, serial references."""

import functools
import importlib.util
import lzma
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("PRBMRM_DATA", os.path.join(REPO, "..", "shared", "data"))


def load_script(name):
    """scripts/NAME.py as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_path(name):
    """Path of a file of the shared data sets, read in place."""
    return os.path.join(DATA, name)


@functools.lru_cache(maxsize=None)
def load_svmlight(name, n_features=None):
    """(X as CSR, y) of a shared SVMlight file, parsed once per test session."""
    from sklearn.datasets import load_svmlight_file

    with lzma.open(data_path(name)) as f:
        X, y = load_svmlight_file(f, n_features=n_features)
    return X.tocsr(), y


def printed_by_fresh_python(code):
    """The words `code` prints in a new interpreter that imports this checkout (what a process imports shows
    only in one that imported nothing before); its stderr goes with any failure."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=HANG_SECONDS, env=dict(os.environ, PYTHONPATH=REPO))
    return done.stdout.split(), done.stderr


def mpiexec():
    """The mpiexec that comes with the installed mpich wheel (or the one on PATH)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return candidate if os.path.exists(candidate) else shutil.which("mpiexec")


HANG_SECONDS = 600
"""The least time a child process gets before it counts as hung: a timeout catches hangs only, and on a
loaded machine (load 20 on 2 cores) a 3-rank run that takes 10 s idle took more than 60 s."""


def run_ranks(ranks, args, timeout=60, cwd=None, env=None, prefix=()):
    """Run ``python ARGS`` on `ranks` ranks (plainly for 1) and return (CompletedProcess, seconds).

    `prefix` goes before the command (e.g. ``taskset -c 0``: the launcher and every rank on one core).

    A deadlock fails the calling test through the timeout (`timeout`, at least
    :data:`HANG_SECONDS`) instead of hanging.
    The launch counts of an enclosing launcher (the suite may run inside a
    Slurm job) are removed from the environment, which `env` then extends.
    """
    from prbmrm.distributed.comm import LAUNCHER_SIZE_VARIABLES, SLURM_TASKS_VARIABLES

    command = [sys.executable, *args]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks), *command]
    command = [*prefix, *command]
    outer = LAUNCHER_SIZE_VARIABLES + SLURM_TASKS_VARIABLES
    env = {**{k: v for k, v in os.environ.items() if k not in outer},
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout, HANG_SECONDS),
                               cwd=cwd or REPO, env=env, stdin=subprocess.DEVNULL)
    return completed, time.monotonic() - started


def shared_shards(comm, tmp_path, X, y, parts, **options):
    """Rank 0 writes the shards of (X, y); every rank gets the directory."""
    from prbmrm.io import write_shards

    directory = str(tmp_path / "shards")
    if comm.is_root:
        write_shards(X, y, directory, parts, **options)
    comm.barrier()
    return directory


def check_against_serial(make_loss, local, comm, X, y, atol_relative=False):
    """Assert the distributed risk and subgradient at 4 random points equal the serial ones.

    `make_loss` builds a fresh loss; `local` is this rank's share of (X, y).
    Risks agree to 1e-12 relative; subgradients to 1e-12 relative and an
    absolute 1e-15 (times max |a| with `atol_relative`).
    """
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed

    oracle = DistributedRisk(make_loss(), local.X, local.y, local.n_examples_total, comm, local.blocks)
    points = np.random.default_rng(0).normal(size=(4, X.shape[1])) * 0.1
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points])
    if comm.is_root:
        serial = DistributedRisk(make_loss(), X, y, len(y), SerialComm())
        for w, (r, a) in zip(points, values):
            r_serial, a_serial = serial(w)
            assert r == pytest.approx(r_serial, rel=1e-12)
            atol = 1e-15 * (np.abs(a_serial).max() if atol_relative else 1.0)
            np.testing.assert_allclose(a, a_serial, rtol=1e-12, atol=atol)


def check_run_against_serial(comm, tmp_path, loss, lam, rows=6000, **options):
    """Run ``minimize`` on the first `rows` examples of a9a, sharded over the ranks (with a bias).

    Rank 0 repeats the run serially on the same shards and asserts the same
    number of iterations, the same objectives and lower bounds (1e-9
    relative) and the same w. `options` go to ``minimize``.
    """
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.solvers import minimize

    X, y = load_svmlight("a9a.xz")
    X, y = X[:rows], y[:rows]
    directory = shared_shards(comm, tmp_path, X, y, parts=comm.size + 1)
    local = load_local(directory, comm, bias=True)
    oracle = DistributedRisk(get_loss(loss), local.X, local.y, local.n_examples_total, comm,
                             local.blocks)
    result = run_distributed(oracle, lambda risk: minimize(risk, np.zeros(oracle.dim), lam, **options))
    if comm.is_root:
        serial_data = load_local(directory, SerialComm(), bias=True)
        serial = DistributedRisk(get_loss(loss), serial_data.X, serial_data.y, len(y), SerialComm(),
                                 serial_data.blocks)
        expected = minimize(serial, np.zeros(serial.dim), lam, **options)
        assert result.nit == expected.nit
        for column in ("objective", "best_objective", "lower_bound"):
            np.testing.assert_allclose(result.history[column], expected.history[column], rtol=1e-9)
        np.testing.assert_allclose(result.w, expected.w, rtol=1e-7, atol=1e-9)


def hinge_objective(X, y, w, lam):
    """J(w) for the hinge loss, written out independently of prbmrm."""
    return 0.5 * lam * w @ w + np.mean(np.maximum(0.0, 1.0 - y * (X @ w)))


def logistic_objective(X, y, w, lam):
    """J(w) for the logistic loss, written out independently of prbmrm."""
    return 0.5 * lam * w @ w + np.mean(np.logaddexp(0.0, -y * (X @ w)))


def least_squares_objective(X, y, w, lam):
    """J(w) for least mean squares, written out independently of prbmrm."""
    return 0.5 * lam * w @ w + 0.5 * np.mean((X @ w - y) ** 2)


OBJECTIVES = {"hinge": hinge_objective, "logistic": logistic_objective,
              "least_squares": least_squares_objective}


def load_multilabel(name):
    from sklearn.datasets import load_svmlight_file

    with lzma.open(data_path(name)) as f:
        X, labels = load_svmlight_file(f, multilabel=True)
    classes = np.unique(np.concatenate([np.asarray(s, dtype=float) for s in labels]))
    Y = np.zeros((len(labels), len(classes)), dtype=np.int8)
    for i, s in enumerate(labels):
        Y[i, np.searchsorted(classes, s)] = 1
    return X.tocsr(), Y, classes


def cvxpy_optimum(X, y, loss, lam):
    import cvxpy as cp

    w = cp.Variable(X.shape[1])
    f = X @ w
    risk = {"hinge": cp.sum(cp.pos(1 - cp.multiply(y, f))),
            "logistic": cp.sum(cp.logistic(-cp.multiply(y, f))),
            "least_squares": 0.5 * cp.sum_squares(f - y)}[loss]
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(w) + risk / len(y)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


def skip_without_network_namespaces():
    """Skip the calling test unless network-namespace hosts can be made here: iproute2 and util-linux, and
    (as root) an ``ip netns add`` that works."""
    if not all(shutil.which(tool) for tool in ("ip", "tc", "unshare")):
        pytest.skip("network-namespace hosts need iproute2 and util-linux (apt-get install iproute2)")
    if os.geteuid() == 0:
        probe = f"prbmrm-probe-{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        if made.returncode != 0:
            pytest.skip(f"no network namespaces here: ip netns add: {made.stderr.strip()}")
