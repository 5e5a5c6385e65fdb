"""``python -m prbmrm.cli.plot``: PNG plots of training runs from model files, and its errors."""

import subprocess
import sys

import h5py
import numpy as np
import pytest

from helpers import run_ranks
from prbmrm.cli import plot
from prbmrm.cli import train
from prbmrm.cli.common import run
from prbmrm.model import load_model, save_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two small runs on the demo data: hinge and logistic, different lam."""
    root = tmp_path_factory.mktemp("models")
    paths = []
    for loss, lam in (("hinge", "1e-2"), ("logistic", "1e-3")):
        path = str(root / f"{loss}.h5")
        assert run(train.main, "prbmrm.cli.train", ["--loss", loss, "--lam", lam, "--quiet", "--out", path]) == 0
        paths.append(path)
    return paths


def assert_png(path):
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert np.ptp(image) > 0  # something is drawn


def test_cli_writes_both_plots(models, tmp_path):
    prefix = str(tmp_path / "runs")
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.plot", *models, "--out", prefix])
    assert completed.returncode == 0, completed.stderr
    for name in ("gap", "objective"):
        assert f"plot written to {prefix}-{name}.png" in completed.stdout
        assert_png(f"{prefix}-{name}.png")


def test_runs_are_labelled_by_solver_loss_and_lam(models, tmp_path):
    # The models were trained without --solver: one lam with l2 runs the default, auto.
    labels = [label for label, _ in plot.read_runs(models)]
    assert labels == ["auto / hinge / lam=0.01", "auto / logistic / lam=0.001"]
    labels = [label for label, _ in plot.read_runs([models[0], models[0]])]
    assert labels == ["auto / hinge / lam=0.01 (hinge.h5)"] * 2
    history = plot.read_runs(models[:1])[0][1]
    np.testing.assert_array_equal(history["gap"], load_model(models[0]).history["gap"])


def test_matplotlib_is_imported_only_to_draw():
    code = "import sys, prbmrm.cli.plot, prbmrm.cli.train; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, stdin=subprocess.DEVNULL)


def model_without(tmp_path, models, what):
    """A copy of a model file lacking its history group, or with an empty history."""
    model = load_model(models[0])
    path = str(tmp_path / f"{what}.h5")
    history = {} if what == "no_history" else {key: values[:0] for key, values in model.history.items()}
    save_model(path, model.w, model.bias, {}, history)
    if what == "no_history":
        with h5py.File(path, "a") as f:
            del f["history"]
    return path


@pytest.mark.parametrize("case, message", [
    ("missing", "missing.h5: no such model file"),
    ("text", "text.h5: cannot read model file"),
    ("hdf5", "hdf5.h5: not a prbmrm model file"),
    ("no_history", "no_history.h5: the model has no training history to plot (/history lacks "
                   "best_objective, gap, iteration, seconds_total)"),
    ("empty_history", "empty_history.h5: the model's training history is empty"),
    ("bad_out", "-gap.png: output path not writable"),
])
def test_errors_name_the_file(models, tmp_path, capsys, case, message):
    path, out = str(tmp_path / f"{case}.h5"), str(tmp_path / "plots")
    if case == "text":
        open(path, "w").write("not a model\n")
    elif case == "hdf5":
        h5py.File(path, "w").close()
    elif case in ("no_history", "empty_history"):
        path = model_without(tmp_path, models, case)
    elif case == "bad_out":
        path, out = models[0], str(tmp_path / "no" / "such" / "dir" / "plots")
    assert run(plot.main, "prbmrm.cli.plot", [models[1], path, "--out", out]) == 2
    error = capsys.readouterr().err
    assert error.startswith("prbmrm.cli.plot: error: ") and message in error
    assert not list(tmp_path.glob("plots-*"))


def test_usage_errors(capsys):
    assert run(plot.main, "prbmrm.cli.plot", ["--out", "x"]) == 2
    assert "the following arguments are required: MODEL.h5" in capsys.readouterr().err
