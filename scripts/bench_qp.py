"""Benchmark the BMRM dual QP solver against general QP solvers on real bundles.

Emulates BMRM (L2 regularizer, hinge loss, no pruning) on a9a and, when the
bundle reaches each requested size t, times one solve of that bundle's dual

    maximize_x  b^T x - 0.5 x^T Q x   s.t.  x >= 0, sum(x) = 1,  Q = A^T A / lam

with: prbmrm.regularizers.qp warm-started from the previous iteration's solution padded
with 0 (what BMRM does), prbmrm.regularizers.qp cold, DAQP, Clarabel, OSQP (high accuracy,
polished) and CVXPY with its default solver. Times are medians over
repeated solves (``in-run`` is the warm solve timed inside the BMRM loop
itself, between data passes, averaged over the preceding 10 iterations).
Objective columns are the dual value of each solver's x (clipped to the
simplex) minus Clarabel's: positive is better than Clarabel.

Usage (from the repository root, with prbmrm installed or on PYTHONPATH)::

    python scripts/bench_qp.py [--sizes 50 100 200 400] [--lams 1e-4 1e-6]
"""

import argparse
import lzma
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from prbmrm.regularizers.qp import solve_simplex_qp

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a.xz"


def load_a9a(path):
    """Return (X, y) of a9a as CSR and float arrays."""
    with lzma.open(path) as f:
        X, y = load_svmlight_file(f, n_features=123)
    return X.tocsr(), y


def hinge_plane(X, y, w):
    """Risk R(w) = mean(max(0, 1 - y Xw)) and the plane (a, b) at w."""
    margin = y * (X @ w)
    risk = np.maximum(0.0, 1.0 - margin).mean()
    a = -(X.T @ (y * (margin < 1.0))) / X.shape[0]
    return risk, a, risk - a @ w


def dual_value(Q, b, x):
    """Dual objective at x clipped and renormalised onto the simplex."""
    x = np.maximum(x, 0.0)
    x = x / x.sum()
    return b @ x - 0.5 * x @ Q @ x


def timed(fn, budget=0.3, min_reps=3, max_reps=200):
    """Median wall time of fn() over repeats filling about `budget` seconds."""
    times = []
    while len(times) < max_reps and (len(times) < min_reps or sum(times) < budget):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def run_daqp(Q, b):
    import daqp

    t = b.size
    A = np.ones((1, t))
    bupper = np.ones(t + 1)
    blower = np.concatenate((np.zeros(t), [1.0]))
    sense = np.concatenate((np.zeros(t, dtype=np.int32), [5])).astype(np.int32)
    x, _, _, _ = daqp.solve(Q, -b, A, bupper, blower, sense, eps_prox=-1e-6)
    return np.asarray(x)


def clarabel_problem(Q, b):
    """Data of the simplex QP in Clarabel's form: Ax + s = c, s in cones."""
    import clarabel

    t = b.size
    P = sp.triu(sp.csc_matrix(Q), format="csc")
    A = sp.vstack([sp.csc_matrix(np.ones((1, t))), -sp.identity(t, format="csc")], format="csc")
    c = np.concatenate(([1.0], np.zeros(t)))
    cones = [clarabel.ZeroConeT(1), clarabel.NonnegativeConeT(t)]
    return P, -b, A, c, cones


def run_clarabel(Q, b):
    import clarabel

    settings = clarabel.DefaultSettings()
    settings.verbose = False
    solver = clarabel.DefaultSolver(*clarabel_problem(Q, b), settings)
    return np.asarray(solver.solve().x)


def run_osqp(Q, b):
    import osqp

    t = b.size
    A = sp.vstack([sp.csc_matrix(np.ones((1, t))), sp.identity(t, format="csc")], format="csc")
    lo = np.concatenate(([1.0], np.zeros(t)))
    hi = np.concatenate(([1.0], np.full(t, np.inf)))
    solver = osqp.OSQP()
    solver.setup(sp.triu(sp.csc_matrix(Q), format="csc"), -b, A, lo, hi, verbose=False,
                 eps_abs=1e-10, eps_rel=1e-10, polishing=True, max_iter=200000)
    return np.asarray(solver.solve().x)


