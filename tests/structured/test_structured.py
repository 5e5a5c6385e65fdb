"""Structured estimation plumbing: the structured loss against independent references, ragged shards,
the risk oracle on 1, 2 and 3 ranks, training, and plug-ins found through entry points.

The structured model here is multiclass classification written as one
(tests/plugin_example, a package prbmrm finds only through its entry points):
its three forms must equal prbmrm's own multiclass_hinge,
scaled_multiclass_hinge and softmax losses on dna.
"""

import contextlib
import importlib.util
import json
import os

import h5py
import numpy as np
import pytest

from helpers import REPO, load_svmlight, run_ranks
from prbmrm.distributed.comm import SerialComm
from prbmrm.io import load_local
from prbmrm.errors import CollectiveError, InputError, UsageError
from prbmrm.losses import get_loss
from prbmrm.distributed.oracle import DistributedRisk, run_distributed
from prbmrm.structured import RaggedExamples, StructuredLoss
from prbmrm.structured.data import split_examples, write_structured_shards
from prbmrm.training import run

PLUGIN_DIR = os.path.join(REPO, "tests", "plugin_example")
_spec = importlib.util.spec_from_file_location("plugin_example_module",
                                               os.path.join(PLUGIN_DIR, "prbmrm_plugin_example.py"))
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)

REFERENCE = {"margin": "multiclass_hinge", "slack": "scaled_multiclass_hinge", "logistic": "softmax"}


def dna(rows=300):
    """The first `rows` examples of dna: dense X, labels 1..3, and the same as ragged examples (class 0..2)."""
    X, y = load_svmlight("dna.scale.xz")
    X, y = X[:rows].toarray(), y[:rows]
    n = len(y)
    return X, y, RaggedExamples(X, np.arange(n + 1), (y - 1).astype(np.int64), np.arange(n + 1))


def structured(form, n_classes=3):
    return StructuredLoss(plugin.MulticlassModel(n_classes=n_classes), form)


def reference(form):
    loss = get_loss(REFERENCE[form])
    loss.prepare(np.array([1.0, 2.0, 3.0]), "integer")
    return loss


def points(d, count=4, scale=0.3, seed=0):
    return np.random.default_rng(seed).normal(size=(count, 3 * d)) * scale


@pytest.mark.parametrize("form", ["margin", "slack", "logistic"])
def test_forms_equal_prbmrm_multiclass_losses(form):
    X, y, examples = dna()
    for w in points(X.shape[1]):
        risk, gradient = structured(form).loss_gradient(w, examples)
        expected_risk, expected_gradient = reference(form).loss_gradient(w, X, y)
        assert risk == pytest.approx(expected_risk, rel=1e-12)
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-10, atol=1e-12)


def test_slack_rescaling_equals_brute_force_over_all_labels():
    X, y, examples = dna(60)
    model = plugin.MulticlassModel(n_classes=3)
    for w in points(X.shape[1], seed=1):
        risk, gradient = structured("slack").loss_gradient(w, examples)
        total, total_gradient = 0.0, np.zeros_like(w)
        for x, label in examples:
            truth = model.joint_feature(x, label)
            # Every labelling, written out: Delta(y, y') (1 + <w, phi(x, y') - phi(x, y)>).
            candidates = []
            for c in range(3):
                phi = np.zeros((X.shape[1], 3))
                phi[:, c] = x[0]
                delta = float(c != label[0])
                candidates.append((delta * (1.0 + w @ (phi.ravel() - truth)), delta * (phi.ravel() - truth)))
            value, g = max(candidates, key=lambda pair: pair[0])
            total += value
            total_gradient += g
        assert risk == pytest.approx(total, rel=1e-12)
        np.testing.assert_allclose(gradient, total_gradient, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["margin", "slack", "logistic"])
def test_subgradient_inequality(form):
    X, _, examples = dna(100)
    loss = structured(form)
    w_all = points(X.shape[1], count=6, scale=1.0, seed=2)
    for w in w_all:
        risk, gradient = loss.loss_gradient(w, examples)
        for v in w_all:
            assert loss.loss_gradient(v, examples)[0] >= risk + gradient @ (v - w) - 1e-9 * (1 + abs(risk))


