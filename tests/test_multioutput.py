"""Several real targets per example: the "multioutput" label kind, from input files to shards,
training with multivariate_regression on 1 and 2 ranks, and prediction."""

import cvxpy as cp
import h5py
import numpy as np
import pytest

from prbmrm import io as pio
from prbmrm.distributed.comm import SerialComm
from prbmrm.errors import InputError

from helpers import load_svmlight, run_ranks

LAM = 1e-2


@pytest.fixture(scope="module")
def abalone_csv(tmp_path_factory):
    """Abalone as CSV: rings (column 0) and shell weight (column 8) are the two targets.

    Rows 0-599 only, so that cvxpy's reference stays quick; columns are
    scaled to unit maximum so lam = 1e-2 is a moderate regularization.
    """
    X, rings = load_svmlight("abalone.xz")
    A = np.column_stack([rings, X.toarray()])[:600]
    A /= np.abs(A).max(axis=0)
    path = tmp_path_factory.mktemp("abalone") / "abalone.csv"
    np.savetxt(path, A, delimiter=",", header="rings,sex,length,diameter,height,whole,shucked,"
               "viscera,shell", comments="")
    return path, A[:, 1:8], A[:, [0, 8]]


def test_real_2d_targets_round_trip_through_shards(tmp_path):
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(40, 5)), rng.normal(size=(40, 3))
    paths = pio.write_shards(X, Y, tmp_path, 3)
    with h5py.File(paths[0]) as f:
        assert f.attrs["label_kind"] == "multioutput"
        assert f["y"].dtype == np.float64 and f["y"].shape[1] == 3
    local = pio.load_local(str(tmp_path), SerialComm())
    assert local.label_kind == "multioutput"
    np.testing.assert_array_equal(local.classes, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(local.y, Y)


def test_a_0_1_array_is_multilabel_unless_multioutput_is_asked(tmp_path):
    X, Y = np.ones((6, 2)), np.eye(6, 3)
    assert pio.infer_label_kind(Y)[0] == "multilabel"
    pio.write_shards(X, Y, tmp_path / "labels", 2)
    pio.write_shards(X, Y, tmp_path / "targets", 2, multioutput=True)
    assert pio.load_local(str(tmp_path / "labels"), SerialComm()).y.dtype == np.int8
    targets = pio.load_local(str(tmp_path / "targets"), SerialComm())
    assert targets.label_kind == "multioutput" and targets.y.dtype == np.float64


def test_npz_targets_and_nonfinite_target(tmp_path):
    X, Y = np.ones((4, 2)), np.array([[0.5, 1], [2, 3], [4, 5], [6, 7.0]])
    np.savez(tmp_path / "ok.npz", X=X, y=Y)
    assert pio.read_input(tmp_path / "ok.npz")[1].shape == (4, 2)
    Y[2, 1] = np.nan
    np.savez(tmp_path / "bad.npz", X=X, y=Y)
    with pytest.raises(InputError, match=r"bad.npz: row 3 has a non-finite target"):
        pio.read_input(tmp_path / "bad.npz")


def test_csv_label_columns_must_leave_features(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("1,2\n3,4\n")
    with pytest.raises(InputError, match="must be distinct and leave at least one"):
        pio.read_input(path, label_column=[0, 1])


def primal_optimum(X, Y, lam):
    """min lam/2 |W|^2 + 1/(2n) sum_i |W^T x_i - y_i|^2, solved by cvxpy."""
    W = cp.Variable((X.shape[1], Y.shape[1]))
    problem = cp.Problem(cp.Minimize(0.5 * lam * cp.sum_squares(W)
                                     + 0.5 * cp.sum_squares(X @ W - Y) / len(Y)))
    problem.solve(solver=cp.CLARABEL)
    return problem.value


def test_train_and_predict_multioutput_on_1_and_2_ranks(tmp_path, abalone_csv):
    csv, X, Y = abalone_csv
    shards = tmp_path / "shards"
    done, _ = run_ranks(1, ["-m", "prbmrm.cli.shard", str(csv), "--parts", "3", "--out", str(shards),
                            "--label-column", "0,8"])
    assert done.returncode == 0, done.stderr
    assert "multioutput (2 targets)" in done.stdout
    reference = primal_optimum(X, Y, LAM)
    iterations = set()
    for ranks in (1, 2):
        model = tmp_path / f"model{ranks}.h5"
        done, _ = run_ranks(ranks, ["-m", "prbmrm.cli.train", "--data", str(shards), "--loss",
                                    "multivariate_regression", "--lam", str(LAM), "--rel-epsilon", "0",
                                    "--epsilon", str(1e-4 * reference), "--out", str(model), "--quiet"],
                            timeout=120)
        assert done.returncode == 0, done.stderr
        with h5py.File(model) as f:
            assert f["w"].shape == (7, 2)
            assert abs(f.attrs["objective"] - reference) <= 1e-4 * reference
            assert f.attrs["lower_bound"] <= reference * (1 + 1e-9)
            iterations.add(int(f.attrs["iterations"]))
            W = f["w"][()]
    assert len(iterations) == 1
    done, _ = run_ranks(1, ["-m", "prbmrm.cli.predict", "--model", str(tmp_path / "model1.h5"),
                            "--data", str(shards)])
    assert done.returncode == 0, done.stderr
    rmse = float(np.sqrt(np.mean((X @ W - Y) ** 2)))
    assert f"rmse {rmse:.6g}" in done.stdout


def test_scalar_loss_refuses_multioutput_data(tmp_path):
    rng = np.random.default_rng(1)
    pio.write_shards(rng.normal(size=(10, 3)), rng.normal(size=(10, 2)), tmp_path / "s", 1)
    done, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "s"), "--loss",
                            "least_squares", "--out", str(tmp_path / "m.h5")])
    assert done.returncode != 0
    assert "needs one label per example, the data has 2 real targets per example" in done.stderr
    assert not (tmp_path / "m.h5").exists()
