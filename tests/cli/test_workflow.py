"""A user's day with files as users have them (issue 17): label mappings carried by the model,
feature-count checks, stopping flags, training from text files, explicit CSV, the Python API."""

import os
import re

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file

import prbmrm
from helpers import REPO, data_path, load_svmlight, run_ranks
from prbmrm.io import write_shards
from prbmrm.model import load_model

ROWS = 3000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """a9a's first rows as users have them: 0/1 labels in SVMlight; and a 5-class CSV with a header."""
    root = tmp_path_factory.mktemp("files")
    X, y = load_svmlight("a9a.xz")
    X, y = X[:ROWS], y[:ROWS]
    zero_one = root / "a9a01.svm"
    dump_svmlight_file(X, (y > 0).astype(int), str(zero_one), zero_based=False)
    Xt, yt = load_svmlight("a9a.t.xz", n_features=123)
    test01 = root / "a9a01.t.svm"
    dump_svmlight_file(Xt[:2000], (yt[:2000] > 0).astype(int), str(test01), zero_based=False)
    # A statsmodels-style CSV: quoted header, the label in the second column, labels 1..5.
    rng = np.random.default_rng(0)
    features = rng.standard_normal((400, 4))
    grade = np.clip(np.round(3 + features @ [1.0, -0.5, 0.3, 0.0]), 1, 5).astype(int)
    csv = root / "grades.csv"
    with open(csv, "w") as f:
        f.write('"id","grade","x1","x2","x3","x4"\n')
        for i, (g, row) in enumerate(zip(grade, features)):
            f.write(f"{i + 1},{g}," + ",".join(f"{v:.6f}" for v in row) + "\n")
    return dict(root=root, zero_one=str(zero_one), test01=str(test01), csv=str(csv), X=X, y=y,
                Xt=Xt[:2000], yt=yt[:2000])


def cli(module, *args, timeout=600):
    completed, _ = run_ranks(1, ["-m", f"prbmrm.cli.{module}", *map(str, args)], timeout=timeout)
    return completed


def accuracy_of(stdout):
    return float(re.search(r"accuracy ([0-9.e-]+)", stdout).group(1))


# ---- trial point 1: the model carries the label mapping; predict applies it ----

def test_predict_applies_the_positive_mapping_of_the_shards(files, tmp_path):
    shards, model = tmp_path / "s", tmp_path / "m.h5"
    assert cli("shard", files["zero_one"], "--parts", 2, "--out", shards, "--positive", 1,
               "--n-features", 123).returncode == 0
    done = cli("train", "--data", shards, "--lam", 1e-3, "--bias", "--quiet", "--out", model)
    assert done.returncode == 0, done.stderr
    attrs = load_model(str(model)).attrs
    assert attrs["positive"] == 1.0 and attrs["n_features"] == 123 and attrs["has_bias"]
    done = cli("predict", "--model", model, "--data", files["test01"])
    assert done.returncode == 0, done.stderr
    # The reference: the model's scores against the labels mapped by hand (1 -> +1, 0 -> -1).
    m = load_model(str(model))
    expected = np.mean(np.where(m.decision_function(files["Xt"]) >= 0, 1, -1) == files["yt"])
    assert accuracy_of(done.stdout) == pytest.approx(expected, abs=1e-6)
    assert expected > 0.8
    assert "positive label 1" in done.stdout


def test_predict_refuses_labels_the_model_never_saw(files, tmp_path):
    X, y = files["X"], files["y"]
    write_shards(X, y, tmp_path / "pm", 1)
    model = tmp_path / "pm.h5"
    assert cli("train", "--data", tmp_path / "pm", "--quiet", "--out", model).returncode == 0
    done = cli("predict", "--model", model, "--data", files["test01"])
    assert done.returncode != 0
    assert "label 0" in done.stderr and "--positive" in done.stderr and files["test01"] in done.stderr
    # With the mapping given at predict time it works.
    done = cli("predict", "--model", model, "--data", files["test01"], "--positive", 1)
    assert done.returncode == 0, done.stderr
    assert accuracy_of(done.stdout) > 0.8


def test_binary_loss_on_a_multiclass_csv_is_an_error_at_train_time(files, tmp_path):
    done = cli("train", "--data", files["csv"], "--label-column", 1, "--quiet", "--out", tmp_path / "m.h5")
    assert done.returncode != 0
    assert "--positive" in done.stderr and "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "m.h5")