def ragged_sequences(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, size=n)
    offsets = np.r_[0, np.cumsum(lengths)]
    return RaggedExamples(rng.normal(size=(offsets[-1], d)), offsets, rng.integers(0, 4, size=offsets[-1]), offsets)


def test_structured_shards_round_trip(tmp_path):
    examples = ragged_sequences()
    paths = write_structured_shards(examples, tmp_path / "s", 4, model="chain")
    with h5py.File(paths[0]) as f:
        assert f.attrs["label_kind"] == "structured" and f.attrs["model"] == "chain"
    local = load_local(str(tmp_path / "s"), SerialComm())
    assert local.label_kind == "structured" and local.y is None and local.n_features == 3
    for name in ("x_values", "x_offsets", "y_values", "y_offsets"):
        np.testing.assert_array_equal(getattr(local.X, name), getattr(examples, name))
    assert local.X.y_values.dtype == examples.y_values.dtype
    # One block per shard, whole examples, balanced by size.
    sizes = [int(local.X[a:b].x_offsets[-1]) for a, b in zip(local.blocks[:-1], local.blocks[1:])]
    assert len(sizes) == 4 and sum(sizes) == examples.x_offsets[-1] and max(sizes) < 2 * min(sizes)


def damage(directory, how):
    first = os.path.join(directory, "part-00001.h5")
    if how == "missing":
        os.remove(first)
    elif how == "truncated":
        with open(first, "r+b") as f:
            f.truncate(100)
    else:
        with h5py.File(first, "r+") as f:
            if how == "offsets":
                offsets = f["x_offsets"][()]
                offsets[2], offsets[3] = offsets[3], offsets[2] - 1
                f["x_offsets"][...] = offsets
            elif how == "nan":
                f["x_values"][1, 0] = np.nan
            elif how == "features":
                del f["x_values"]
                f["x_values"] = np.zeros((f["x_offsets"][-1], 2))
                f.attrs["n_features"] = 2


@pytest.mark.parametrize("how, message", [
    ("missing", r"s: missing shard part-00001\.h5"),
    ("truncated", r"part-00001\.h5: not a readable HDF5 file"),
    ("offsets", r"part-00001\.h5: x_offsets must run from 0 without decreasing"),
    ("nan", r"part-00001\.h5: row \d+ has a non-finite feature value"),
    ("features", r"shards disagree on the number of features: .*part-00000\.h5 has 3, .*part-00001\.h5 has 2"),
])
def test_damaged_structured_shards(tmp_path, how, message):
    write_structured_shards(ragged_sequences(), tmp_path / "s", 3)
    damage(str(tmp_path / "s"), how)
    with pytest.raises(CollectiveError, match=message):
        load_local(str(tmp_path / "s"), SerialComm())


def test_write_refuses_bad_offsets_and_splitting_too_fine(tmp_path):
    examples = ragged_sequences(5)
    with pytest.raises(InputError, match="cannot split 5 examples into 6 parts: each needs at least one example"):
        write_structured_shards(examples, tmp_path / "a", 6)
    bad = (examples.x_values, examples.x_offsets[::-1], examples.y_values, examples.y_offsets)
    with pytest.raises(InputError, match="x_offsets must run from 0"):
        write_structured_shards(bad, tmp_path / "b", 2)
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_shard_command_converts_structured_npz(tmp_path, capsys):
    from prbmrm.cli.shard import main

    examples = ragged_sequences()
    np.savez(tmp_path / "seq.npz", **{name: getattr(examples, name)
                                       for name in ("x_values", "x_offsets", "y_values", "y_offsets")})
    assert main([str(tmp_path / "seq.npz"), "--parts", "3", "--out", str(tmp_path / "s")]) == 0
    assert "3 ragged shards" in capsys.readouterr().out
    local = load_local(str(tmp_path / "s"), SerialComm())
    np.testing.assert_array_equal(local.X.y_values, examples.y_values)
    assert main([str(tmp_path / "seq.npz"), "--parts", "3", "--out", str(tmp_path / "t"), "--positive", "1"]) == 2
    assert "--positive does not apply to structured examples" in capsys.readouterr().err
    np.savez(tmp_path / "matrix.npz", X=np.eye(2), y=np.array([1.0, -1.0]))
    assert main([str(tmp_path / "seq.npz"), str(tmp_path / "matrix.npz"), "--parts", "2", "--out",
                 str(tmp_path / "u")]) == 2
    assert "matrix.npz: structured .npz inputs (x_values, ...) cannot be mixed" in capsys.readouterr().err
    np.savez(tmp_path / "partial.npz", x_values=examples.x_values, x_offsets=examples.x_offsets)
    assert main([str(tmp_path / "partial.npz"), "--parts", "2", "--out", str(tmp_path / "v")]) == 2
    assert "partial.npz: structured .npz input without the array 'y_values'" in capsys.readouterr().err


