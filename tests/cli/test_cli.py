"""The command lines end to end, plainly and under mpiexec: training, prediction, every bad input."""

import os
import shutil

import h5py
import numpy as np
import pytest

from helpers import data_path, load_svmlight, run_ranks
from prbmrm.io import write_shards
from prbmrm.model import load_model


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """dna as a binary problem (class 3 against the rest) in 4 shards, and the raw 3-class shards."""
    root = tmp_path_factory.mktemp("shards")
    X, y = load_svmlight("dna.scale.xz")
    write_shards(X, np.where(y == 3, 1.0, -1.0), root / "binary", 4)
    write_shards(X, y, root / "multiclass", 4)
    return root


def train(ranks, *args, timeout=60):
    return run_ranks(ranks, ["-m", "prbmrm.cli.train", *args], timeout=timeout)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_demo_run_writes_model_with_history(tmp_path, ranks):
    out = tmp_path / "demo.h5"
    completed, _ = train(ranks, "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    # One line says what the run does, naming the solver and why, before the first iteration.
    assert lines[0].startswith(f"training on 569 examples x 30 features, {ranks} rank(s): loss hinge, l2 lam 0.0001")
    # The demo's rows (all positive) have a large common part: dcd first, probed.
    assert "; solver auto (the default for" in lines[0] and "): dcd first, as " in lines[0]
    assert lines[1].split()[:6] == ["iter", "objective", "best", "lower", "bound", "gap"]
    assert sum(line.startswith("converged") for line in lines) == 1  # rank 0 alone prints
    model = load_model(str(out))
    assert model.w.shape == (30,)
    for key in ("objective", "lower_bound", "gap", "iterations", "lam", "loss", "options", "version"):
        assert key in model.attrs
    assert model.attrs["lower_bound"] <= model.attrs["objective"]
    assert model.attrs["gap"] <= 1e-3 * model.attrs["objective"]
    assert len(model.history["objective"]) == model.attrs["iterations"]
    assert set(model.history) >= {"iteration", "objective", "best_objective", "lower_bound", "gap",
                                  "planes", "seconds_risk", "seconds_subproblem", "seconds_comm"}


def test_ranks_agree_through_the_command_line(tmp_path, shards):
    results = {}
    for ranks in (1, 2, 3):
        out = tmp_path / f"model{ranks}.h5"
        completed, _ = train(ranks, "--data", str(shards / "binary"), "--loss", "logistic", "--lam",
                             "1e-4", "--bias", "--quiet", "--out", str(out))
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout == ""
        results[ranks] = load_model(str(out))
    reference = results[1]
    for ranks in (2, 3):
        assert results[ranks].attrs["iterations"] == reference.attrs["iterations"]
        np.testing.assert_allclose(results[ranks].history["objective"], reference.history["objective"],
                                   rtol=1e-9)
        assert results[ranks].bias == pytest.approx(reference.bias, rel=1e-9)


@pytest.mark.parametrize("ranks", [1, 2])
def test_predict_reports_accuracy_and_writes_scores(tmp_path, shards, ranks):
    model = tmp_path / "model.h5"
    completed, _ = train(1, "--data", str(shards / "binary"), "--lam", "1e-3", "--bias", "--quiet",
                         "--out", str(model))
    assert completed.returncode == 0, completed.stderr
    scores = tmp_path / "scores.txt"
    completed, _ = run_ranks(ranks, ["-m", "prbmrm.cli.predict", "--model", str(model), "--data",
                                     str(shards / "binary"), "--out", str(scores)])
    assert completed.returncode == 0, completed.stderr
    X, y = load_svmlight("dna.scale.xz")
    y = np.where(y == 3, 1.0, -1.0)
    fitted = load_model(str(model))
    expected = X @ fitted.w + fitted.bias
    np.testing.assert_allclose(np.loadtxt(scores), expected, rtol=1e-12, atol=1e-12)
    accuracy = np.mean(np.where(expected >= 0, 1, -1) == y)
    assert f"accuracy {accuracy:.6g}" in completed.stdout


def test_predict_on_svmlight_test_file(tmp_path):
    model = tmp_path / "a9a.h5"
    X, y = load_svmlight("a9a.xz")
    write_shards(X, y, tmp_path / "a9a", 2)
    completed, _ = train(1, "--data", str(tmp_path / "a9a"), "--lam", "1e-4", "--bias", "--quiet",
                         "--out", str(model))
    assert completed.returncode == 0, completed.stderr
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.predict", "--model", str(model), "--data",
                                 data_path("a9a.t.xz")])
    assert completed.returncode == 0, completed.stderr
    accuracy = float(completed.stdout.split("accuracy ")[1].split(",")[0])
    assert 0.84 < accuracy < 0.86  # LIBLINEAR's linear SVM reaches about 85% on a9a.t


# ---- bad input: one clear message naming the problem, non-zero exit on every rank, no model file ----

