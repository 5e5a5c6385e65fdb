"""Ranks that pay off: seconds per BMRM iteration at 1, 2, 4, 8, 16 ranks, and a9a on 1 against 2.

Fashion-MNIST-sized data (``bench_core.make_fashion``: 60,000 x 784, held
dense) in 16 shard files, hinge BMRM at lam 1e-4 for a fixed number of
iterations (no stopping test), at each rank count. Printed per rank count:
wall seconds per iteration on rank 0 (median over the iterations), split
into risk (rank 0's data pass), comm (broadcast and reproducible Allreduce,
including waiting for the slowest rank) and subproblem (rank 0 alone, while
the others wait in the broadcast); the CPU seconds per iteration the other
ranks use per second of the run (MPICH polls while it waits: near 100%
means a waiting rank burns a core, which an oversubscribed machine needs
for rank 0's subproblem); and
whether the machine is oversubscribed (more ranks than cores). Each count
runs twice: with MPICH's defaults and with ``MPIR_CVAR_CH4_PROGRESS_THROTTLE=1``
(a waiting rank calls usleep(1) after 4,096 polls without progress).

Then a least-squares fit of the defaults' per-iteration time,
``T(p) = s + t / p + c log p`` (s: serial part, t: the part that divides
over ranks, c: the cost of a doubling of the ranks in the reduction tree;
the comm share is comm over the iteration, medians),
and a9a (hinge, lam 1e-4, absolute gap 1e-4, 2 shards) trained to the end on
1 and on 2 ranks, alternated `--repeats` times: wall and CPU seconds and
iterations.

    python scripts/bench_ranks.py [--ranks 1 2 4 8 16] [--iterations 30] [--repeats 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data")
THROTTLE = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}


def worker(directory, iterations, lam, epsilon):
    """Run under mpiexec: train; rank 0 prints its history and every rank's seconds as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.solvers import minimize

    comm = get_comm()
    local = load_local(directory, comm)
    oracle = DistributedRisk(get_loss("hinge"), local.X, local.y, local.n_examples_total, comm,
                             local.blocks)
    comm.barrier()  # the timed part starts together on every rank
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_distributed(oracle, lambda risk: minimize(
        risk, np.zeros(oracle.dim), lam, method="bmrm", epsilon=epsilon, rel_epsilon=0, max_iter=iterations))
    mine = np.array([time.process_time() - cpu, oracle.total_seconds["risk"],
                     time.perf_counter() - wall])
    every = comm.gather_scalars(mine)
    if comm.is_root:
        print(json.dumps({"history": {k: v.tolist() for k, v in result.history.items()},
                          "cpu": every[0::3].tolist(), "risk": every[1::3].tolist(),
                          "wall": float(every[2]), "nit": int(result.nit), "fun": float(result.fun)}))


