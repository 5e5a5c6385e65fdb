"""Model selection speed: GridSearchCV over BMRMClassifier against LinearSVC on scikit-learn's digits.

The grid of the issue: 3 lambdas x 2 losses (multiclass_hinge, softmax) x 3
folds on the digits (1,797 x 64, standardized in a Pipeline), refit
included, against LinearSVC on the same 3 values of C = 1 / (lam * m) (m the
training rows of a fold) and its 2 losses (hinge, squared_hinge). BMRM runs
twice: with the default parameters (each fit starts cold) and with
``warm_start=True`` (each fit starts from the planes of the previous fit on
the same fold, see BMRMClassifier). LinearSVC runs with its defaults, as a
new user would (at the largest C it stops at max_iter=1000 unconverged).
Printed: wall and CPU seconds of each grid, their ratios to LinearSVC's,
and the best parameters with their cross-validated scores. On a busy
machine the CPU seconds are the fairer figure. With ``--per-fit``, one fit
per (loss, lam) on all rows follows, with the seconds of its risk
evaluations and of its subproblems (the share the subproblem takes).

    python scripts/bench_estimators.py [--lams 1e-2 1e-3 1e-4] [--repeats 1] [--per-fit]
"""

import argparse
import os
import time
import warnings

import numpy as np


def grids(lams, m_fold):
    from sklearn.svm import LinearSVC

    from prbmrm.estimators import BMRMClassifier

    bmrm = {"clf__lam": list(lams), "clf__loss": ["multiclass_hinge", "softmax"]}
    svc = {"clf__C": [1.0 / (lam * m_fold) for lam in lams], "clf__loss": ["hinge", "squared_hinge"]}
    return [("LinearSVC", LinearSVC(), svc),
            ("BMRM (cold)", BMRMClassifier(), bmrm),
            ("BMRM (warm_start)", BMRMClassifier(warm_start=True), bmrm)]


def timed_grid(estimator, grid, X, y):
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    search = GridSearchCV(Pipeline([("scale", StandardScaler()), ("clf", estimator)]), grid, cv=3)
    wall, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X, y)
    return time.perf_counter() - wall, time.process_time() - cpu, search


def per_fit(lams, X, y):
    """One BMRMClassifier fit per (loss, lam) on all of X (standardized): where its time goes."""
    from sklearn.preprocessing import StandardScaler

    from prbmrm.estimators import BMRMClassifier

    X = StandardScaler().fit_transform(X)
    print(f"{'loss':<17} {'lam':>7} {'iters':>6} {'wall s':>7} {'cpu s':>7} {'risk s':>7} {'sub s':>7} "
          f"{'sub share':>9}")
    for loss in ("multiclass_hinge", "softmax"):
        for lam in lams:
            wall, cpu = time.perf_counter(), time.process_time()
            fitted = BMRMClassifier(lam=lam, loss=loss).fit(X, y)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            risk, sub = (float(np.sum(fitted.history_[f"seconds_{k}"])) for k in ("risk", "subproblem"))
            print(f"{loss:<17} {lam:7.0e} {fitted.n_iter_:6d} {wall:7.2f} {cpu:7.2f} {risk:7.2f} {sub:7.2f} "
                  f"{sub / (risk + sub):9.1%}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lams", type=float, nargs="+", default=[1e-2, 1e-3, 1e-4])
    parser.add_argument("--repeats", type=int, default=1, help="alternate the runs this many times")
    parser.add_argument("--per-fit", action="store_true",
                        help="then time one fit per (loss, lam) on all rows: risk and subproblem seconds")
    args = parser.parse_args()
    from sklearn.datasets import load_digits
    from threadpoolctl import threadpool_limits

    X, y = load_digits(return_X_y=True)
    m_fold = len(y) * 2 // 3
    times, load = {}, os.getloadavg()[0]
    # One BLAS thread for everyone (the estimators limit themselves to one; LinearSVC uses none).
    with threadpool_limits(1):
        for _ in range(args.repeats):  # alternated, so load on the machine hits all alike
            for name, estimator, grid in grids(args.lams, m_fold):
                wall, cpu, search = timed_grid(estimator, grid, X, y)
                best = times.setdefault(name, [np.inf, np.inf, None])
                times[name] = [min(best[0], wall), min(best[1], cpu), search]
    base = times["LinearSVC"][0]
    print(f"digits {X.shape[0]} x {X.shape[1]}, 3-fold GridSearchCV with refit, lams {args.lams}; "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    base_cpu = times["LinearSVC"][1]
    print(f"{'estimator':<20} {'wall s':>8} {'cpu s':>8} {'wall x SVC':>11} {'cpu x SVC':>10}  "
          "best parameters (score)")
    for name, (wall, cpu, search) in times.items():
        params = {k.split("__")[1]: v for k, v in search.best_params_.items()}
        print(f"{name:<20} {wall:8.2f} {cpu:8.2f} {wall / base:11.2f} {cpu / base_cpu:10.2f}  "
              f"{params} ({search.best_score_:.4f})")
    if args.per_fit:
        with threadpool_limits(1):
            per_fit(args.lams, X, y)


if __name__ == "__main__":
    main()
