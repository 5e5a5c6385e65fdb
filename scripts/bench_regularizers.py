"""Time each regularizer's subproblem solve inside BMRM on a9a (hinge loss) at a given bundle size t.

Emulates BMRM without plane pruning (the bundle holds i planes at iteration
i) for each regularizer and prints

- warm: the median seconds of the warm-started solve over iterations
  ``t - 10 .. t + 10``, as BMRM runs it (previous multipliers padded with 0;
  for l1 the HiGHS model with its basis, one new row);
- cold: the seconds of one solve of the (t + 10)-plane bundle from scratch
  (a fresh regularizer, no multipliers);
- the relative gap ``(best J - lower bound) / best J`` reached at iteration
  t + 10 (a tiny gap means BMRM had converged before t, so the late solves
  are easy) and the nonzero count of the last w.

Usage (from the repository root, with prbmrm installed or on PYTHONPATH)::

    python scripts/bench_regularizers.py [--t 100] [--lam 1e-4] [--entropy-lam 1e-3]

The unnormalized entropy's weights grow like ``exp(|a| / lam)``: a9a's
subgradients overflow them below lam of about 1e-4, so it runs at
``--entropy-lam``. With ``normalized_entropy`` w lies on the simplex, where
a9a's 0/1 features keep every margin below 1 and the hinge loss is linear:
BMRM is exact after 2 planes. It runs on the features times ``--scale``.
"""

import argparse
import lzma
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file

from prbmrm.distributed.comm import SerialComm
from prbmrm.losses import get_loss
from prbmrm.regularizers import get_regularizer
from prbmrm.distributed.oracle import DistributedRisk
from prbmrm.solvers import Bundle

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a.xz"


def cases(d):
    """(label, name, params); the quadratic form once with a diagonal, once with a dense B."""
    M = np.random.default_rng(0).normal(size=(d, d)) / np.sqrt(d)
    return [("l2", "l2", {}), ("l1", "l1", {}), ("lp (p=1.5)", "lp", {"p": 1.5}),
            ("quadratic (diagonal B)", "quadratic", {"B": 1.0 + np.arange(d) / d}),
            ("quadratic (dense B)", "quadratic", {"B": np.eye(d) + M @ M.T}),
            ("entropy", "entropy", {}), ("normalized_entropy", "normalized_entropy", {}),
            ("elastic_net (0.5)", "elastic_net", {"l1_ratio": 0.5})]


def run(oracle, reg, lam, iterations):
    """BMRM's loop without pruning; return the bundle, per-iteration solve seconds, last w and gap."""
    dim = oracle.dim
    reg.prepare(dim)
    bundle = Bundle(dim, reg.metric)
    w, alpha, best, seconds = reg.initial_point(dim), np.zeros(0), np.inf, []
    for _ in range(iterations):
        r, a = oracle(w)
        best = min(best, lam * reg.value(w) + r)
        bundle.add(a, r - a @ w)
        started = time.perf_counter()
        w, lower_bound, alpha = reg.solve_subproblem(bundle, lam, np.append(alpha, 0.0))
        seconds.append(time.perf_counter() - started)
    return bundle, np.array(seconds), w, (best - lower_bound) / abs(best)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--t", type=int, default=100, help="bundle size at which to time (default 100)")
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--entropy-lam", type=float, default=1e-3)
    parser.add_argument("--scale", type=float, default=10.0,
                        help="feature scale for normalized_entropy (default 10)")
    args = parser.parse_args()
    with lzma.open(DATA) as f:
        X, y = load_svmlight_file(f, n_features=123)
    X = X.tocsr()
    d = X.shape[1]
    print(f"a9a {X.shape[0]} x {d}, hinge, no pruning; seconds per subproblem solve at t = {args.t}")
    print(f"{'regularizer':24s} {'lam':>7s} {'warm (median)':>13s} {'warm (max)':>10s} {'cold':>9s} "
          f"{'rel. gap':>9s} {'nonzeros':>8s}")
    for label, name, params in cases(d):
        lam = args.entropy_lam if name == "entropy" else args.lam
        scale = args.scale if name == "normalized_entropy" else 1.0
        oracle = DistributedRisk(get_loss("hinge"), X * scale, y, X.shape[0], SerialComm())
        bundle, seconds, w, gap = run(oracle, get_regularizer(name, **params), lam, args.t + 10)
        cold = get_regularizer(name, **params)
        cold.prepare(d)
        started = time.perf_counter()
        cold.solve_subproblem(bundle, lam)
        cold_seconds = time.perf_counter() - started
        late = seconds[args.t - 11:]
        print(f"{label:24s} {lam:7.0e} {np.median(late):13.5f} {late.max():10.5f} {cold_seconds:9.5f} "
              f"{gap:9.1e} {np.count_nonzero(w):8d}{'' if scale == 1 else f'  (features x {scale:g})'}",
              flush=True)


if __name__ == "__main__":
    main()