def run(directory, ranks, iterations, lam=1e-4, epsilon=0.0, env=None):
    environ = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks), sys.executable,
               __file__, "--worker", directory, "--iterations", str(iterations), "--lam", str(lam),
               "--epsilon", str(epsilon)]
    completed = subprocess.run(command, capture_output=True, text=True, env=environ, check=False,
                               stdin=subprocess.DEVNULL, timeout=3600)
    if completed.returncode != 0:
        sys.exit(f"worker failed on {ranks} rank(s):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def per_iteration(run_):
    """Median seconds per iteration of rank 0's phases, and the other ranks' CPU share of their wall time."""
    h = {k: np.asarray(v) for k, v in run_["history"].items()}
    phases = {k: float(np.median(h[f"seconds_{k}"])) for k in ("risk", "comm", "subproblem")}
    phases["total"] = float(np.median(h["seconds_risk"] + h["seconds_comm"] + h["seconds_subproblem"]))
    # A rank that sleeps while it waits uses less CPU than wall time; one that polls, all of it.
    phases["busy"] = float(np.mean(run_["cpu"][1:])) / run_["wall"] if len(run_["cpu"]) > 1 else np.nan
    phases["waiting"] = phases["total"] - float(np.median(h["seconds_risk"]))
    return phases


def fit_scaling(ranks, seconds):
    """Least-squares (s, t, c) of T(p) = s + t / p + c log p, and the fitted values."""
    p = np.asarray(ranks, dtype=np.float64)
    design = np.column_stack([np.ones_like(p), 1.0 / p, np.log(p)])
    coefficients = np.linalg.lstsq(design, np.asarray(seconds), rcond=None)[0]
    return coefficients, design @ coefficients


def a9a_shards(directory):
    from prbmrm.io import read_input, write_shards

    X, y, _ = read_input(os.path.join(DATA, "a9a.xz"))
    write_shards(X, y, directory, 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--epsilon", type=float, default=0.0)
    parser.add_argument("--skip-a9a", action="store_true")
    parser.add_argument("--workdir", help="where to write the shards (default: a temporary directory)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.iterations, args.lam, args.epsilon)
        return
    sys.path.insert(0, HERE)
    from bench_core import make_fashion

    cores = os.cpu_count()
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        fashion = os.path.join(workdir, "fashion")
        nnz, shape = make_fashion(fashion, parts=max(16, max(args.ranks)))
        print(f"Fashion-MNIST-sized: {shape[0]:,} x {shape[1]:,}, {nnz:,} nonzeros, held dense; "
              f"hinge BMRM lam {args.lam:g}, {args.iterations} iterations; {cores} cores")
        print(f"{'ranks':>5} {'mpich':>9} {'iter s':>9} {'risk s':>9} {'comm s':>9} {'sub s':>9} "
              f"{'comm share':>10} {'others busy':>12}  note")
        defaults = {}
        for ranks in args.ranks:
            for name, env in (("default", None), ("throttle", THROTTLE)):
                if ranks == 1 and env:
                    continue
                t = per_iteration(run(fashion, ranks, args.iterations, args.lam, env=env))
                if env is None:
                    defaults[ranks] = t["total"]
                note = f"load {os.getloadavg()[0]:.1f}" + (
                    f", oversubscribed ({ranks} ranks on {cores} cores)" if ranks > cores else "")
                print(f"{ranks:5d} {name:>9} {t['total']:9.5f} {t['risk']:9.5f} {t['comm']:9.5f} "
                      f"{t['subproblem']:9.5f} {t['comm'] / t['total']:10.1%} {t['busy']:12.1%}  {note}",
                      flush=True)
        ranks = sorted(defaults)
        if len(ranks) >= 3:
            (s, t, c), fitted = fit_scaling(ranks, [defaults[p] for p in ranks])
            print(f"\nT(p) = s + t/p + c log p fitted to the defaults: s = {s:.5f}, t = {t:.5f}, "
                  f"c = {c:.5f} s")
            for p, f in zip(ranks, fitted):
                print(f"  p = {p:2d}: measured {defaults[p]:.5f}, fitted {f:.5f}, "
                      f"ideal t/p + s(1) {defaults[ranks[0]] / p:.5f}")
        if args.skip_a9a:
            return
        a9a = os.path.join(workdir, "a9a")
        a9a_shards(a9a)
        print(f"\na9a, hinge BMRM, lam {args.lam:g}, absolute gap 1e-4, to the end; runs alternated")
        print(f"{'ranks':>5} {'iters':>6} {'wall s':>8} {'cpu s (rank 0)':>15} {'J':>12} {'load':>5}")
        for _ in range(args.repeats):
            for ranks in (1, 2):
                r = run(a9a, ranks, 100000, args.lam, epsilon=1e-4)
                print(f"{ranks:5d} {r['nit']:6d} {r['wall']:8.2f} {r['cpu'][0]:15.2f} {r['fun']:12.8f} "
                      f"{os.getloadavg()[0]:5.1f}", flush=True)


if __name__ == "__main__":
    main()
