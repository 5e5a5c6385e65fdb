"""Time to reach 2% and 0.1% of the optimum: smooth_lbfgs (paper 004) against BMRM on ROC area and PRBEP.

On the full a9a (32,561 x 123, no bias), one process with one BLAS thread,
``lam = 1e-4`` by default. For each loss, the optimum J* is bracketed by
the best certified lower bound and the best objective over all runs,
including a reference smooth_lbfgs run at ``rel_epsilon = 1e-6``. Each
solver then runs to ``rel_epsilon = 1e-3`` (smooth_lbfgs also to 0.02, whose
coarser mu is chosen for 2%), and the table gives, from the per-iteration
history, the seconds until

* ``J <= 2%`` / ``J <= 0.1%``: the best objective is within 2% / 0.1% of J*
  (``(J_best - J*) / J* <= x``, with J* the bracket's upper end), and
* ``gap <= 2%`` / ``gap <= 0.1%``: the certified gap is at most that
  fraction of the best objective, i.e. when the solver itself can know it.

Times are the minimum over ``--repeat`` runs (the machine may be shared).

Usage (from the repository root)::

    PYTHONPATH=$PWD python scripts/bench_smoothing.py [--lam 1e-4] [--repeat 2] [--losses roc_area prbep]
"""

import argparse
import lzma
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file
from threadpoolctl import threadpool_limits

from prbmrm.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.risk import DistributedRisk
from prbmrm.solvers import minimize

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a.xz"
LEVELS = (0.02, 1e-3)


def load_a9a(path):
    with lzma.open(path) as f:
        X, y = load_svmlight_file(f, n_features=123)
    return X.tocsr(), y


def run(X, y, loss, lam, method, rel_epsilon):
    """The Result of one run and its oracle's number of evaluations."""
    oracle = DistributedRisk(get_loss(loss), X, y, len(y), SerialComm())
    result = minimize(oracle, np.zeros(X.shape[1]), lam, method=method, rel_epsilon=rel_epsilon,
                      max_iter=100000)
    return result, oracle.evaluations


def first_time(history, reached):
    """Seconds of the first row where `reached` holds (NaN if never)."""
    index = np.flatnonzero(reached)
    return float(history["seconds_total"][index[0]]) if index.size else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--losses", nargs="+", default=["roc_area", "prbep"])
    args = parser.parse_args()
    X, y = load_a9a(DATA)
    print(f"a9a {X.shape[0]} x {X.shape[1]}, lam = {args.lam:g}, 1 process, 1 BLAS thread; "
          f"seconds, minimum over {args.repeat} runs\n")
    header = (f"{'loss':9} {'solver':13} {'rel_eps':>7} {'iter':>6} {'evals':>6} "
              + " ".join(f"{'J<=' + format(x, '.1%'):>9}" for x in LEVELS) + " "
              + " ".join(f"{'gap<=' + format(x, '.1%'):>10}" for x in LEVELS) + f" {'total':>8}")
    with threadpool_limits(1):
        for loss in args.losses:
            reference, _ = run(X, y, loss, args.lam, "smooth_lbfgs", 1e-6)
            runs = {}
            for method, rel in (("bmrm", 1e-3), ("smooth_lbfgs", 0.02), ("smooth_lbfgs", 1e-3)):
                runs[method, rel] = [run(X, y, loss, args.lam, method, rel) for _ in range(args.repeat)]
            results = [reference] + [result for group in runs.values() for result, _ in group]
            upper = min(result.fun for result in results)
            lower = max(result.lower_bound for result in results)
            print(f"{loss}: J* in [{lower:.8f}, {upper:.8f}] (width {(upper - lower) / upper:.1e} relative)")
            print(header)
            for (method, rel), group in runs.items():
                times = []
                for result, _ in group:
                    history = result.history
                    times.append([first_time(history, (history["best_objective"] - upper) <= x * upper)
                                  for x in LEVELS]
                                 + [first_time(history, history["gap"] <= x * history["best_objective"])
                                    for x in LEVELS]
                                 + [float(history["seconds_total"][-1])])
                times = np.array(times)
                best = [np.min(column[~np.isnan(column)]) if np.any(~np.isnan(column)) else np.nan
                        for column in times.T]
                result, evaluations = group[0]
                shown = [f"{t:.2f}" if np.isfinite(t) else "-" for t in best]
                print(f"{loss:9} {method:13} {rel:7.0e} {result.nit:6d} {evaluations:6d} "
                      + " ".join(f"{t:>9}" for t in shown[:2]) + " "
                      + " ".join(f"{t:>10}" for t in shown[2:4]) + f" {shown[4]:>8}")
            print()


if __name__ == "__main__":
    main()
