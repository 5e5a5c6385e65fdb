"""The one front door, prbmrm.fit / prbmrm.training.fit: one validation, a Model back, labels as they come,
errors in the caller's own names, the line that says what a run does, Ctrl-C keeps the best iterate."""

import os
import signal
import warnings

import numpy as np
import pytest

import prbmrm
from helpers import hinge_objective, load_svmlight
from prbmrm import training
from prbmrm.errors import UsageError
from prbmrm.model import Model


def test_fit_returns_a_model_and_validates_the_options_once(monkeypatch):
    calls = []
    check = training.check_options
    monkeypatch.setattr(training, "check_options", lambda *a, **k: calls.append(a) or check(*a, **k))
    model = prbmrm.fit(None, lam=1e-3, max_iter=40)
    assert isinstance(model, Model) and len(calls) == 1
    assert model.result is not None and model.result.nit == model.attrs["iterations"]
    # The same objective as the independent formula, at the model's weights.
    X, y = training.load_demo()
    assert hinge_objective(X, y, model.w, 1e-3) == pytest.approx(model.attrs["objective"], rel=1e-12)


@pytest.mark.parametrize("options, keyword", [({"lam": -1.0}, "lam must be a positive number"),
                                              ({"max_iter": 0}, "max_iter must be >= 1"),
                                              ({"idle_age": -1}, "idle_age must be >= 0"),
                                              ({"theta": 0.5, "solver": "bmrm"}, "theta is an option of solver")])
def test_errors_name_the_python_keyword(options, keyword):
    with pytest.raises(UsageError) as caught:
        prbmrm.fit(None, **options)
    assert keyword in str(caught.value) and "--" not in str(caught.value)
    with pytest.raises(UsageError, match="--"):  # the command line's names when it asks for them
        training.fit(None, names="flags", **options)


def test_two_classes_of_any_values_train_as_minus_one_plus_one():
    X, y = training.load_demo()
    signed = prbmrm.fit((X, y), lam=1e-3)
    for low, high in ((0.0, 1.0), (3.0, 7.0)):
        raw = np.where(y > 0, high, low)
        model = prbmrm.fit((X, raw), lam=1e-3)
        assert np.array_equal(model.w, signed.w)  # the same run, bitwise
        assert (model.attrs["positive"], model.attrs["negative"]) == (high, low)
        assert set(np.unique(model.predict(X))) == {low, high}
        assert model.score(X, raw) == signed.score(X, y)


def test_a_label_error_suggests_the_keyword_that_works():
    X, y = load_svmlight("dna.scale.xz")  # three classes
    with pytest.raises(UsageError, match=r"give positive=LABEL for one class against the rest"):
        prbmrm.fit((X, y), loss="hinge")


def test_verbose_names_the_solver_before_the_first_iteration(capsys):
    model = prbmrm.fit(None, lam=1e-3, verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("training on 569 examples x 30 features, 1 rank(s): loss hinge, l2 lam 0.001; ")
    assert "; solver auto (the default for a quadratic regularizer" in lines[0]
    # auto's first solver, named as the run starts, is the one that ran (its message names it).
    first = lines[0].split(" first, as ")[0].rsplit("): ", 1)[1]
    assert first in ("tron", "dcd", "proximal", "bmrm") and first in model.attrs["message"]
    assert lines[1].split()[:2] == ["iter", "objective"] and lines[2].split()[0] == "1"
    assert capsys.readouterr().out == ""
    prbmrm.fit(None, lam=1e-3, solver="bmrm", verbose=False)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("solver", ["bmrm", "lbfgs"])
def test_ctrl_c_in_fit_returns_the_best_iterate_with_a_warning(solver, tmp_path):
    def interrupt(row):
        if row.iteration == 5:
            os.kill(os.getpid(), signal.SIGINT)

    checkpoint = str(tmp_path / "ck.h5") if solver == "bmrm" else None
    # A tight gap makes the run long enough to interrupt; 1e-8, not less: the subproblem's own tolerance
    # (1e-10 on its KKT conditions) lets BMRM stall near 1e-9 of J on the demo data, depending on its path.
    with pytest.warns(RuntimeWarning, match="interrupted .* the best iterate so far"):
        model = prbmrm.fit(None, lam=1e-4, solver=solver, callback=interrupt, rel_epsilon=1e-8,
                           **({"checkpoint": checkpoint} if checkpoint else {}))
    assert 5 <= model.attrs["iterations"] <= 6 and not model.attrs["converged"]
    X, y = training.load_demo()
    # The best iterate: the lowest objective of the history, at the returned w.
    assert hinge_objective(X, y, model.w, 1e-4) == pytest.approx(np.min(model.history["best_objective"]))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    if checkpoint:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed = prbmrm.fit(None, lam=1e-4, solver=solver, rel_epsilon=1e-8, resume=checkpoint)
        assert resumed.attrs["iterations"] > model.attrs["iterations"] and resumed.attrs["converged"]


def test_a_warm_start_from_a_model_carries_its_planes_across_lambdas():
    first = prbmrm.fit(None, lam=1e-2, solver="bmrm", epsilon=1e-8)
    cold = prbmrm.fit(None, lam=1e-3, solver="bmrm", epsilon=1e-8)
    warm = prbmrm.fit(None, lam=1e-3, solver="bmrm", epsilon=1e-8, warm=first)
    assert warm.attrs["iterations"] < cold.attrs["iterations"]
    assert warm.attrs["objective"] - cold.attrs["objective"] <= 1e-8
    assert warm.attrs["objective"] - warm.attrs["gap"] <= cold.attrs["objective"]  # a valid bound


def test_a_run_stopped_at_max_iter_warns_and_says_so_in_the_model():
    from prbmrm.errors import ConvergenceWarning

    with pytest.warns(ConvergenceWarning, match="stopped at max_iter=5 before the gap test held"):
        model = prbmrm.fit(None, lam=1e-6, solver="bmrm", max_iter=5)
    assert model.attrs["iterations"] == 5 and not model.attrs["converged"]
    assert model.attrs["message"].startswith("maximum number of iterations reached")
    # The gap it reports is still a certified bound: the objective at the returned w is within it of the optimum.
    X, y = training.load_demo()
    optimum = prbmrm.fit(None, lam=1e-6, solver="bmrm", epsilon=1e-9, rel_epsilon=0.0).attrs["objective"]
    assert hinge_objective(X, y, model.w, 1e-6) - optimum <= model.attrs["gap"] + 1e-12
