"""Checkpoint and resume, and what happens when a rank dies or rank 0 gets a signal.

A resumed run is compared with the uninterrupted run with the same options:
BMRM is deterministic given its state, so the final w agrees to 1e-12 (in
fact bitwise). Multi-rank runs go through ``mpiexec`` with timeouts.
"""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import REPO, load_svmlight, mpiexec, run_ranks
from prbmrm.checkpoint import load_checkpoint, save_checkpoint
from prbmrm.errors import CollectiveError, InputError, UsageError
from prbmrm.model import load_model
from prbmrm.training import run

# Hinge on the demo data: about 70 iterations, planes pruned on the way.
# BMRM named: its checkpoint (the bundle of R_emp) is what these tests read and forge.
OPTIONS = dict(solver="bmrm", lam=1e-3, rel_epsilon=1e-5)
RUN = ["-m", "prbmrm.cli.train", "--solver", "bmrm", "--lam", "1e-3", "--rel-epsilon", "1e-5", "--quiet"]


def a9a_rows(rows=2000):
    X, y = load_svmlight("a9a.xz")
    return X[:rows], y[:rows]


def train(tmp_path, ranks, name, *options):
    """Run the demo training on `ranks` ranks; return the model written."""
    out = str(tmp_path / f"{name}.h5")
    completed, _ = run_ranks(ranks, [*RUN, "--out", out, *options], timeout=60)
    assert completed.returncode == 0, completed.stderr
    return load_model(out)


def check_same_run(resumed, full):
    """The resumed run's w and history equal the uninterrupted run's."""
    np.testing.assert_allclose(resumed.w, full.w, rtol=0, atol=1e-12)
    for column in ("objective", "lower_bound", "planes"):
        np.testing.assert_allclose(resumed.history[column], full.history[column], rtol=1e-12)


def test_resume_reaches_the_uninterrupted_w(tmp_path):
    full, _, _ = run(**OPTIONS)
    path = str(tmp_path / "state.h5")
    part, _, _ = run(max_iter=30, checkpoint=path, checkpoint_every=12, **OPTIONS)
    assert part.nit == 30 and load_checkpoint(path)[1]["iteration"] == 30
    resumed, _, _ = run(resume=path, **OPTIONS)
    assert resumed.nit == full.nit > 30 and resumed.status == full.status == 1
    check_same_run(resumed, full)


def test_resume_on_3_ranks_reaches_the_uninterrupted_w(tmp_path):
    full, _, _ = run(**OPTIONS)
    path = str(tmp_path / "state.h5")
    part = train(tmp_path, 3, "part", "--max-iter", "30", "--checkpoint", path, "--checkpoint-every", "12")
    assert part.attrs["iterations"] == 30 and load_checkpoint(path)[1]["iteration"] == 30
    resumed = train(tmp_path, 3, "resumed", "--resume", path)
    assert resumed.attrs["iterations"] == full.nit
    check_same_run(resumed, full)


def test_lsbmrm_resume_reaches_the_uninterrupted_w(tmp_path):
    data = a9a_rows()
    options = dict(loss="hinge", lam=1e-3, bias=True, rel_epsilon=1e-5, solver="lsbmrm", theta=0.7)
    full, _, _ = run(data, **options)
    path = str(tmp_path / "state.h5")
    run(data, max_iter=12, checkpoint=path, **options)
    resumed, _, _ = run(data, resume=path, **options)
    assert resumed.nit == full.nit > 12 and resumed.status == full.status
    check_same_run(resumed, full)
    np.testing.assert_allclose(resumed.w_last, full.w_last, rtol=0, atol=1e-12)
    with pytest.raises(UsageError, match="other options: solver_params .*theta"):
        run(data, resume=path, **dict(options, theta=0.9))