def expect_failure(completed, seconds, out, *fragments):
    assert completed.returncode != 0  # a hang fails through run_ranks' timeout
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, completed.stderr  # one message, from rank 0, no traceback
    assert "Traceback" not in completed.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert not os.path.exists(out)
    assert not [name for name in os.listdir(os.path.dirname(out)) if ".tmp-" in name]


@pytest.mark.parametrize("ranks", [1, 2])
def test_wrong_label_set_for_the_loss(tmp_path, shards, ranks):
    out = str(tmp_path / "m.h5")
    completed, seconds = train(ranks, "--data", str(shards / "multiclass"), "--loss", "hinge", "--out", out)
    expect_failure(completed, seconds, out, "multiclass", "{-1, +1}", "{1, 2, 3}")


@pytest.mark.parametrize("ranks", [1, 2])
def test_shards_with_different_feature_counts(tmp_path, ranks):
    X, y = load_svmlight("a9a.xz")
    write_shards(X[:100], y[:100], tmp_path / "a", 2)
    write_shards(X[:100, :50], y[:100], tmp_path / "b", 2)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(tmp_path / "a" / "part-00000.h5", mixed / "part-00000.h5")
    shutil.copy(tmp_path / "b" / "part-00001.h5", mixed / "part-00001.h5")
    out = str(tmp_path / "m.h5")
    completed, seconds = train(ranks, "--data", str(mixed), "--out", out)
    expect_failure(completed, seconds, out, "features")


def remove_a_shard(directory):
    os.remove(directory / "part-00002.h5")
    return "part-00002.h5"


