"""Time to reach 2% of the optimum (paper 003, Fig. 16): subLBFGS against BMRM and LS-BMRM, binary hinge.

Usage: PYTHONPATH=. python scripts/bench_fast.py [--data a9a w8a] [--lam 1e-4 1e-5] [--limit SECONDS]

Each solver runs serially on the whole training file until its certified gap is at
most 1e-3 relative or `--limit` seconds pass. The reference J* is the largest
certified lower bound any run reached (so "2% of the optimum" is judged against a
value at or below J*: never in the solvers' favour); a solver has reached it at the
first row with ``best_objective <= 1.02 J*``. Times include the risk evaluations,
subproblems and line searches (history ``seconds_total``).
"""

import argparse
import lzma
import os

import numpy as np
from sklearn.datasets import load_svmlight_file

from prbmrm.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.risk import DistributedRisk
from prbmrm.solvers import minimize

SOLVERS = ("bmrm", "lsbmrm", "sublbfgs")


def load(name):
    path = os.environ.get("PRBMRM_DATA", "/work/shared/data")
    with lzma.open(os.path.join(path, f"{name}.xz")) as f:
        X, y = load_svmlight_file(f)
    return X.tocsr(), y


def run(X, y, lam, method, limit):
    loss = get_loss("hinge")
    loss.prepare(np.array([-1.0, 1.0]), "binary")
    oracle = DistributedRisk(loss, X, y, len(y), SerialComm())

    def callback(row):
        if row.seconds_total > limit:
            raise StopIteration
    return minimize(oracle, np.zeros(X.shape[1]), lam, method=method, rel_epsilon=1e-3, max_iter=100000,
                    callback=callback)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["a9a", "w8a"])
    parser.add_argument("--lam", nargs="+", type=float, default=[1e-4, 1e-5])
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per run (default 120)")
    args = parser.parse_args()
    print(f"{'data':6} {'lam':>7} {'J* >=':>10} " + " ".join(f"{m + ' s (it)':>18}" for m in SOLVERS)
          + "   final gap/J per solver")
    for name in args.data:
        X, y = load(name)
        for lam in args.lam:
            results = {m: run(X, y, lam, m, args.limit) for m in SOLVERS}
            reference = max(float(np.max(r.history["lower_bound"])) for r in results.values())
            cells, gaps = [], []
            for m in SOLVERS:
                h = results[m].history
                reached = np.nonzero(h["best_objective"] <= 1.02 * reference)[0]
                cells.append(f"{h['seconds_total'][reached[0]]:9.2f} ({h['iteration'][reached[0]]:5d})"
                             if len(reached) else f"{'> ' + format(args.limit, 'g'):>17}")
                gaps.append(f"{results[m].gap / results[m].fun:.1e}")
            print(f"{name:6} {lam:7.0e} {reference:10.6f} " + " ".join(f"{c:>18}" for c in cells)
                  + "   " + " ".join(gaps), flush=True)


if __name__ == "__main__":
    main()
