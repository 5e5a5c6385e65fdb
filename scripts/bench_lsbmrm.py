"""Iterations of BMRM and LS-BMRM (paper 000, Alg. 2 and 3) to come within 1% of the optimum.

For each data set and lam, both solvers run from w = 0 until their certified
gap is at most ``--rel-gap`` (default 1e-4) times the objective. J* is then
known to lie in [largest lower bound, smallest objective] of the two runs (a
bracket of relative width <= rel-gap); the table uses J* = the smallest
objective and counts the iterations until the best objective so far is
within 1% of it, ``J(w_t) - J* <= 0.01 J*``. Iterations are risk
evaluations; LS-BMRM also runs one line search per iteration (``rounds``:
mean rounds of trial steps per search; ``s``: seconds of the whole run).

Usage (from the repository root, with prbmrm installed or on PYTHONPATH)::

    python scripts/bench_lsbmrm.py [--sets a9a w8a dna letter] [--lams 1e-4 1e-5 1e-6] [--theta 0.9]
"""

import argparse
import lzma
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file
from threadpoolctl import threadpool_limits

from prbmrm.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.risk import DistributedRisk
from prbmrm.solvers import minimize
from prbmrm.solvers import linesearch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = {"a9a": ("a9a.xz", "hinge"), "w8a": ("w8a.xz", "hinge"),
        "dna": ("dna.scale.xz", "multiclass_hinge"), "letter": ("letter.scale.xz", "multiclass_hinge")}


def oracle(name):
    """The serial risk oracle of a data set with its loss."""
    path, loss_name = SETS[name]
    with lzma.open(DATA / path) as f:
        X, y = load_svmlight_file(f)
    loss = get_loss(loss_name)
    if loss_name == "multiclass_hinge":
        loss.prepare(np.unique(y), "integer")
    return DistributedRisk(loss, X.tocsr(), y, len(y), SerialComm())


def run(risk, lam, method, rel_gap, max_iter, **options):
    """Return (result, seconds, mean rounds per line search)."""
    rounds = []
    search = linesearch.minimize_line

    def counting(*args, **kwargs):
        point, count = search(*args, **kwargs)
        rounds.append(count)
        return point, count

    linesearch.minimize_line = counting
    try:
        started = time.perf_counter()
        result = minimize(risk, np.zeros(risk.dim), lam, method=method, rel_epsilon=rel_gap,
                          max_iter=max_iter, **options)
        return result, time.perf_counter() - started, np.mean(rounds) if rounds else 0.0
    finally:
        linesearch.minimize_line = search


def reached(result, target):
    """First iteration whose best objective is at most `target` (None if never)."""
    hits = np.flatnonzero(result.history["best_objective"] <= target)
    return int(hits[0]) + 1 if hits.size else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--lams", nargs="+", type=float, default=[1e-4, 1e-5, 1e-6])
    parser.add_argument("--theta", type=float, default=0.9)
    parser.add_argument("--rel-gap", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=20000)
    args = parser.parse_args()
    print(f"{'set':>7} {'lam':>7} {'J* (bracket)':>27} {'BMRM it':>8} {'LS it':>6} {'LS/BMRM':>8} "
          f"{'BMRM it*':>9} {'LS it*':>7} {'BMRM s':>8} {'LS s':>7} {'rounds':>6}")
    for name in args.sets:
        risk = oracle(name)
        for lam in args.lams:
            plain, plain_seconds, _ = run(risk, lam, "bmrm", args.rel_gap, args.max_iter)
            searched, searched_seconds, rounds = run(risk, lam, "lsbmrm", args.rel_gap, args.max_iter,
                                                     theta=args.theta)
            optimum = min(plain.fun, searched.fun)
            lower = max(plain.lower_bound, searched.lower_bound)
            target = 1.01 * optimum
            it_plain, it_searched = reached(plain, target), reached(searched, target)
            ratio = f"{it_searched / it_plain:8.2f}" if it_plain and it_searched else f"{'-':>8}"
            print(f"{name:>7} {lam:7.0e} {optimum:.6g} [{lower:.6g}, {optimum:.6g}] {it_plain!s:>8} "
                  f"{it_searched!s:>6} {ratio} {plain.nit:9d} {searched.nit:7d} {plain_seconds:8.2f} "
                  f"{searched_seconds:7.2f} {rounds:6.2f}", flush=True)
    print("it: iterations to J - J* <= 0.01 J*; it*: to the certified gap <= rel-gap (J* bracket width).")


if __name__ == "__main__":
    with threadpool_limits(1):
        main()