def test_resume_with_an_aggregated_bundle(tmp_path):
    data = a9a_rows()
    options = dict(solver="bmrm", loss="hinge", lam=1e-2, bias=True, rel_epsilon=1e-4, bundle_size=4)
    full, _, _ = run(data, **options)
    path = str(tmp_path / "state.h5")
    part, _, _ = run(data, max_iter=25, checkpoint=path, **options)
    assert part.nit == 25 and load_checkpoint(path)[0]["bundle"]["A"].shape[0] <= 4
    resumed, _, _ = run(data, resume=path, **options)
    assert resumed.nit == full.nit > 25 and resumed.status == full.status
    check_same_run(resumed, full)


@pytest.mark.parametrize("change, message", [
    (dict(lam=2e-3), "lam 0.001 -> 0.002"),
    (dict(bias=False), "bias True -> False"),
    (dict(loss="logistic"), "loss 'hinge' -> 'logistic'"),
    (dict(bundle_size=5), "bundle_size 0 -> 5"),
    (dict(idle_age=3), "idle_age 10 -> 3"),
])
def test_resume_refuses_other_options(tmp_path, change, message):
    data = a9a_rows()
    options = dict(loss="hinge", lam=1e-3, bias=True)
    path = str(tmp_path / "state.h5")
    run(data, max_iter=5, checkpoint=path, **options)
    with pytest.raises(UsageError, match=f"other options: .*{message}"):
        run(data, resume=path, **dict(options, **change))


def test_resume_refuses_other_data(tmp_path):
    X, y = a9a_rows()
    path = str(tmp_path / "state.h5")
    run((X, y), lam=1e-3, max_iter=5, checkpoint=path)
    changed = X.copy()
    changed.data[7] += 1.0  # same sizes, one value differs
    for data, what in (((changed, y), "sha256"), ((X[:-1], y[:-1]), "n_examples"),
                       ((X, -y), "sha256")):
        with pytest.raises(UsageError, match=f"other data .*{what}"):
            run(data, lam=1e-3, resume=path)


def test_resume_refusal_stops_every_rank(tmp_path):
    path = str(tmp_path / "state.h5")
    run(max_iter=5, checkpoint=path, **OPTIONS)
    completed, _ = run_ranks(3, [*RUN, "--lam", "1e-2", "--resume", path, "--out", str(tmp_path / "x.h5")],
                             timeout=60)
    assert completed.returncode == 2
    assert completed.stderr.count("other options: lam 0.001 -> 0.01") == 1, completed.stderr
    with pytest.raises(UsageError, match="cannot read checkpoint"):
        run(resume=str(tmp_path / "missing.h5"), **OPTIONS)


# subLBFGS on the demo data: 23 iterations (it stalls, status 4, before the gap test is met).
SUBLBFGS = dict(solver="sublbfgs", lam=1e-2, rel_epsilon=1e-5)


@pytest.fixture(scope="module")
def sublbfgs_full():
    return run(**SUBLBFGS)[0]


@pytest.mark.parametrize("stop", [12, 1])  # 1: before any LBFGS pair is stored
def test_sublbfgs_resume_reaches_the_uninterrupted_w(tmp_path, sublbfgs_full, stop):
    """The LBFGS pairs, the bound's planes and the iterate's subgradient make the resumed path bitwise the same."""
    full = sublbfgs_full
    path = str(tmp_path / "state.h5")
    part, _, _ = run(max_iter=stop, checkpoint=path, checkpoint_every=5, **SUBLBFGS)
    state, meta = load_checkpoint(path)
    assert part.nit == meta["iteration"] == stop and state["lbfgs"]["rho"].shape == (stop - 1,)
    resumed, _, _ = run(resume=path, **SUBLBFGS)
    assert resumed.nit == full.nit > stop and resumed.status == full.status
    check_same_run(resumed, full)
    np.testing.assert_array_equal(resumed.w_last, full.w_last)