def truncate_a_shard(directory):
    victim = directory / "part-00003.h5"
    os.truncate(victim, os.path.getsize(victim) // 2)
    return "part-00003.h5"


def put_nan_in_a_shard(directory):
    with h5py.File(directory / "part-00001.h5", "r+") as f:
        f["X"]["data"][5] = np.nan
    return "part-00001.h5"


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("damage", [remove_a_shard, truncate_a_shard, put_nan_in_a_shard])
def test_damaged_shard_set(tmp_path, shards, ranks, damage):
    directory = tmp_path / "d"
    shutil.copytree(shards / "binary", directory)
    named = damage(directory)
    out = str(tmp_path / "m.h5")
    completed, seconds = train(ranks, "--data", str(directory), "--out", out)
    expect_failure(completed, seconds, out, named)


@pytest.mark.parametrize("ranks", [2, 3])
def test_fewer_shard_files_than_ranks(tmp_path, ranks):
    """Ranks read row ranges of the files: ranks - 1 files train on `ranks` ranks, bitwise as on one."""
    X, y = load_svmlight("a9a.xz")
    write_shards(X[:200], y[:200], tmp_path / "d", ranks - 1)
    models = []
    for n in (ranks, 1):
        out = str(tmp_path / f"m{n}.h5")
        completed, _ = train(n, "--data", str(tmp_path / "d"), "--out", out, "--quiet")
        assert completed.returncode == 0, completed.stderr
        models.append(load_model(out))
    assert np.array_equal(models[0].w, models[1].w)
    assert models[0].attrs["objective"] == models[1].attrs["objective"]


def test_more_ranks_than_rows(tmp_path):
    X, y = load_svmlight("a9a.xz")
    write_shards(X[:2], y[:2], tmp_path / "d", 1)
    out = str(tmp_path / "m.h5")
    completed, _ = train(3, "--data", str(tmp_path / "d"), "--out", out)
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert completed.returncode != 0 and len(errors) == 1 and "2 rows for 3 ranks" in errors[0]
    assert not os.path.exists(out)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("args, fragment", [
    (["--lam", "0"], "--lam"),
    (["--lam", "-1e-3"], "--lam"),
    (["--epsilon", "-1"], "--epsilon"),
    (["--rel-epsilon", "-0.1"], "--rel-epsilon"),
    (["--bundle-size", "1"], "--bundle-size"),
    (["--loss", "hinje"], "unknown loss 'hinje'"),
    (["--lam", "abc"], "--lam"),
])
def test_bad_options(tmp_path, ranks, args, fragment):
    out = str(tmp_path / "m.h5")
    completed, seconds = train(ranks, *args, "--out", out)
    expect_failure(completed, seconds, out, fragment)


@pytest.mark.parametrize("ranks", [1, 2])
def test_output_path_not_writable(tmp_path, ranks):
    out = str(tmp_path / "no-such-directory" / "m.h5")
    completed, seconds = train(ranks, "--out", out)
    assert completed.returncode != 0
    errors = [line for line in completed.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "not writable" in errors[0] and out in errors[0]


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("content, fragment", [
    ("+1 1:0.5 2:abc\n-1 1:1\n", "malformed"),
    ("+1 1:0.5 2:nan\n-1 1:1\n", "non-finite"),
    ("yes 1:0.5\n-1 1:1\n", "label"),
])
def test_bad_svmlight_input_to_predict(tmp_path, ranks, content, fragment):
    model = tmp_path / "demo.h5"
    completed, _ = train(1, "--quiet", "--out", str(model))
    assert completed.returncode == 0, completed.stderr
    bad = tmp_path / "bad.svm"
    bad.write_text(content)
    out = str(tmp_path / "scores.txt")
    completed, seconds = run_ranks(ranks, ["-m", "prbmrm.cli.predict", "--model", str(model), "--data",
                                           str(bad), "--out", out])
    expect_failure(completed, seconds, out, "bad.svm", fragment)


def test_blas_runs_one_thread_unless_a_serial_user_or_slurm_asks_for_more():
    from prbmrm.cli.common import blas_threads

    assert blas_threads(1, {}) == 1
    assert blas_threads(1, {"OMP_NUM_THREADS": "4"}) is None
    assert blas_threads(1, {"OPENBLAS_NUM_THREADS": "2"}) is None
    # Under MPI every core runs a rank already, unless Slurm gave each task several.
    assert blas_threads(3, {"OMP_NUM_THREADS": "4"}) == 1
    assert blas_threads(3, {"SLURM_CPUS_PER_TASK": "2"}) == 2


def test_the_command_line_sets_no_limit_the_environment_already_sets():
    from prbmrm.cli.common import pinned

    assert pinned(1, {"OMP_NUM_THREADS": "1"}) and pinned(1, {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    assert pinned(2, {"OMP_NUM_THREADS": " 2", "MKL_NUM_THREADS": "2"})
    assert not pinned(1, {}) and not pinned(1, {"OPENBLAS_NUM_THREADS": "1"})  # OpenMP's or MKL's pool is not
    assert not pinned(1, {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"})
    assert not pinned(1, {"OMP_NUM_THREADS": "1", "BLIS_NUM_THREADS": "4"}) and not pinned(1, {"OMP_NUM_THREADS": "2"})


THREADS_OF_A_RANK = ("import sys; from threadpoolctl import threadpool_info; from prbmrm.cli import common; from prbmrm.regularizers import qp; "
                     "import numpy; numpy.ones(3) @ numpy.ones(3); "
                     "sys.stdout.write(' '.join(sorted({str(pool['num_threads']) for pool in threadpool_info()})) + '\\n')")


def test_omp_num_threads_one_pins_every_pool_of_a_rank():
    """The premise of :func:`prbmrm.cli.common.pinned`: under mpiexec with OMP_NUM_THREADS=1 every BLAS pool
    (numpy's and scipy's OpenBLAS here) runs one thread without a limit set."""
    import subprocess
    import sys

    from helpers import REPO, mpiexec

    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", THREADS_OF_A_RANK], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1", "1"], done.stdout


# A plain training run's start-up: what it never uses stays unimported (loaded on first use elsewhere).
UNUSED_BY_A_PLAIN_RUN = ("mpi4py", "numba", "llvmlite", "scipy.optimize", "scipy.special", "cryptography",
                         "sklearn", "cvxpy", "matplotlib", "tomllib", "highspy",
                         # deferred by prbmrm.cli.deferred (scipy.sparse would load them)
                         "charset_normalizer", "numpy.f2py.crackfortran", "numpy.testing._private",
                         "numpy.polynomial.polynomial", "numpy.ctypeslib._ctypeslib",
                         "prbmrm.estimators", "prbmrm.party.keys", "prbmrm.party.secure", "prbmrm.cli.plot", "prbmrm.solvers.lbfgs",
                         "prbmrm.solvers.pragam", "prbmrm.solvers.sublbfgs")

PLAIN_RUN = """
import runpy, sys
sys.argv = ["prbmrm.cli.train", "--out", *sys.argv[1:], "--quiet"]
try:
    runpy.run_module("prbmrm.cli.train", run_name="__main__", alter_sys=True)
except SystemExit as done:
    assert not done.code, done.code
print(" ".join(sorted(sys.modules)))
import numpy
numpy.testing.assert_equal(1, 1)  # deferred, not gone: loaded when first used
assert numpy.polynomial.Polynomial([1, 2])(2) == 5
assert numpy.ctypeslib.as_array(numpy.ctypeslib.as_ctypes(numpy.arange(3.0)))[2] == 2.0
import numpy.f2py
assert callable(numpy.f2py.run_main) and "numpy.f2py.crackfortran" in sys.modules
"""


@pytest.mark.parametrize("args, solver", [((), "auto"), (("--solver", "bmrm", "--max-iter", "30"), "bmrm")])
def test_a_plain_training_run_does_not_import_what_it_does_not_use(tmp_path, args, solver):
    # The compiled kernels are extension modules built at install: no run loads numba, llvmlite or ctypes.
    import subprocess
    import sys

    from helpers import REPO
    from prbmrm.distributed.comm import LAUNCHER_VARIABLES

    plain = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}  # no launcher: no MPI
    done = subprocess.run([sys.executable, "-c", PLAIN_RUN, str(tmp_path / "demo.h5"), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600, env=dict(plain, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert {"prbmrm.training", f"prbmrm.solvers.{solver}", "scipy.sparse", "h5py"} <= loaded  # it did train
    assert not loaded & set(UNUSED_BY_A_PLAIN_RUN)
    assert load_model(str(tmp_path / "demo.h5")).attrs["solver"] == solver