# ---- trial point 2: a feature-count mismatch is refused either way ----

def test_predict_refuses_fewer_and_more_features(files, tmp_path):
    rng = np.random.default_rng(1)
    wide = tmp_path / "wide.csv"
    np.savetxt(wide, np.column_stack([rng.integers(1, 6, 50), rng.standard_normal((50, 12))]),
               delimiter=",")
    narrow = tmp_path / "narrow.csv"
    np.savetxt(narrow, np.column_stack([rng.integers(1, 6, 50), rng.standard_normal((50, 3))]),
               delimiter=",")
    model = tmp_path / "m.h5"
    done = cli("train", "--data", files["csv"], "--label-column", 1, "--positive", 3, "--quiet", "--out", model)
    assert done.returncode == 0, done.stderr
    for path, count in ((wide, 12), (narrow, 3)):
        done = cli("predict", "--model", model, "--data", path)
        assert done.returncode != 0, done.stdout
        # grades.csv: 6 columns, the label in column 1: 5 feature columns (the id is one).
        assert str(path) in done.stderr and f"{count} features" in done.stderr and "trained on 5" in done.stderr


# ---- trial point 3: stopping flags; lam too small ----

def test_epsilon_alone_stops_on_the_absolute_gap(tmp_path):
    done = cli("train", "--epsilon", 1e-6, "--out", tmp_path / "m.h5")
    assert done.returncode == 0, done.stderr
    attrs = load_model(str(tmp_path / "m.h5")).attrs
    assert attrs["gap"] <= 1e-6
    assert "gap <= epsilon" in attrs["message"]


def test_help_states_the_stopping_rule():
    text = " ".join(cli("train", "--help").stdout.split())
    assert "whichever" in text and "--epsilon alone" in text


def test_epsilon_alone_in_the_python_api_and_the_config(tmp_path):
    model = prbmrm.fit(epsilon=1e-6)
    assert model.attrs["gap"] <= 1e-6
    config = tmp_path / "c.toml"
    config.write_text("epsilon = 1e-6\n")
    done = cli("train", "--config", config, "--out", tmp_path / "m.h5", "--quiet")
    assert done.returncode == 0, done.stderr
    assert load_model(str(tmp_path / "m.h5")).attrs["gap"] <= 1e-6


@pytest.mark.parametrize("lam", ["1e-320", "1e-300", "1e-200"])
def test_meaninglessly_small_lambda_is_refused(tmp_path, lam):
    done = cli("train", "--lam", lam, "--out", tmp_path / "m.h5")
    assert done.returncode == 2
    assert "--lam" in done.stderr and "too small" in done.stderr and "internal error" not in done.stderr


# ---- trial point 4: train from text files; globs over conversions; ranks read row ranges ----

def test_train_directly_from_a_text_file(files, tmp_path):
    model = tmp_path / "m.h5"
    done = cli("train", "--data", files["zero_one"], "--positive", 1, "--lam", 1e-3, "--quiet", "--out", model)
    assert done.returncode == 0, done.stderr
    shards, reference = tmp_path / "s", tmp_path / "r.h5"
    assert cli("shard", files["zero_one"], "--parts", 4, "--out", shards, "--positive", 1).returncode == 0
    assert cli("train", "--data", shards, "--lam", 1e-3, "--quiet", "--out", reference).returncode == 0
    a, b = load_model(str(model)), load_model(str(reference))
    assert a.attrs["positive"] == 1.0
    assert a.attrs["objective"] == pytest.approx(b.attrs["objective"], rel=1e-3)


def test_glob_over_two_conversions(files, tmp_path):
    X, y = files["X"], files["y"]
    write_shards(X[:2000], y[:2000], tmp_path / "parts" / "a", 2)
    write_shards(X[2000:], y[2000:], tmp_path / "parts" / "b", 3)
    write_shards(X, y, tmp_path / "all", 5)
    model, reference = tmp_path / "m.h5", tmp_path / "r.h5"
    done = cli("train", "--data", tmp_path / "parts" / "*" / "part-*.h5", "--quiet", "--out", model)
    assert done.returncode == 0, done.stderr
    assert cli("train", "--data", tmp_path / "all", "--quiet", "--out", reference).returncode == 0
    assert load_model(str(model)).attrs["n_examples"] == ROWS
    assert load_model(str(model)).attrs["objective"] == pytest.approx(
        load_model(str(reference)).attrs["objective"], rel=1e-3)