def test_sublbfgs_resume_on_3_ranks_reaches_the_uninterrupted_w(tmp_path, sublbfgs_full):
    full = sublbfgs_full
    path = str(tmp_path / "state.h5")
    options = ["--solver", "sublbfgs", "--lam", "1e-2"]
    part = train(tmp_path, 3, "part", *options, "--max-iter", "12", "--checkpoint", path)
    assert part.attrs["iterations"] == 12 and load_checkpoint(path)[1]["iteration"] == 12
    resumed = train(tmp_path, 3, "resumed", *options, "--resume", path)
    assert resumed.attrs["iterations"] == full.nit and resumed.attrs["status"] == full.status
    check_same_run(resumed, full)


def test_owlqn_resume_reaches_the_uninterrupted_optimum(tmp_path):
    """OWL-QN shares subLBFGS's state; its L1 bound is an LP whose warm start is not saved, so
    the resumed run is held to the certified gaps, not to the uninterrupted path (README)."""
    options = dict(loss="logistic", reg="l1", solver="owlqn", lam=1e-3, rel_epsilon=1e-3)
    full, _, _ = run(**options)
    path = str(tmp_path / "state.h5")
    run(max_iter=30, checkpoint=path, **options)
    state = load_checkpoint(path)[0]
    assert state["lbfgs"]["rho"].shape == (15,) and state["a"].shape == full.w.shape
    resumed, _, _ = run(resume=path, **options)
    assert resumed.nit > 30 and resumed.status == full.status == 1
    assert abs(resumed.fun - full.fun) <= max(resumed.gap, full.gap)
    assert len(resumed.history["objective"]) == resumed.nit
    np.testing.assert_array_equal(resumed.history["objective"][:30], full.history["objective"][:30])


def test_lbfgs_resume_replays_scipy_and_reaches_the_uninterrupted_w(tmp_path):
    """scipy's L-BFGS-B is run again over the saved evaluations, then continues on the same path."""
    options = dict(OPTIONS, loss="logistic", solver="lbfgs", solver_params={"bound_every": 3})
    full, _, _ = run(**options)
    path = str(tmp_path / "state.h5")
    run(max_iter=13, checkpoint=path, **options)  # 13: not a row that solves the QP
    state, meta = load_checkpoint(path)
    assert meta["iteration"] == 13 and state["stale"]  # the bound as the uninterrupted run has it
    assert state["evaluations"]["gradient"].shape == (len(state["evaluations"]["digest"]), len(full.w))
    resumed, _, _ = run(resume=path, **options)
    assert resumed.nit == full.nit > 13 and resumed.status == full.status == 1
    check_same_run(resumed, full)
    # A run that would ask scipy for other points is refused, not continued on another path.
    state["evaluations"]["digest"][3] += 1
    save_checkpoint(path, state, meta)
    with pytest.raises(CollectiveError, match="L-BFGS-B asks for other points than in the checkpointed run"):
        run(resume=path, **options)


def test_proximal_resume_reaches_the_uninterrupted_w(tmp_path):
    options = dict(solver="proximal", bundle_size=5, lam=1e-3, rel_epsilon=1e-3)
    full, _, _ = run(**options)
    path = str(tmp_path / "state.h5")
    run(max_iter=40, checkpoint=path, **options)
    assert load_checkpoint(path)[0]["planes"]["A"].shape[0] <= 5
    resumed, _, _ = run(resume=path, **options)
    assert resumed.nit == full.nit > 40 and resumed.status == full.status
    check_same_run(resumed, full)
    np.testing.assert_array_equal(resumed.w_last, full.w_last)


def check_bitwise_run(resumed, full):
    """The resumed run's w and its history (but the seconds) are bitwise the uninterrupted run's."""
    assert resumed.nit == full.nit and resumed.status == full.status
    np.testing.assert_array_equal(resumed.w, full.w)
    for column in ("iteration", "objective", "best_objective", "lower_bound", "gap", "planes"):
        np.testing.assert_array_equal(resumed.history[column], full.history[column])