def shared_structured_shards(comm, tmp_path, examples, parts):
    directory = str(tmp_path / "structured")
    if comm.is_root:
        write_structured_shards(examples, directory, parts)
    comm.barrier()
    return directory


@pytest.mark.distributed
@pytest.mark.parametrize("form", ["margin", "logistic"])
def test_risk_on_ranks_equals_serial_bitwise(comm, mpi_tmp_path, form):
    X, _, examples = dna(200)
    directory = shared_structured_shards(comm, mpi_tmp_path, examples, comm.size + 2)
    local = load_local(directory, comm)
    oracle = DistributedRisk(structured(form), local.X, local.y, local.n_examples_total, comm, local.blocks)
    values = run_distributed(oracle, lambda risk: [risk(w) for w in points(X.shape[1])])
    if comm.is_root:
        whole = load_local(directory, SerialComm())
        serial = DistributedRisk(structured(form), whole.X, None, len(whole.X), SerialComm(), whole.blocks)
        for w, (r, a) in zip(points(X.shape[1]), values):
            r_serial, a_serial = serial(w)
            assert r == r_serial
            np.testing.assert_array_equal(a, a_serial)


@pytest.mark.distributed
@pytest.mark.parametrize("solver, form, max_iter", [("bmrm", "margin", 300), ("lsbmrm", "slack", 8),
                                                     ("proximal", "margin", 20), ("lbfgs", "logistic", 100)])
def test_training_on_ranks_equals_serial(comm, mpi_tmp_path, solver, form, max_iter):
    _, _, examples = dna(80)
    directory = shared_structured_shards(comm, mpi_tmp_path, examples, comm.size + 1)
    options = dict(loss="multiclass_structured_test", loss_params={"n_classes": 3, "form": form}, lam=0.05,
                   solver=solver, rel_epsilon=1e-3, max_iter=max_iter)
    with registered_test_model():
        result, _, _ = run(directory, comm=comm, **options)
        if comm.is_root:
            expected, _, _ = run(directory, comm=SerialComm(), **options)
            assert result.nit == expected.nit and (result.success or result.nit == max_iter)
            np.testing.assert_array_equal(result.history["objective"], expected.history["objective"])
            np.testing.assert_array_equal(result.w, expected.w)


@contextlib.contextmanager
def registered_test_model():
    """Register the plug-in's model under a built-in name for the test (no entry points involved)."""
    from prbmrm.losses import LOSSES

    LOSSES["multiclass_structured_test"] = plugin.MulticlassModel
    try:
        yield
    finally:
        del LOSSES["multiclass_structured_test"]


def test_bmrm_reaches_the_optimum_of_multiclass_hinge():
    X, y, examples = dna(300)
    options = dict(lam=0.1, epsilon=0.0, rel_epsilon=1e-6, comm=SerialComm())
    result, local, _ = run(examples, loss=structured("margin"), **options)
    expected, _, _ = run((X, y), loss="multiclass_hinge", **options)
    # One canonical block per 2**14 values (x values, label parts, + 1 per example), 8 to 64.
    assert local.label_kind == "structured" and len(local.blocks) == 1 + canonical_blocks(examples)
    assert abs(result.fun - expected.fun) <= result.gap + expected.gap
    assert result.fun == pytest.approx(expected.fun, rel=1e-5)


