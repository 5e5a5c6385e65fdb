"""Lambda paths: same optima as independent runs with fewer iterations, the model file, predict, --log-json."""

import json

import numpy as np
import pytest

from helpers import hinge_objective, load_svmlight
from prbmrm import training
from prbmrm.cli import predict
from prbmrm.cli import train
from prbmrm.distributed.comm import SerialComm
from prbmrm.model import load_model
from prbmrm.regularizers import get_regularizer
from prbmrm.solvers.path import LamPath, PathProgress, optimal_from

LAMS = list(np.geomspace(1e-1, 1e-3, 4))


@pytest.fixture(scope="module")
def a9a_part():
    X, y = load_svmlight("a9a.xz")
    return X[:2000], y[:2000]


def run_main(module, *argv):
    """Run an entry point in this process as ``python -m`` would; return its exit status."""
    from prbmrm.cli.common import run

    return run(module.main, module.__name__, list(argv))


@pytest.mark.parametrize("solver, loss", [("bmrm", "hinge"), ("lbfgs", "logistic")])
def test_path_reaches_the_optima_of_independent_runs(a9a_part, solver, loss):
    options = dict(loss=loss, solver=solver, bias=True, rel_epsilon=1e-3)
    alone = [training.run(a9a_part, lam=lam, **options)[0] for lam in LAMS]
    path = training.run(a9a_part, lam=LAMS[::-1], **options)[0]  # any order: trained decreasing
    np.testing.assert_array_equal(path.lams, LAMS)
    for one, along in zip(alone, path.results):
        # Both are certified within rel_epsilon of the optimum: their intervals overlap.
        assert along.lower_bound <= one.fun and one.lower_bound <= along.fun
        assert along.fun == pytest.approx(one.fun, rel=1e-3)
        assert along.success
    if solver == "bmrm":
        # Reusing the bundle saves iterations; a warm start alone need not (L-BFGS).
        assert sum(r.nit for r in path.results) < sum(r.nit for r in alone)


def test_path_optimum_against_cvxpy(a9a_part):
    import cvxpy as cp

    X, y = a9a_part
    path = training.run(a9a_part, lam=LAMS, rel_epsilon=1e-4)[0]
    lam = LAMS[-1]
    w = cp.Variable(X.shape[1])
    problem = cp.Problem(cp.Minimize(lam / 2 * cp.sum_squares(w) + cp.sum(cp.pos(1 - cp.multiply(y, X @ w))) / len(y)))
    problem.solve(solver=cp.CLARABEL)
    optimum = hinge_objective(X, y, w.value, lam)
    last = path.last
    assert last.lower_bound <= optimum * (1 + 1e-7) and optimum <= last.fun * (1 + 1e-7)
    assert hinge_objective(X, y, last.w, lam) == pytest.approx(last.fun, rel=1e-12)


@pytest.mark.parametrize("inexact", [0, 1])
def test_reused_bundle_gives_a_valid_and_better_first_bound(a9a_part, inexact):
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk
    from prbmrm.solvers.bmrm import minimize_bmrm

    X, y = a9a_part
    risk = DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm())
    l2 = get_regularizer("l2")
    first = minimize_bmrm(risk, np.zeros(X.shape[1]), LAMS[0], l2, inexact=inexact)
    fresh = minimize_bmrm(risk, first.w, LAMS[1], l2, inexact=inexact)
    reused = minimize_bmrm(risk, first.w, LAMS[1], l2, bundle=first.bundle, alpha=first.alpha, inexact=inexact)
    assert reused.history["lower_bound"][0] > fresh.history["lower_bound"][0]
    assert reused.history["lower_bound"][0] <= fresh.fun
    if not inexact:
        # With exact subproblems the planes carried over save iterations. The default loose
        # subproblems already steady a fresh run started at first.w: here both need 23
        # iterations, so the saving is not a property of that rule (the bound still is).
        assert reused.nit < fresh.nit


@pytest.mark.parametrize("name, params, scale", [("l1", {}, 1.0), ("elastic_net", {"l1_ratio": 0.25}, 4.0),
                                                  ("l2", {}, None)])