# dcd on 2,000 rows of a9a: 71 certificates (iterations), 2,170 passes.
DCD = dict(solver="dcd", loss="hinge", lam=1e-3, rel_epsilon=1e-6)


@pytest.mark.parametrize("stop", [1, 6])
def test_dcd_resume_is_bitwise_the_uninterrupted_run(tmp_path, stop):
    """The dual point, the active set in its order, the shrinking bounds and the generator of the orders
    make the resumed passes the uninterrupted run's."""
    data = a9a_rows()
    full, _, _ = run(data, **DCD)
    path = str(tmp_path / "state.h5")
    part, _, _ = run(data, max_iter=stop, checkpoint=path, **DCD)
    state, meta = load_checkpoint(path)
    assert part.nit == meta["iteration"] == stop < full.nit
    alpha, upper = state["dcd"]["alpha"], 1.0 / (DCD["lam"] * len(data[1]))
    assert alpha.shape == data[1].shape and 0.0 <= alpha.min() and alpha.max() <= upper
    resumed, _, _ = run(data, resume=path, **DCD)
    check_bitwise_run(resumed, full)
    assert resumed.message == full.message  # the passes counted alike
    np.testing.assert_array_equal(resumed.dual, full.dual)


@pytest.mark.parametrize("loss, lam", [("logistic", 1e-4), ("squared_hinge", 1e-3)])
def test_tron_resume_is_bitwise_the_uninterrupted_run(tmp_path, loss, lam):
    data = a9a_rows()
    options = dict(solver="tron", loss=loss, lam=lam, rel_epsilon=1e-8)
    full, _, _ = run(data, **options)
    path = str(tmp_path / "state.h5")
    for stop in (1, full.nit // 2):
        run(data, max_iter=stop, checkpoint=path, **options)
        resumed, _, _ = run(data, resume=path, **options)
        check_bitwise_run(resumed, full)


@pytest.mark.parametrize("matrix_dim", [0, -1])  # Hessian products; the default, the Hessian as a matrix
def test_tron_resumes_bitwise_after_a_rejected_step_and_a_new_smoothing(tmp_path, matrix_dim):
    """The hinge's smoothing: TRON resumed after an iteration that rejected its step (the products kept for
    the re-solve, or the matrix formed again, at the curvature of the point before) and after one that shrank
    delta is bitwise the uninterrupted run."""
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.distributed.oracle import DistributedRisk
    from prbmrm.losses import get_loss
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers.tron import minimize_tron

    X, y = a9a_rows()
    loss = get_loss("hinge")
    loss.prepare(np.array([-1.0, 1.0]), "binary")
    risk = DistributedRisk(loss, X, y, len(y), SerialComm())
    l2, w0 = get_regularizer("l2"), np.zeros(X.shape[1])
    options = dict(rel_epsilon=1e-4, matrix_dim=matrix_dim)
    states = []
    full = minimize_tron(risk, w0, 1e-3, l2, checkpoint=lambda t, snapshot: states.append(snapshot()), **options)
    rejected = [s["iteration"] for s in states
                if not s["tron"]["accepted"] and (len(s["tron"]["path_v"]) or matrix_dim)]
    smoothed = [b["iteration"] for a, b in zip(states, states[1:]) if b["tron"]["delta"] < a["tron"]["delta"]]
    assert rejected and smoothed
    path = str(tmp_path / "state.h5")
    for t in (rejected[0], smoothed[0]):
        save_checkpoint(path, states[t - 1], {"iteration": t})
        resumed = minimize_tron(risk, w0, 1e-3, l2, state=load_checkpoint(path)[0], **options)
        check_bitwise_run(resumed, full)


def test_auto_keeps_its_pick_when_it_checkpoints(tmp_path):
    """auto's dcd and TRON write checkpoints: a run with one runs the pick, and resumes it bitwise."""
    data = a9a_rows()
    for options, pick in ((dict(loss="hinge", lam=1e-2, rel_epsilon=1e-6), "dcd"),
                          (dict(loss="logistic", lam=1e-4, rel_epsilon=1e-8), "tron")):
        path = str(tmp_path / f"{pick}.h5")
        full, _, _ = run(data, checkpoint=str(tmp_path / "full.h5"), **options)
        assert f"({pick}: " in full.message
        run(data, max_iter=2, checkpoint=path, **options)
        resumed, _, _ = run(data, resume=path, **options)
        check_bitwise_run(resumed, full)


@pytest.mark.parametrize("lam, pick", [(1e-2, "dcd"), (1e-6, "proximal")])
def test_auto_probes_dcd_before_a_run_that_checkpoints(tmp_path, lam, pick):
    """A run that checkpoints has no hand-over: dual coordinate descent's first certificate, run alone first,
    picks it or the proximal method (a large box at lam 1e-6), as it would hand over without a checkpoint; a
    resumed run probes alike and continues the checkpoint's solver to the same bits."""
    from prbmrm.solvers.auto import large_box

    data = a9a_rows()
    options = dict(loss="hinge", lam=lam, rel_epsilon=1e-6)
    probe, _, _ = run(data, solver="dcd", max_iter=1, **options)
    assert large_box(probe.lower_bound, probe.fun) == (pick == "proximal")
    full, _, _ = run(data, checkpoint=str(tmp_path / "full.h5"), **options)
    assert f"({pick}: " in full.message and "then" not in full.message
    unwatched, _, _ = run(data, **options)
    assert ("then proximal" in unwatched.message) == (pick == "proximal")
    path = str(tmp_path / "state.h5")
    run(data, max_iter=3, checkpoint=path, **options)
    resumed, _, _ = run(data, resume=path, **options)
    check_bitwise_run(resumed, full)


def forged(path, tmp_path, change):
    """A copy of the checkpoint `path` with `change(state, meta)` made to it."""
    state, meta = load_checkpoint(path)
    change(state, meta)
    changed = str(tmp_path / "changed.h5")
    save_checkpoint(changed, state, meta)
    return changed


@pytest.mark.parametrize("change, message", [
    (lambda s, m: s["dcd"]["alpha"].__setitem__(3, 1e3), "dcd/alpha is not a point of the dual box"),
    (lambda s, m: s["dcd"]["alpha"].__setitem__(3, -1e-9), "dcd/alpha is not a point of the dual box"),
    (lambda s, m: s["dcd"]["active"].__setitem__(0, 2000), "dcd/active is not a set of rows of the 2000"),
    (lambda s, m: s["dcd"]["active"].__setitem__(1, s["dcd"]["active"][0]), "dcd/active is not a set of rows"),
    (lambda s, m: s["dcd"].update(generator=s["dcd"]["generator"][:5]), "dcd/generator is not the 6 words"),
    (lambda s, m: s["dcd"].pop("alpha"), "the checkpoint has no dcd/alpha"),
    (lambda s, m: s.update(lower_bound=s["best_objective"] + 1.0), "lower_bound, .*: it is not a lower bound"),
    (lambda s, m: s.update(w=s["w"][:-1]), "w has shape"),
])
def test_damaged_dcd_checkpoints_are_refused(tmp_path, change, message):
    data = a9a_rows()
    path = str(tmp_path / "state.h5")
    run(data, max_iter=3, checkpoint=path, **DCD)
    with pytest.raises((CollectiveError, UsageError), match=message):
        run(data, resume=forged(path, tmp_path, change), **DCD)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["tron"]["point_sums"].__setitem__(0, 5000), "tron/point_sums or tron/product_sums are not bounds"),
    (lambda s: s["tron"].update(product_sums=s["tron"]["product_sums"][:-1]), "are not bounds of this problem"),
    (lambda s: s["tron"].update(delta=0.5), "tron/delta is not a smoothing of the loss"),
    (lambda s: s["tron"].update(path_v=np.zeros((1, 3))), "tron/path_v and tron/path_hv are not products"),
    (lambda s: s.update(preconditioner=s["preconditioner"][:-1]), "preconditioner has shape"),
    (lambda s: s.update(best_objective=s["best_objective"] * 0.5), "best_objective .* is not the objective"),
])
def test_damaged_tron_checkpoints_are_refused(tmp_path, change, message):
    data = a9a_rows()
    options = dict(solver="tron", loss="logistic", lam=1e-4, rel_epsilon=1e-8)
    path = str(tmp_path / "state.h5")
    run(data, max_iter=3, checkpoint=path, **options)
    with pytest.raises((CollectiveError, UsageError), match=message):
        run(data, resume=forged(path, tmp_path, lambda state, meta: change(state)), **options)