def test_glob_over_disagreeing_conversions_names_the_files(files, tmp_path):
    X, y = files["X"], files["y"]
    write_shards(X[:2000], y[:2000], tmp_path / "a", 2)
    write_shards(X[2000:, :100], y[2000:], tmp_path / "b", 2)
    done = cli("train", "--data", tmp_path / "*" / "part-*.h5", "--quiet", "--out", tmp_path / "m.h5")
    assert done.returncode != 0
    assert "features" in done.stderr and os.path.join("a", "part-00000.h5") in done.stderr \
        and os.path.join("b", "part-00000.h5") in done.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_more_ranks_than_shard_files_bitwise(files, tmp_path, ranks):
    write_shards(files["X"], files["y"], tmp_path / "one", 1)
    model, reference = tmp_path / f"m{ranks}.h5", tmp_path / "ref.h5"
    for n, out in ((ranks, model), (1, reference)):
        done, _ = run_ranks(n, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "one"), "--quiet",
                                "--out", str(out)], timeout=180)
        assert done.returncode == 0, done.stderr
    a, b = load_model(str(model)), load_model(str(reference))
    assert np.array_equal(a.w, b.w) and a.attrs["objective"] == b.attrs["objective"]


# ---- trial point 5: CSV explicit ----

def test_csv_header_and_label_column_are_reported(files, tmp_path):
    done = cli("shard", files["csv"], "--parts", 1, "--out", tmp_path / "s", "--label-column", 1)
    assert done.returncode == 0, done.stderr
    assert "header" in done.stdout and '"grade"' in done.stdout and "label column 1" in done.stdout
    done = cli("shard", files["csv"], "--parts", 1, "--out", tmp_path / "t")
    assert "label column 0" in done.stdout and '"id"' in done.stdout


def test_csv_label_column_by_name(files, tmp_path):
    done = cli("shard", files["csv"], "--parts", 1, "--out", tmp_path / "s", "--label-column", "grade")
    assert done.returncode == 0, done.stderr
    assert "label column 1" in done.stdout and "5 classes" in done.stdout


# ---- trial point 6: the Python API ----

def test_python_api_fit_save_load_predict(files, tmp_path):
    model = prbmrm.fit((files["X"], (files["y"] > 0).astype(int)), positive=1, lam=1e-3, bias=True)
    path = tmp_path / "m.h5"
    model.save(path)
    loaded = prbmrm.load(path)
    np.testing.assert_array_equal(loaded.decision_function(files["Xt"]), model.decision_function(files["Xt"]))
    labels = loaded.predict(files["Xt"])
    assert set(np.unique(labels)) <= {0.0, 1.0}  # the training file's own labels, not +-1
    raw = (files["yt"] > 0).astype(int)
    assert loaded.score(files["Xt"], raw) == pytest.approx(np.mean(labels == raw))
    assert loaded.score(files["Xt"], raw) > 0.8


def test_estimators_import_from_the_package():
    from prbmrm import BMRMClassifier, BMRMRegressor  # noqa: F401

    assert BMRMClassifier.__module__ == "prbmrm.estimators"


def test_import_stays_light():
    done = cli("train", "--version")  # noqa: the import itself is the point
    assert done.returncode == 0
    completed, _ = run_ranks(1, ["-c", "import sys, prbmrm; print('sklearn' in sys.modules, 'h5py' in sys.modules)"])
    assert completed.stdout.split() == ["False", "False"]


def test_readme_from_python_example_runs(tmp_path):
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md From Python", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(cwd)
    assert os.path.exists(tmp_path / "model.h5")


def test_a_model_written_without_the_mapping_still_loads_and_predicts(files, tmp_path):
    """Models from before the mapping was recorded: no positive, negative, exact width; predict works as before."""
    from prbmrm.model import save_model

    X, y = files["X"], files["y"]
    reference = prbmrm.fit((X, y), lam=1e-3)
    old = {key: value for key, value in reference.attrs.items() if key not in ("positive", "negative", "n_features")}
    save_model(str(tmp_path / "old.h5"), reference.w, reference.bias, old, reference.history)
    loaded = prbmrm.load(tmp_path / "old.h5")
    assert "positive" not in loaded.attrs
    assert loaded.score(X, y) == reference.score(X, y) > 0.8
    done = cli("predict", "--model", tmp_path / "old.h5", "--data", data_path("a9a.t.xz"))
    assert done.returncode == 0, done.stderr
    assert 0.8 < accuracy_of(done.stdout) < 0.9