def run_cvxpy(Q, b):
    import cvxpy as cp

    x = cp.Variable(b.size)
    objective = cp.Maximize(b @ x - 0.5 * cp.quad_form(x, cp.psd_wrap(Q)))
    cp.Problem(objective, [x >= 0, cp.sum(x) == 1]).solve()
    return np.asarray(x.value)


def bench_lambda(X, y, lam, sizes):
    """Run BMRM on (X, y) with `lam` and print one table row per size."""
    d = X.shape[1]
    t_max = max(sizes)
    A = np.empty((t_max, d))
    b = np.empty(t_max)
    Q = np.empty((t_max, t_max))
    w = np.zeros(d)
    alpha = np.zeros(0)
    in_run = []
    data_pass = []
    cols = ["warm", "in-run", "cold", "daqp", "clarabel", "osqp", "cvxpy"]
    diff_cols = ["warm", "cold", "daqp", "osqp", "cvxpy"]
    print(f"\nlam = {lam:g}: ms per solve (piv: Newton steps of the warm solve)"
          f" | dual value minus Clarabel's")
    print(f"{'t':>4} {'|S|':>4} {'piv':>4} " + " ".join(f"{c:>8}" for c in cols)
          + " | " + " ".join(f"{c:>8}" for c in diff_cols))
    for t in range(1, t_max + 1):
        t0 = time.perf_counter()
        risk, a, offset = hinge_plane(X, y, w)
        data_pass.append(time.perf_counter() - t0)
        A[t - 1], b[t - 1] = a, offset
        Q[t - 1, :t] = A[:t] @ a / lam
        Q[:t, t - 1] = Q[t - 1, :t]
        Qt, bt = Q[:t, :t], b[:t]
        x0 = np.append(alpha, 0.0)
        t0 = time.perf_counter()
        res = solve_simplex_qp(Qt, bt, x0)
        in_run.append(time.perf_counter() - t0)
        if t in sizes:
            Qc = Qt.copy()
            tw, warm = timed(lambda: solve_simplex_qp(Qc, bt, x0))
            tc, cold = timed(lambda: solve_simplex_qp(Qc, bt))
            others = {name: timed(lambda fn=fn: fn(Qc, bt), min_reps=1 if name == "cvxpy" else 3)
                      for name, fn in [("daqp", run_daqp), ("clarabel", run_clarabel),
                                       ("osqp", run_osqp), ("cvxpy", run_cvxpy)]}
            ref = dual_value(Qc, bt, others["clarabel"][1])
            times = [tw, float(np.mean(in_run[-10:])), tc] + [others[k][0] for k in cols[3:]]
            diffs = [warm.value - ref, cold.value - ref] + [
                dual_value(Qc, bt, others[k][1]) - ref for k in ("daqp", "osqp", "cvxpy")]
            print(f"{t:4d} {np.count_nonzero(warm.x):4d} {warm.iterations:4d} "
                  + " ".join(f"{1e3 * s:8.3f}" for s in times) + " | "
                  + " ".join(f"{v:8.1e}" for v in diffs), flush=True)
        alpha = res.x
        w = -(A[:t].T @ alpha) / lam
    print(f"all {t_max} warm solves inside the run: {1e3 * sum(in_run):.1f} ms in total,"
          f" {1e3 * np.mean(in_run):.3f} ms mean, {1e3 * max(in_run):.3f} ms max;"
          f" hinge risk and subgradient: {1e3 * np.mean(data_pass):.3f} ms mean")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400],
                        help="bundle sizes t at which to benchmark")
    parser.add_argument("--lams", type=float, nargs="+", default=[1e-4, 1e-6],
                        help="regularization constants")
    parser.add_argument("--data", type=Path, default=DATA, help="a9a in SVMlight format (.xz)")
    args = parser.parse_args()
    X, y = load_a9a(args.data)
    print(f"a9a: {X.shape[0]} examples, {X.shape[1]} features; hinge loss, no pruning")
    for lam in args.lams:
        bench_lambda(X, y, lam, sorted(set(args.sizes)))


if __name__ == "__main__":
    main()
