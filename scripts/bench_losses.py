"""Benchmark the O(m log m) risk computations of roc_area and ordinal regression.

For m = 1e4, 3e4, 1e5, 3e5, 1e6 (by default) times one evaluation of
``loss.coefficients(f, y)`` -- the part of the risk that runs on rank 0 over
all m scores (risk and per-example coefficients; the products X f and X^T c
are the same as for any scalar loss and are not included). Scores are
synthetic: f ~ N(0, 1) plus a label-dependent shift, so that the hinge of
about half of the pairs is active; roc_area gets labels +-1 (30% positive),
ordinal 10 levels (integers 1..10, uniform), with the constant and linear
costs. Each time is the median over repeats filling about `--budget` seconds.

The exponent is the least-squares slope of log(time) against log(m log m):
1 means the time grows as m log m.

Usage (from the repository root, with prbmrm installed or on PYTHONPATH)::

    python scripts/bench_losses.py [--sizes 1e4 3e4 1e5 3e5 1e6] [--levels 10] [--budget 1]
"""

import argparse
import time

import numpy as np

from prbmrm.losses import get_loss


def timed(fn, budget, min_reps=3, max_reps=50):
    """Median wall time of fn() over repeats filling about `budget` seconds."""
    times = []
    while len(times) < max_reps and (len(times) < min_reps or sum(times) < budget):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return float(np.median(times)), len(times)


def problem(name, m, levels, rng):
    """Synthetic scores and labels for `name`."""
    if name == "roc_area":
        y = np.where(rng.random(m) < 0.3, 1.0, -1.0)
        return rng.normal(size=m) + 0.5 * y, y
    y = rng.integers(1, levels + 1, size=m).astype(np.float64)
    return rng.normal(size=m) + 0.3 * y, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e4, 3e4, 1e5, 3e5, 1e6])
    parser.add_argument("--levels", type=int, default=10, help="ordinal levels (default 10)")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds of repeats per measurement (default 1)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes]
    cases = [("roc_area", {}), ("ordinal", {"cost": "constant"}), ("ordinal", {"cost": "linear"})]
    rng = np.random.default_rng(0)
    print(f"one coefficients() evaluation on rank 0; ordinal with {args.levels} levels; "
          f"median over repeats of about {args.budget:g} s")
    header = f"{'loss':<18}" + "".join(f"{f'm={m:.0e}':>12}" for m in sizes) + f"{'exponent':>10}"
    m = np.array(sizes, dtype=np.float64)
    rows = []
    for name, params in cases:
        loss = get_loss(name, **params)
        seconds = []
        for size in sizes:
            f, y = problem(name, size, args.levels, rng)
            loss.coefficients(f, y)  # warm up
            seconds.append(timed(lambda: loss.coefficients(f, y), args.budget)[0])
        seconds = np.array(seconds)
        exponent = np.polyfit(np.log(m * np.log(m)), np.log(seconds), 1)[0]
        rows.append((name + (f" ({params['cost']})" if params else ""), seconds, exponent))
    print("\ntime of one evaluation (ms); exponent = slope of log time vs log(m log m)")
    print(header)
    print("-" * len(header))
    for label, seconds, exponent in rows:
        print(f"{label:<18}" + "".join(f"{t * 1e3:12.2f}" for t in seconds) + f"{exponent:10.2f}")
    print("\ntime / (m ln m) (ns): constant if the time grows as m log m")
    print(header[:-10])
    print("-" * (len(header) - 10))
    for label, seconds, _ in rows:
        print(f"{label:<18}" + "".join(f"{t * 1e9 / (n * np.log(n)):12.2f}"
                                      for t, n in zip(seconds, m)))

if __name__ == "__main__":
    main()