def test_a_checkpoint_of_another_solver_is_refused(tmp_path):
    data = a9a_rows()
    path = str(tmp_path / "state.h5")
    run(data, max_iter=3, checkpoint=path, **dict(DCD, solver="proximal"))
    with pytest.raises(UsageError, match="other options: solver 'proximal' -> 'dcd'"):
        run(data, resume=path, **DCD)
    # auto's checkpoint from a version whose pick (here dcd) was another solver: refused, not misread.
    with pytest.raises(CollectiveError, match="the checkpoint has no dcd "):
        run(data, resume=forged(path, tmp_path, lambda state, meta: meta["options"].update(solver="auto")),
            **dict(DCD, solver="auto"))


def test_solvers_without_checkpoints_refuse_and_still_stop():
    with pytest.raises(UsageError, match="solver 'pragam' does not support --checkpoint"):
        run(solver="pragam", checkpoint="never.h5")
    result, _, _ = run(solver="pragam", stop=lambda: True)
    assert result.status == 3 and result.nit == 1


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "state.h5")
    save_checkpoint(path, {"x": np.arange(3.0)}, {"iteration": 1})

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr("prbmrm.io.files.os.fsync", crash)
    with pytest.raises(InputError, match="state.h5: cannot write the checkpoint: disk full"):
        save_checkpoint(path, {"x": np.arange(5.0)}, {"iteration": 2})
    state, meta = load_checkpoint(path)
    assert meta["iteration"] == 1 and len(state["x"]) == 3
    assert os.listdir(tmp_path) == ["state.h5"]  # no temporary file left behind