@pytest.mark.parametrize("options, message", [
    (dict(solver="sublbfgs"), "solver 'sublbfgs' needs the argsup oracle"),
    (dict(solver="pragam"), "solver 'pragam' solves the hinge loss's dual"),
    (dict(solver="smooth_lbfgs"), "solver 'smooth_lbfgs' smooths the losses"),
    (dict(bias=True), "--bias does not apply to a structured loss"),
    (dict(loss_params={"n_classes": 2}), r"example \d+: label 2 is not a class index in 0\.\.1"),
    (dict(loss_params={"n_classes": 3, "form": "hinge"}),
     "loss 'multiclass_structured_test': structured model 'multiclass_structured' supports the forms margin, "
     "slack, logistic, not 'hinge'"),
    (dict(loss="hinge", loss_params={}), "loss 'hinge' needs rows of features and labels, the data holds structured examples"),
])
def test_refusals(options, message):
    _, _, examples = dna(30)
    options = dict(dict(loss="multiclass_structured_test", loss_params={"n_classes": 3}, max_iter=3), **options)
    with registered_test_model(), pytest.raises((UsageError, CollectiveError), match=message):
        run(examples, comm=SerialComm(), **options)


def test_checkpoint_and_resume_on_structured_shards(tmp_path):
    _, _, examples = dna(60)
    write_structured_shards(examples, tmp_path / "s", 3)
    options = dict(loss="multiclass_structured_test", loss_params={"n_classes": 3}, lam=0.1, comm=SerialComm())
    path = str(tmp_path / "state.h5")
    with registered_test_model():
        full, _, _ = run(str(tmp_path / "s"), **options)
        run(str(tmp_path / "s"), max_iter=10, checkpoint=path, **options)
        resumed, _, _ = run(str(tmp_path / "s"), resume=path, **options)
        np.testing.assert_array_equal(resumed.w, full.w)
        assert resumed.nit == full.nit > 10
        with pytest.raises(UsageError, match="other options: .*n_classes"):
            run(str(tmp_path / "s"), resume=path, **dict(options, loss_params={"n_classes": 4}))
        write_structured_shards(dna(61)[2], tmp_path / "t", 3)
        with pytest.raises(UsageError, match="other data"):
            run(str(tmp_path / "t"), resume=path, **options)


def test_structured_loss_refuses_matrix_data():
    X, y, _ = dna(30)
    with registered_test_model(), pytest.raises(UsageError, match="it needs structured examples"):
        run((X, y), loss="multiclass_structured_test", loss_params={"n_classes": 3}, comm=SerialComm())


def test_in_memory_examples_split_into_rank_independent_blocks():
    examples = ragged_sequences(100)
    local = split_examples(examples, SerialComm())
    assert local.blocks[-1] == 100 and len(local.blocks) == 1 + canonical_blocks(examples)
    np.testing.assert_array_equal(local.X.x_values, examples.x_values)