def test_largest_lambda_where_zero_is_optimal(name, params, scale):
    a = np.random.default_rng(0).normal(size=7)
    regularizer = get_regularizer(name, **params)
    regularizer.prepare(7)
    found = optimal_from(regularizer, np.zeros(7), a)
    if scale is None:
        assert found is None  # L2: w = 0 is optimal for no lam
    else:
        # 0 in lam dOmega(0) + a: for L1 ||a||_inf <= lam, for r-elastic net ||a||_inf <= r lam.
        assert found == pytest.approx(scale * np.abs(a).max(), rel=1e-11)
        assert found >= scale * np.abs(a).max()


def test_lam_path_starts_where_zero_stops_being_optimal(a9a_part):
    X, y = a9a_part
    gradient_at_zero = -(X.T @ y) / len(y)  # hinge: every margin is 0 < 1 at w = 0
    lam_max = np.abs(gradient_at_zero).max()
    path = training.run(a9a_part, lam=LamPath(3, lam_max / 4), reg="l1")[0]
    np.testing.assert_allclose(path.lams, np.geomspace(lam_max, lam_max / 4, 3), rtol=1e-11)
    assert not np.any(path.results[0].w)  # at lam_max, w = 0
    assert np.count_nonzero(path.last.w) > 0


def path_cli(tmp_path, *extra):
    out, log = tmp_path / "path.h5", tmp_path / "log.jsonl"
    status = run_main(train, "--lam", "1e-1,1e-3,1e-2", "--bias", "--quiet", "--out", str(out),
                      "--log-json", str(log), *extra)
    assert status == 0
    return load_model(str(out)), log


def test_path_model_file_layout(tmp_path):
    model, _ = path_cli(tmp_path)
    path = model.path
    np.testing.assert_array_equal(path["lam"], [1e-1, 1e-2, 1e-3])
    assert path["w"].shape == (3, 30) and path["bias"].shape == (3,)
    np.testing.assert_array_equal(model.w, path["w"][-1])
    assert model.bias == path["bias"][-1] and model.attrs["lam"] == 1e-3
    for key in ("objective", "lower_bound", "gap", "iterations", "status"):
        assert path[key].shape == (3,)
    assert model.attrs["objective"] == path["objective"][-1]
    assert model.attrs["iterations"] == path["iterations"][-1]
    history = model.history
    assert len(history["iteration"]) == path["iterations"].sum()
    for step, lam in enumerate(path["lam"]):
        rows = history["step"] == step
        assert np.all(history["lam"][rows] == lam)
        np.testing.assert_array_equal(history["iteration"][rows], np.arange(1, path["iterations"][step] + 1))
        assert history["best_objective"][rows][-1] == path["objective"][step]
    X, y = training.load_demo()
    for w, b, lam, objective in zip(path["w"], path["bias"], path["lam"], path["objective"]):
        assert hinge_objective(np.c_[X, np.ones(len(y))], y, np.r_[w, b], lam) == pytest.approx(objective, rel=1e-12)


@pytest.mark.parametrize("on_path", [False, True])
def test_log_json_lines_match_history(tmp_path, on_path):
    if on_path:
        model, log = path_cli(tmp_path)
    else:
        out, log = tmp_path / "one.h5", tmp_path / "one.jsonl"
        assert run_main(train, "--quiet", "--out", str(out), "--log-json", str(log)) == 0
        model = load_model(str(out))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == len(model.history["iteration"])
    assert set(rows[0]) == set(model.history)
    for name, values in model.history.items():
        logged = np.array([np.nan if row[name] is None else row[name] for row in rows])
        np.testing.assert_array_equal(logged, values)


def test_predict_on_a_path_model(tmp_path, capsys):
    model, _ = path_cli(tmp_path)
    data = tmp_path / "demo.npz"
    X, y = training.load_demo()
    np.savez(data, X=X, y=y)
    for lam, index in ((None, 2), ("1e-2", 1), ("0.1", 0)):
        scores = tmp_path / f"scores-{lam}.txt"
        argv = ["--model", str(tmp_path / "path.h5"), "--data", str(data), "--out", str(scores), "--quiet"]
        assert run_main(predict, *argv, *(("--lam", lam) if lam else ())) == 0
        expected = X @ model.path["w"][index] + model.path["bias"][index]
        np.testing.assert_allclose(np.loadtxt(scores), expected, rtol=1e-12, atol=1e-12)
    capsys.readouterr()
    assert run_main(predict, "--model", str(tmp_path / "path.h5"), "--data", str(data), "--lam", "0.5") == 2
    assert "the model's lambdas are 0.1, 0.01, 0.001" in capsys.readouterr().err


