"""scripts/bench_solvers.py's scoring on a small subsample, against cvxpy's optimum."""

import importlib.util
import os

import numpy as np
import pytest

from conftest import REPO, load_svmlight
from test_bmrm import cvxpy_optimum

pytestmark = pytest.mark.slow  # runs the benchmark's scoring with cvxpy references


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_solvers():
    return load_script("bench_solvers")


def test_bench_solvers_counts_iterations_to_one_percent_of_a_bracketed_optimum(bench_solvers):
    X, y = load_svmlight("a9a.xz")
    X, y = X[:500], y[:500]
    lam = 1e-2
    outcome = bench_solvers.bench(bench_solvers.oracle(X, y, "hinge"), lam, bench_solvers.runs(),
                                  max_iter=2000, max_seconds=20.0, ref_gap=1e-4)
    optimum, lower = outcome["optimum"], outcome["lower_bound"]
    reference = cvxpy_optimum(X.toarray(), y, "hinge", lam)
    assert lower <= reference * (1 + 1e-7) and reference <= optimum * (1 + 1e-7)
    assert outcome["width"] == pytest.approx((optimum - lower) / optimum) and outcome["width"] <= 1e-4
    runs = outcome["runs"]
    assert [run["label"] for run in runs] == [label for label, _, _ in bench_solvers.runs()]
    assert optimum == min(run["fun"] for run in runs)
    assert lower == max(np.max(run["history"]["lower_bound"]) for run in runs)
    for run in runs:
        best = run["history"]["best_objective"]
        assert run["nit"] == len(best) == len(run["cpu_seconds"])
        t = run["iterations"]
        assert t is not None, run["label"]
        # t is the first iteration within 1%; the run stopped soon after (its bound may trail by a few).
        assert best[t - 1] - optimum <= 0.01 * optimum
        assert t == 1 or best[t - 2] - optimum > 0.01 * optimum
        assert run["seconds"] == run["cpu_seconds"][t - 1] <= run["seconds_total"]
        assert bench_solvers.cell(run) == f"{t:,} ({run['seconds']:.2f} s)"
    outcomes = {("a9a", lam): outcome}
    assert bench_solvers.table(outcomes, ["bmrm"], 1e-4).splitlines()[2].startswith("| a9a | 1e-02 | ")


def test_bench_solvers_reports_runs_cut_by_the_caps(bench_solvers):
    X, y = load_svmlight("a9a.xz")
    plan = [("proximal", "proximal", {}), ("bmrm k=2", "bmrm", {"bundle_size": 2})]
    outcome = bench_solvers.bench(bench_solvers.oracle(X[:500], y[:500], "hinge"), 1e-4, plan, max_iter=30)
    capped = outcome["runs"][1]
    best = capped["history"]["best_objective"]
    assert capped["nit"] == 30 and best[-1] - outcome["optimum"] > 0.01 * outcome["optimum"]
    assert capped["iterations"] is None and capped["seconds"] is None
    assert bench_solvers.cell(capped) == f">30 ({capped['seconds_total']:.2f} s)"