def test_checkpoint_is_never_partial_while_written(tmp_path):
    """The file is only ever replaced by a complete one: readers see the old or the new state."""
    path = str(tmp_path / "state.h5")
    for i in range(1, 4):
        save_checkpoint(path, {"x": np.full(1000, float(i))}, {"iteration": i})
        state, meta = load_checkpoint(path)
        assert meta["iteration"] == i and np.all(state["x"] == i)
    assert glob.glob(str(tmp_path / ".state.h5.tmp-*")) == []


# ---- failures: a 3-rank job, one of its processes signalled mid-run ----

def start_job(tmp_path, ranks=3, *options):
    """Start a long 3-rank training that checkpoints every iteration; return (Popen, checkpoint path)."""
    path = str(tmp_path / "state.h5")
    command = [mpiexec(), "-n", str(ranks), sys.executable, *RUN, "--lam", "1e-7", "--rel-epsilon", "0",
               "--max-iter", "100000", "--checkpoint", path, "--checkpoint-every", "1",
               "--out", str(tmp_path / "model.h5"), *options]
    env = dict(os.environ, PYTHONPATH=REPO)
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # catches a hang, not a slow start
    while not os.path.exists(path):  # the ranks are in the solver loop
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the job did not start")
        time.sleep(0.05)
    return job, path


def rank_pids(marker):
    """PIDs by MPI rank of the python processes whose command line contains `marker`."""
    pids = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(command[0]).startswith(b"python") and marker.encode() in command:
            for item in environ:
                if item.startswith(b"PMI_RANK="):
                    pids[int(item[9:])] = int(pid)
    return pids


