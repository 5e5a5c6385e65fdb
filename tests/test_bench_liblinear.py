"""scripts/bench_liblinear.py's data and LIBLINEAR's whole run: the svmlight text it writes read back by
scikit-learn, the model file of LIBLINEAR's train program against the liblinear-official package's weights."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_liblinear")


@pytest.mark.parametrize("kind", ["planted", "dense"])
def test_write_svmlight_is_read_back_exactly(bench, tmp_path, kind):
    X, y = bench.planted(3_000) if kind == "planted" else bench.dense_standin(500, d=30)
    path = tmp_path / "set.svm"
    bench.write_svmlight(X, y, path)
    Z, labels = load_svmlight_file(str(path), n_features=X.shape[1])
    assert np.array_equal(labels, y)
    assert np.array_equal(Z.toarray(), X.toarray() if sp.issparse(X) else X)
    if kind == "dense":
        assert Z.nnz == X.size and ((X > 0) & (X < 1)).all()


def test_liblinear_whole_run_gives_the_packages_weights(bench, tmp_path):
    from liblinear import liblinearutil

    program = bench.train_program(None)
    if program is None:
        pytest.skip("no LIBLINEAR train program (set LIBLINEAR_TRAIN)")
    X, y = bench.planted(2_000, d=50)
    order = np.argsort(y, kind="stable")  # the first label LIBLINEAR meets is -1: its weights are flipped back
    X, y = X[order], y[order]
    path = str(tmp_path / "set.svm")
    bench.write_svmlight(X, y, path)
    lam = 1e-3
    for solver in ("3", "0"):
        _, w = bench.liblinear_whole(program, path, lam, X.shape[0], solver, 1e-6, X.shape[1])
        model = liblinearutil.train(liblinearutil.problem(y, X), liblinearutil.parameter(
            f"-s {solver} -c {1.0 / (lam * X.shape[0])!r} -e 1e-6 -q"))
        reference = np.array([model.w[i] for i in range(X.shape[1])]) * (1 if model.label[0] == 1 else -1)
        # Tight eps: the two runs (dual CD visits rows in a random order) agree to far better than 1e-3.
        np.testing.assert_allclose(w, reference, rtol=0, atol=1e-3 * np.abs(reference).max())
        assert bench.objective(X, y, w, "hinge", lam) < bench.objective(X, y, 0 * w, "hinge", lam)
