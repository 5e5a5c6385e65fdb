"""Benchmark the lambda path: iterations of one path run against independent runs per lambda.

On a9a (32,561 x 123, with a bias) trains hinge-loss BMRM for N lambdas
log-spaced from --largest down to --smallest (default 8 from 1e-1 to 1e-6),
once as independent runs from w = 0 and once as a path (``run(lam=[...])``:
largest first, each run warm-started from the previous w and bundle), all to
the same --rel-epsilon (at most --max-iter iterations each). Prints per
lambda the iterations and objectives of both, their relative difference
(each objective is certified within rel_epsilon of the optimum, so they must
agree to about that) and whether each converged, and the totals of
iterations and seconds.

    PYTHONPATH=. python scripts/bench_lambda_path.py [--lams 8] [--largest 1e-1] [--smallest 1e-6]
        [--loss hinge] [--solver bmrm] [--rel-epsilon 1e-3] [--rows N]
"""

import argparse
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lams", type=int, default=8)
    parser.add_argument("--largest", type=float, default=1e-1)
    parser.add_argument("--smallest", type=float, default=1e-6)
    parser.add_argument("--loss", default="hinge")
    parser.add_argument("--solver", default="bmrm")
    parser.add_argument("--rel-epsilon", type=float, default=1e-3)
    parser.add_argument("--max-iter", type=int, default=50000)
    parser.add_argument("--rows", type=int, default=0, help="use only the first ROWS examples (0: all)")
    args = parser.parse_args()

    from prbmrm.io import read_input
    from prbmrm.training import run

    X, y, _ = read_input(os.path.join(DATA, "a9a.xz"))
    if args.rows:
        X, y = X[:args.rows], y[:args.rows]
    lams = np.geomspace(args.largest, args.smallest, args.lams)
    options = dict(loss=args.loss, solver=args.solver, bias=True, rel_epsilon=args.rel_epsilon,
                   max_iter=args.max_iter)
    started = time.perf_counter()
    path = run((X, y), lam=list(lams), **options)[0]
    seconds = {"path": time.perf_counter() - started, "independent": 0.0}

    print(f"a9a {X.shape[0]} x {X.shape[1]} + bias, loss {args.loss}, solver {args.solver}, "
          f"rel_epsilon {args.rel_epsilon:g}; path: {seconds['path']:.1f} s")
    print(f"{'lambda':>10} {'iter indep':>10} {'iter path':>10} {'objective indep':>16} "
          f"{'objective path':>16} {'rel diff':>9}  converged indep/path", flush=True)
    totals = {"independent": 0, "path": 0}
    for lam, along in zip(lams, path.results):
        # Rows print as the independent runs finish: the small lambdas take long.
        started = time.perf_counter()
        alone = run((X, y), lam=float(lam), **options)[0]
        seconds["independent"] += time.perf_counter() - started
        totals["independent"] += alone.nit
        totals["path"] += along.nit
        difference = abs(along.fun - alone.fun) / abs(alone.fun)
        print(f"{lam:10.3g} {alone.nit:10d} {along.nit:10d} {alone.fun:16.10g} {along.fun:16.10g} "
              f"{difference:9.2e}  {alone.success}/{along.success}", flush=True)
    print(f"{'total':>10} {totals['independent']:10d} {totals['path']:10d}   iterations saved: "
          f"{1 - totals['path'] / totals['independent']:.1%}; seconds: independent "
          f"{seconds['independent']:.1f}, path {seconds['path']:.1f}")

if __name__ == "__main__":
    main()