def canonical_blocks(examples):
    """The number of canonical blocks of in-memory examples: one per 2**14 values, 8 to 64."""
    values = (examples.x_offsets[-1] * examples.shape[1] + examples.y_offsets[-1] + len(examples))
    return min(len(examples), 64, max(8, int(values) // 2**14))


def test_plugins_found_through_entry_points(monkeypatch):
    from prbmrm.regularizers import get_regularizer
    from prbmrm.solvers import get_solver
    from prbmrm.solvers.bmrm import minimize_bmrm

    with pytest.raises(UsageError, match="unknown loss 'multiclass_structured'"):
        get_loss("multiclass_structured")
    monkeypatch.syspath_prepend(PLUGIN_DIR)
    loss = get_loss("multiclass_structured", n_classes="4", form="slack")
    assert isinstance(loss, StructuredLoss) and loss.form == "slack" and loss.model.n_classes == 4
    assert loss.name == "multiclass_structured" and loss.weight_dim(5) == 20
    assert type(get_loss("squared_hinge_example")).__name__ == "SquaredHinge"
    assert get_regularizer("l2_example").name == "l2_example"
    assert get_solver("bmrm_example") is minimize_bmrm
    with pytest.raises(UsageError, match=r"unknown loss 'nope'; known losses: .*multiclass_hinge, "
                                         r"multiclass_structured, .*squared_hinge_example"):
        get_loss("nope")
    with pytest.raises(UsageError, match=r"loss plug-in 'broken_example' \(entry point "
                                         r"'prbmrm_plugin_example_missing:Nothing' of group 'prbmrm\.losses'\) "
                                         r"cannot be loaded: ModuleNotFoundError"):
        get_loss("broken_example")
    with pytest.raises(UsageError, match="loss plug-in 'not_a_loss_example' of group 'prbmrm.losses' is 42"):
        get_loss("not_a_loss_example")
    with pytest.raises(UsageError, match="structured model 'multiclass_structured': parameter n_classes must"):
        get_loss("multiclass_structured", n_classes="1")


def test_help_lists_the_plugins_but_parsing_never_looks_for_them(monkeypatch):
    from importlib import metadata

    from prbmrm.cli.train import build_parser

    monkeypatch.syspath_prepend(PLUGIN_DIR)
    scans = []
    entry_points = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda **group: scans.append(group) or entry_points(**group))
    parser = build_parser()
    assert parser.parse_args(["--loss", "logistic"]).loss == "logistic"
    assert scans == []  # reading every distribution's entry points is for --help alone
    text = " ".join(parser.format_help().split())
    assert "loss: hinge, squared_hinge," in text and "squared_hinge_example" in text
    assert "bmrm_example (default: auto" in text and "l2_example (default l2)" in text


def test_plugin_trains_from_the_command_line_on_two_ranks(tmp_path):
    _, _, examples = dna(90)
    write_structured_shards(examples, tmp_path / "s", 3)
    env = {"PYTHONPATH": os.pathsep.join([PLUGIN_DIR, REPO])}
    model = tmp_path / "m.h5"
    # --solver bmrm: the configuration file below names the plug-in solver bmrm_example, BMRM itself.
    completed, _ = run_ranks(2, ["-m", "prbmrm.cli.train", "--data", str(tmp_path / "s"), "--loss",
                                 "multiclass_structured", "--loss-param", "n_classes=3", "--lam", "0.1",
                                 "--solver", "bmrm", "--out", str(model)], timeout=120, env=env)
    assert completed.returncode == 0, completed.stderr
    assert "training mean Delta" in completed.stdout
    with h5py.File(model) as f:
        attrs = dict(f.attrs)
        w = f["w"][()]
    assert attrs["loss"] == "multiclass_structured" and attrs["label_kind"] == "structured"
    assert json.loads(attrs["loss_params"]) == {"n_classes": "3"}
    # The same run in this process (1 rank, the model registered directly): the same w, bitwise.
    with registered_test_model():
        expected, local, loss = run(str(tmp_path / "s"), loss="multiclass_structured_test",
                                    loss_params={"n_classes": 3}, lam=0.1, solver="bmrm", comm=SerialComm())
    np.testing.assert_array_equal(w, expected.w)
    mean_delta = loss.metrics_examples(local.X, expected.w)["mean_delta"]
    assert attrs["train_mean_delta"] == pytest.approx(mean_delta, rel=1e-12)
    # A configuration file finds plug-in losses, regularizers and solvers too; predict applies the model.
    config = tmp_path / "run.toml"
    config.write_text(f'data = "{tmp_path / "s"}"\nloss = "multiclass_structured"\nloss_param = {{n_classes = 3}}\n'
                      f'reg = "l2_example"\nsolver = "bmrm_example"\nlam = 0.1\nout = "{tmp_path / "c.h5"}"\n')
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.train", "--config", str(config), "--quiet"], env=env)
    assert completed.returncode == 0, completed.stderr
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["w"][()], w)
    completed, _ = run_ranks(1, ["-m", "prbmrm.cli.predict", "--model", str(model), "--data", str(tmp_path / "s"),
                                 "--labels", str(tmp_path / "labels.txt")], env=env)
    assert completed.returncode == 0, completed.stderr
    assert f"90 examples from {tmp_path / 's'}: mean_delta {mean_delta:.6g}" in completed.stdout
    predicted = np.loadtxt(tmp_path / "labels.txt")
    np.testing.assert_array_equal(predicted, [p[0] for p in loss.predict_examples(local.X, expected.w)])
