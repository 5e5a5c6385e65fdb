"""Benchmark Pragam's convergence rate: the duality gap against the iteration k on a9a.

Paper 001 (eq. 26) bounds Pragam's gap by ``J(w_k) - D(alpha_k) <= 2 L / (n (k+1) (k+2))``,
O(1/k^2). This script trains the hinge SVM on the full a9a (32,561 x 123, from
../shared/data, sharded into 4 files) with ``--solver pragam`` (or ``pragam_b`` with
``--offset``: the appended constant feature is the unregularized offset), lam 1e-4 by default,
until the gap is 1e-4 of the objective or ``--max-iter``, and prints, at k = 1, 2, 5, 10, 20,
50, ...: the objective J(w_k), the best J, the certified lower bound max_j D(alpha_j), the gap
(best J - lower bound) and the bound of eq. 26. It then fits log(gap) = c + slope log(k) by
least squares over k >= 10 (the early iterations are dominated by the large starting mu) and
over the last decade of k, and prints the slopes: the paper's rate is slope <= -2.

    python scripts/bench_pragam.py [--lam 1e-4] [--offset] [--max-iter 20000] [--rel-epsilon 1e-4]
    mpiexec -n 2 python scripts/bench_pragam.py ...
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data")


def fitted_slope(k, gap):
    """Least-squares slope of log(gap) against log(k)."""
    return float(np.polyfit(np.log(k), np.log(gap), 1)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--offset", action="store_true", help="pragam_b (unregularized offset)")
    parser.add_argument("--max-iter", type=int, default=20000)
    parser.add_argument("--rel-epsilon", type=float, default=1e-4)
    args = parser.parse_args()

    from prbmrm.distributed.comm import get_comm
    from prbmrm.io import read_input, write_shards
    from prbmrm.training import run

    comm = get_comm()
    # One directory for every rank (each would otherwise make its own).
    workdir = comm.bcast_object(tempfile.mkdtemp() if comm.is_root else None)
    try:
        shards = os.path.join(workdir, "a9a")
        if comm.is_root:
            X, y, _ = read_input(os.path.join(DATA, "a9a.xz"))
            write_shards(X, y, shards, 4)
        comm.barrier()
        method = "pragam_b" if args.offset else "pragam"
        started = time.perf_counter()
        result, local, _ = run(shards, loss="hinge", lam=args.lam, bias=args.offset, solver=method,
                               rel_epsilon=args.rel_epsilon, max_iter=args.max_iter, comm=comm)
        seconds = time.perf_counter() - started
    finally:
        comm.barrier()
        if comm.is_root:
            shutil.rmtree(workdir)
    if not comm.is_root:
        return
    h = result.history
    k = h["iteration"]
    # L as Pragam estimates it (the same power iterations, on one process).
    from prbmrm.distributed.comm import SerialComm
    from prbmrm.solvers.dual import SVMDual
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk

    X, y, _ = read_input(os.path.join(DATA, "a9a.xz"))
    if args.offset:
        import scipy.sparse as sp

        X = sp.hstack([X, np.ones((X.shape[0], 1))], format="csr")
    L = SVMDual(DistributedRisk(get_loss("hinge"), X, y, len(y), SerialComm()), args.lam,
                args.offset).lipschitz()
    n = local.n_examples_total
    print(f"a9a, {n} x {local.n_features}, {method}, lam {args.lam:g}, {comm.size} rank(s): "
          f"{result.nit} iterations in {seconds:.1f} s ({result.message}); L = {L:.4g}")
    print(f"{'k':>6} {'J(w_k)':>13} {'best J':>13} {'lower bound':>13} {'gap':>10} {'eq. 26':>10}")
    shown = sorted({int(m * 10 ** e) for e in range(6) for m in (1, 2, 5)} | {int(k[-1])})
    for i in [int(j) - 1 for j in shown if j <= k[-1]]:
        bound = 2 * L / (n * (k[i] + 1) * (k[i] + 2))
        print(f"{k[i]:6d} {h['objective'][i]:13.6e} {h['best_objective'][i]:13.6e} "
              f"{h['lower_bound'][i]:13.6e} {h['gap'][i]:10.3e} {bound:10.3e}")
    tail = k >= 10
    last = k >= k[-1] / 10
    print(f"fitted log-log slope of the gap against k: {fitted_slope(k[tail], h['gap'][tail]):.2f} "
          f"for k >= 10, {fitted_slope(k[last], h['gap'][last]):.2f} for k >= {int(k[-1] // 10)} "
          "(paper: O(1/k^2), slope <= -2)")
    print(f"seconds per iteration: data {np.mean(h['seconds_risk']) * 1e3:.2f} ms, projections "
          f"{np.mean(h['seconds_subproblem']) * 1e3:.2f} ms, communication "
          f"{np.mean(h['seconds_comm']) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