def test_lam_path_option_and_its_errors(tmp_path, capsys):
    out = tmp_path / "grid.h5"
    assert run_main(train, "--lam-path", "3", "--lam", "1e-3", "--quiet", "--out", str(out)) == 0
    np.testing.assert_allclose(load_model(str(out)).path["lam"], [1.0, 10 ** -1.5, 1e-3], rtol=1e-12)
    for argv, message in ((["--lam-path", "1"], "--lam-path must be >= 2"),
                          (["--lam-max", "1"], "--lam-max goes with --lam-path"),
                          (["--lam-path", "3", "--lam", "1e-2,1e-3"], "takes one --lam"),
                          (["--lam-path", "3", "--lam", "2"], "not below the default --lam-max 1"),
                          (["--lam", "1e-2,1e-2"], "must differ"),
                          (["--lam", "1e-2,x"], "comma-separated list of numbers"),
                          (["--log-json", str(tmp_path / "no" / "log")], "cannot write the --log-json file")):
        capsys.readouterr()
        assert run_main(train, *argv, "--out", str(out)) == 2
        assert message in capsys.readouterr().err


def test_progress_shows_each_lambda_and_the_path(tmp_path, capsys):
    assert run_main(train, "--lam", "1e-1,1e-2", "--out", str(tmp_path / "m.h5")) == 0
    text = capsys.readouterr().out
    assert "path step 1: lambda 0.1" in text and "path step 2: lambda 0.01" in text
    assert "path of 2 lambdas" in text and text.count(train.ProgressTable.HEADER) == 2


def test_callback_rows_carry_the_lambda(a9a_part):
    rows = []
    path = training.run(a9a_part, lam=LAMS[:2], callback=rows.append)[0]
    assert all(isinstance(row, PathProgress) for row in rows)
    assert [row.lam for row in rows] == [lam for lam, r in zip(LAMS, path.results) for _ in range(r.nit)]


def test_stop_from_the_callback_ends_the_path(a9a_part):
    def stop(row):
        if row.step == 1 and row.iteration == 3:
            raise StopIteration

    path = training.run(a9a_part, lam=LAMS, callback=stop)[0]
    assert len(path.results) == 2 and path.last.nit == 3 and path.last.status == 3
    np.testing.assert_array_equal(path.lams, LAMS[:2])


@pytest.mark.distributed
def test_path_on_ranks_equals_serial(comm):
    lam = LamPath(3, 1e-2)  # from the l1 lam_max, computed on rank 0 while the others serve
    path = training.run(None, lam=lam, reg="l1", bias=True, comm=comm)[0]
    if comm.is_root:
        serial = training.run(None, lam=lam, reg="l1", bias=True, comm=SerialComm())[0]
        np.testing.assert_array_equal(path.lams, serial.lams)
        for one, other in zip(path.results, serial.results):
            assert one.nit == other.nit
            np.testing.assert_allclose(one.history["objective"], other.history["objective"], rtol=1e-9)


class Terminal:
    """A stream that says it is a terminal and records what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_progress_on_a_terminal_shows_skipped_rows_in_place(monkeypatch):
    from prbmrm.solvers import Progress

    terminal = Terminal()
    table = train.ProgressTable(every=5, stream=terminal)
    monkeypatch.setattr(table, "LIVE_SECONDS", 0.0)
    for t in range(1, 8):
        table(Progress(t, 1.0 / t, 1.0 / t, 0.0, 1.0 / t, t, 0.0, 0.0, 0.0, 0.0))
    table.finish()
    lines = terminal.text.split("\n")
    assert lines[0] == table.HEADER and lines[1] == table.format_row(Progress(1, 1.0, 1.0, 0.0, 1.0, 1, 0, 0, 0, 0))
    # Rows 2-4, 6 and 7 show in place, each overwritten by the next; 5 and, at the end, 7 stay.
    assert lines[2].count("\r") == 4 and lines[2].split("\r")[-1].split()[0] == "5"
    assert lines[3].count("\r") == 3 and lines[3].split("\r")[-1].split()[0] == "7"
    assert lines[4] == ""
    plain = train.ProgressTable(every=5, stream=__import__("io").StringIO())
    for t in range(1, 8):
        plain(Progress(t, 1.0, 1.0, 0.0, 1.0, t, 0.0, 0.0, 0.0, 0.0))
    plain.finish()
    assert "\r" not in plain.stream.getvalue() and len(plain.stream.getvalue().splitlines()) == 4
