"""Model selection speed: GridSearchCV over BMRMClassifier against LinearSVC (digits; email-like text).

``--email``: the grid of P17's acceptance instead: 4 lambdas x 3 folds of
BMRMClassifier (hinge, refit included; cold, and with ``warm_start=True``) on
email-like hashed text features (:func:`email_like`: synthetic documents
of a Zipf vocabulary with class-specific words, ~4,534 x 2^20 through
scikit-learn's HashingVectorizer, 0/1 labels), against LinearSVC on the same
values of C = 1 / (lam * m), interleaved. No text corpus is available
offline, hence the synthetic documents.

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
evaluations and of its subproblems (the share the subproblem takes); with
``--email``, the fits of the grid in GridSearchCV's order (each lam on each
fold, then the refit at the best lam), cold and with ``warm_start=True``: the
solver, iterations (and dual coordinate descent's passes), CPU seconds, and
the wall seconds of the risk evaluations (dcd: passes and certificates) and of
the subproblems.

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


def email_like(n=6046, seed=0, vocab=30000, n_features=2**20):
    """Return ``(X, y)``: `n` synthetic emails hashed to `n_features` (CSR, l2-normalized rows), 0/1 labels.

    Each document draws about 150 words (log-normal length) from a Zipf
    vocabulary, half of them from its class's distribution (1,500 words
    boosted 5-30x); 30% are class 1. LinearSVC reaches about 0.99 accuracy.
    """
    from sklearn.feature_extraction.text import HashingVectorizer

    rng = np.random.default_rng(seed)
    common = 1.0 / np.arange(1, vocab + 1) ** 1.1
    common /= common.sum()
    own = []
    for _ in range(2):
        boost = np.ones(vocab)
        boost[rng.choice(np.arange(100, vocab), 1500, replace=False)] = rng.uniform(5, 30, 1500)
        own.append(common * boost / (common * boost).sum())
    y = (rng.random(n) < 0.3).astype(np.int64)
    documents = []
    for label in y:
        length = int(rng.lognormal(4.8, 0.6)) + 5
        words = np.where(rng.random(length) < 0.5, rng.choice(vocab, length, p=own[label]),
                         rng.choice(vocab, length, p=common))
        documents.append(" ".join(f"w{w}" for w in words))
    return HashingVectorizer(n_features=n_features).transform(documents).tocsr(), y


def email_grids(lams, m_fold):
    from sklearn.svm import LinearSVC

    from prbmrm.estimators import BMRMClassifier

    return [("LinearSVC", LinearSVC(), {"C": [1.0 / (lam * m_fold) for lam in lams]}),
            ("BMRM (cold)", BMRMClassifier(), {"lam": list(lams)}),
            ("BMRM (warm_start)", BMRMClassifier(warm_start=True), {"lam": list(lams)})]


def timed_search(estimator, grid, X, y):
    """Wall and CPU seconds of a 3-fold GridSearchCV (refit included) and the search."""
    from sklearn.model_selection import GridSearchCV

    search = GridSearchCV(estimator, grid, cv=3)
    wall, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X, y)
    return time.perf_counter() - wall, time.process_time() - cpu, search


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


def email_per_fit(lams, X, y, best):
    """Each fit of the email grid in GridSearchCV's order, then the refit at `best`: where its time goes."""
    from sklearn.model_selection import StratifiedKFold

    from prbmrm.estimators import BMRMClassifier

    folds = list(StratifiedKFold(3).split(X, y)) + [(np.arange(len(y)), None)]
    print(f"{'start':<5} {'lam':>7} {'fold':>5} {'solver':<9} {'iters':>6} {'passes':>6} {'cpu s':>7} "
          f"{'risk s':>7} {'sub s':>7} {'gap':>9}")
    for warm in (False, True):
        total = 0.0
        for lam, fold in [(lam, f) for lam in lams for f in range(3)] + [(best, 3)]:
            rows = folds[fold][0]
            cpu = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = BMRMClassifier(lam=lam, warm_start=warm).fit(X[rows], y[rows])
            cpu = time.process_time() - cpu
            total += cpu
            message = fitted.message_
            solver = message.rsplit("(", 1)[-1].split(":")[0] if "(" in message else "bmrm"
            passes = message.split(" after ")[1].split()[0] if " passes" in message else "-"
            # The iterations' risk and subproblem seconds are wall clock: on a busy machine above the CPU's.
            risk, sub = (float(np.sum(fitted.history_[f"seconds_{k}"])) for k in ("risk", "subproblem"))
            print(f"{'warm' if warm else 'cold':<5} {lam:7.0e} {'all' if fold == 3 else fold:>5} {solver:<9} "
                  f"{fitted.n_iter_:6d} {passes:>6} {cpu:7.3f} {risk:7.3f} {sub:7.3f} {fitted.gap_:9.3g}")
        print(f"{'warm' if warm else 'cold'}: {total:.2f} CPU s in the fits; load average {os.getloadavg()[0]:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lams", type=float, nargs="+", default=[1e-2, 1e-3, 1e-4])
    parser.add_argument("--repeats", type=int, default=1, help="alternate the runs this many times")
    parser.add_argument("--per-fit", action="store_true",
                        help="then time one fit per (loss, lam) on all rows: risk and subproblem seconds")
    parser.add_argument("--email", action="store_true",
                        help="the email-like hashed text grid (default lams 1e-5 1e-4 1e-3 1e-2) instead of digits")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    if args.email:
        X, y = email_like()
        X, y = X[:4534], y[:4534]  # the training emails
        lams = args.lams if args.lams != parser.get_default("lams") else [1e-5, 1e-4, 1e-3, 1e-2]
        runs, timed, what = email_grids(lams, len(y) * 2 // 3), timed_search, "email-like hashed text"
    else:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        lams = args.lams
        runs, timed, what = grids(lams, len(y) * 2 // 3), timed_grid, "digits"
    times, load = {}, os.getloadavg()[0]
    # One BLAS thread for everyone (the estimators limit themselves to one; LinearSVC uses none).
    with threadpool_limits(1):
        for _ in range(args.repeats):  # alternated, so load on the machine hits all alike
            for name, estimator, grid in runs:
                wall, cpu, search = timed(estimator, grid, X, y)
                best = times.setdefault(name, [np.inf, np.inf, None])
                times[name] = [min(best[0], wall), min(best[1], cpu), search]
    base = times["LinearSVC"][0]
    print(f"{what} {X.shape[0]} x {X.shape[1]}, 3-fold GridSearchCV with refit, lams {lams}; "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    base_cpu = times["LinearSVC"][1]
    print(f"{'estimator':<20} {'wall s':>8} {'cpu s':>8} {'wall x SVC':>11} {'cpu x SVC':>10}  "
          "best parameters (score)")
    for name, (wall, cpu, search) in times.items():
        params = {k.split("__")[-1]: v for k, v in search.best_params_.items()}
        print(f"{name:<20} {wall:8.2f} {cpu:8.2f} {wall / base:11.2f} {cpu / base_cpu:10.2f}  "
              f"{params} ({search.best_score_:.4f})")
    if args.per_fit and args.email:
        best = times["BMRM (cold)"][2].best_params_["lam"]
        email_per_fit(lams, X, y, best)
    elif args.per_fit:
        with threadpool_limits(1):
            per_fit(args.lams, X, y)


if __name__ == "__main__":
    main()