def signal_rank(job, path, rank, signum):
    """Send `signum` to rank `rank` of `job`; return (status, seconds to exit, stderr)."""
    pids = rank_pids(path)
    assert sorted(pids) == [0, 1, 2]
    return end_job(job, lambda: os.kill(pids[rank], signum))


def end_job(job, send, within=120):
    """Call `send()` and wait for `job` to end, failing the test past the deadline `within` (seconds);
    return (status, seconds to exit, stderr)."""
    sent = time.monotonic()
    send()
    try:
        _, stderr = job.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        job.kill()
        _, stderr = job.communicate()
        pytest.fail(f"the job did not end within {within} s; its stderr:\n{stderr}")
    return job.returncode, time.monotonic() - sent, stderr


@pytest.mark.parametrize("rank", [1, 0])
def test_sigkill_of_a_rank_ends_the_job(tmp_path, rank):
    job, path = start_job(tmp_path)
    status, _, _ = signal_rank(job, path, rank, signal.SIGKILL)
    assert status != 0
    assert rank_pids(path) == {}  # no rank left behind


@pytest.mark.parametrize("solver", ["bmrm", "dcd", "tron"])
def test_sigterm_to_rank_0_checkpoints_and_resumes(tmp_path, solver):
    job, path = start_job(tmp_path, 3, "--solver", solver)
    status, _, stderr = signal_rank(job, path, 0, signal.SIGTERM)
    assert status == 143, stderr
    assert "interrupted by signal 15" in stderr
    stopped = load_checkpoint(path)[1]["iteration"]
    assert not (tmp_path / "model.h5").exists()  # an unfinished model never under the final name
    model = load_model(str(tmp_path / "model.interrupted.h5"))
    assert model.attrs["status"] == 5 and model.attrs["iterations"] == stopped
    # Resume for 15 more iterations and compare with an uninterrupted run of as many.
    more = dict(solver=solver, lam=1e-7, rel_epsilon=0.0, max_iter=stopped + 15)
    resumed = train(tmp_path, 3, "resumed", "--solver", solver, "--lam", "1e-7", "--rel-epsilon", "0",
                    "--max-iter", str(stopped + 15), "--resume", path)
    full, _, _ = run(**more)
    assert resumed.attrs["iterations"] == full.nit == stopped + 15
    check_same_run(resumed, full)
    if solver != "bmrm":  # bitwise, but the seconds
        np.testing.assert_array_equal(resumed.w, full.w)
        for column in ("objective", "best_objective", "lower_bound", "gap"):
            np.testing.assert_array_equal(resumed.history[column], full.history[column])


def test_sigint_to_mpiexec_stops_every_rank_cleanly(tmp_path):
    """mpiexec forwards Ctrl-C to every rank: the serving ranks leave it to rank 0."""
    job, path = start_job(tmp_path)
    status, _, stderr = end_job(job, lambda: job.send_signal(signal.SIGINT))
    assert status == 130, stderr
    assert "interrupted by signal 2" in stderr
    model = load_model(str(tmp_path / "model.interrupted.h5"))
    assert model.attrs["iterations"] == load_checkpoint(path)[1]["iteration"]


def test_a_sigusr1_after_the_run_is_ignored_and_sigterm_is_restored():
    # Slurm's "checkpoint and stop" that arrives while a finished run writes its model must not
    # end it with status 138 (the job would be requeued for nothing); SIGTERM keeps its default.
    code = ("import os, signal\n"
            "from prbmrm.checkpoint import SignalFlag\n"
            "from prbmrm.distributed.comm import SerialComm\n"
            "with SignalFlag(SerialComm()) as flag:\n"
            "    pass\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "print('alive', flag.exit_status, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd=REPO)
    assert done.stdout.split() == ["alive", "0", "True"], done.stderr
    assert done.returncode == -signal.SIGTERM
