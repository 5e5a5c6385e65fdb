"""No O(n) work on rank 0: the spread multivariate losses against hinge on the same shards, per rank, under mpiexec.

For each loss (by default ``roc_area`` and ``prbep``, spread over the ranks
by the sample sort of :class:`prbmrm.losses.multivariate.ScoreOrder`;
``hinge``, the decomposable reference; with ``--gather``, also each spread
loss the old way: every score gathered to rank 0, which sorts and counts
alone) one mpiexec run loads the shards and makes a few BMRM iterations (lam
1e-4, no stopping test). The runs alternate loss by loss, ``--rounds``
times. Printed per run: every rank's peak RSS (MB, ``ru_maxrss``: loading
included, so the ranks of one run compare), seconds per evaluation of the
risk on rank 0 (its data pass and, for a multivariate loss, the sort's
exchanges: ``risk``) and with the broadcast and reduction (``risk+comm``),
medians over the iterations; every rank's CPU seconds per iteration (the
whole solve over the evaluations: waiting ranks poll, so CPU includes waits,
but not the time a loaded machine gives others); the load average. Then the
ratios the acceptance of P14 item 5 names: rank 0's peak RSS over rank 1's,
and the risk time over hinge's (medians over the rounds).

    python -m prbmrm.cli.shard --parts 2 --out DIR DATA     # e.g. 5,000,000 rows
    python scripts/bench_multivariate.py DIR [--ranks 2] [--iterations 5] [--rounds 2] [--gather]
        [--losses roc_area,prbep]
    python scripts/bench_multivariate.py --make DIR [--rows 5000000] [--features 123] [--nonzeros 14]
        # a synthetic sparse set like a9a (binary features, one per group of features/nonzeros columns)
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def worker(directory, loss_name, gather, iterations):
    """Run under mpiexec: a few BMRM iterations; rank 0 prints every rank's figures as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss
    from prbmrm.solvers import minimize

    comm = get_comm()
    local = load_local(directory, comm)
    loss = get_loss(loss_name)
    if gather:
        loss.spread = False  # the old way: rank 0 gathers every score and sorts them alone
    oracle = DistributedRisk(loss, local.X, local.y, local.n_examples_total, comm, local.blocks)
    comm.barrier()
    cpu = time.process_time()
    result = run_distributed(oracle, lambda risk: minimize(
        risk, np.zeros(oracle.dim), 1e-4, method="bmrm", epsilon=0.0, rel_epsilon=0, max_iter=iterations))
    cpu = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    every = comm.allgather_array(np.array([peak, cpu / max(oracle.evaluations, 1)]))
    if comm.is_root:
        history = result.history
        print(json.dumps({"peak_mb": every[:, 0].tolist(), "cpu": every[:, 1].tolist(),
                          "risk": float(np.median(history["seconds_risk"])),
                          "risk_comm": float(np.median(np.add(history["seconds_risk"], history["seconds_comm"]))),
                          "nit": int(result.nit), "fun": float(result.fun)}))


def worker_points(directory, losses, points):
    """Run under mpiexec: every loss's risk at the same points, loss after loss at each point, in one process;
    rank 0 prints every rank's median CPU seconds per evaluation of each loss as JSON."""
    from prbmrm.distributed.comm import get_comm
    from prbmrm.distributed.oracle import DistributedRisk, run_distributed
    from prbmrm.io import load_local
    from prbmrm.losses import get_loss

    comm = get_comm()
    local = load_local(directory, comm)
    oracles = {name: DistributedRisk(get_loss(name), local.X, local.y, local.n_examples_total, comm, local.blocks)
               for name in losses}
    rng = np.random.default_rng(0)
    w = rng.normal(size=local.X.shape[1]) * 0.1
    cpu = {name: [] for name in losses}
    for _ in range(points + 1):
        w = w + 0.01 * rng.normal(size=w.size)  # nearby points, as a solver's
        for name, oracle in oracles.items():
            comm.barrier()
            started = time.process_time()
            run_distributed(oracle, lambda risk: risk(w))
            cpu[name].append(time.process_time() - started)
    # The first evaluation of each makes its arrays: left out.
    every = comm.allgather_array(np.array([np.median(cpu[name][1:]) for name in losses]))
    if comm.is_root:
        print(json.dumps({name: every[:, k].tolist() for k, name in enumerate(losses)}))


def run(directory, ranks, loss, gather, iterations, points=0):
    environ = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(ranks), sys.executable, __file__,
               directory, "--worker", loss, "--iterations", str(iterations), "--points", str(points)]
    command += ["--gather"] * gather
    completed = subprocess.run(command, capture_output=True, text=True, env=environ, check=False,
                               stdin=subprocess.DEVNULL, timeout=3600)
    if completed.returncode != 0:
        sys.exit(f"{loss} failed on {ranks} ranks:\n{completed.stdout[-2000:]}\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def make(directory, rows, d=123, k=14, seed=0):
    """A synthetic a9a-like sparse set (d binary features, k per row, labels +-1 about half each)."""
    import scipy.sparse as sp

    from prbmrm.io import write_shards

    rng = np.random.default_rng(seed)
    columns = np.arange(k) * (d // k) + rng.integers(0, d // k, size=(rows, k))
    X = sp.csr_matrix((np.ones(rows * k), columns.ravel(), np.arange(0, rows * k + 1, k)), shape=(rows, d))
    margin = X @ rng.normal(size=d) + 2.0 * rng.normal(size=rows)
    write_shards(X, np.where(margin > np.median(margin), 1.0, -1.0), directory, 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the shard directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gather", action="store_true",
                        help="also run each spread loss gathered to rank 0 (the old way)")
    parser.add_argument("--losses", default="roc_area,prbep", help="the spread losses to compare with hinge")
    parser.add_argument("--make", action="store_true", help="write a synthetic set into the directory and stop")
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--features", type=int, default=123)
    parser.add_argument("--nonzeros", type=int, default=14)
    parser.add_argument("--points", type=int, default=12,
                        help="per round, also every loss's risk at this many points in one process (0: none)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker and args.points:
        worker_points(args.directory, args.worker.split(","), args.points)
        return
    if args.worker:
        worker(args.directory, args.worker, args.gather, args.iterations)
        return
    if args.make:
        make(args.directory, args.rows, args.features, args.nonzeros)
        return
    spread = args.losses.split(",")
    cases = [(loss, False) for loss in spread] + [("hinge", False)] + [(loss, True) for loss in spread] * args.gather
    results, points = {case: [] for case in cases}, []
    print(f"{args.directory}: {args.ranks} ranks, BMRM lam 1e-4, {args.iterations} iterations per run; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'loss':>19} {'round':>5} {'risk s/it':>10} {'risk+comm':>10} {'CPU s/it per rank':>18}  "
          "peak RSS MB per rank")
    for round_ in range(args.rounds):
        for loss, gather in cases:
            started = time.perf_counter()
            figures = run(args.directory, args.ranks, loss, gather, args.iterations)
            results[(loss, gather)].append(figures)
            label = loss + " (gathered)" * gather
            print(f"{label:>19} {round_ + 1:>5} {figures['risk']:>10.3f} {figures['risk_comm']:>10.3f} "
                  + f"{' '.join(f'{c:.3f}' for c in figures['cpu']):>18}  "
                  + " ".join(f"{mb:.0f}" for mb in figures["peak_mb"])
                  + f"   ({time.perf_counter() - started:.0f} s wall, load {os.getloadavg()[0]:.1f})", flush=True)
        if args.points:
            every = run(args.directory, args.ranks, ",".join(["hinge"] + spread), False, 0, args.points)
            points.append(every)
            print(f"{'same process':>19} {round_ + 1:>5}  CPU ms per evaluation per rank: "
                  + ", ".join(f"{name} {' '.join(f'{1000 * c:.1f}' for c in cpu)}" for name, cpu in every.items())
                  + f"   (load {os.getloadavg()[0]:.1f})", flush=True)

    def median(case, key):
        return float(np.median([r[key] for r in results[case]]))

    hinge = ("hinge", False)
    for case in cases:
        if case != hinge:
            rss = [r["peak_mb"][0] / r["peak_mb"][1] for r in results[case]]
            label = case[0] + " (gathered)" * case[1]
            cpu = [r["cpu"][0] for r in results[case]]
            hinge_cpu = [r["cpu"][0] for r in results[hinge]]
            print(f"{label}: rank 0 / rank 1 peak RSS {np.median(rss):.2f} (acceptance <= 1.2); risk per "
                  f"iteration / hinge's {median(case, 'risk') / median(hinge, 'risk'):.2f}, with comm "
                  f"{median(case, 'risk_comm') / median(hinge, 'risk_comm'):.2f} (acceptance <= 1.5); "
                  f"rank 0's CPU per iteration / hinge's {np.median(cpu) / np.median(hinge_cpu):.2f}")
    for loss in spread * bool(points):
        ratio = [max(r[loss]) / max(r["hinge"]) for r in points]
        print(f"{loss}: CPU per risk evaluation / hinge's, interleaved in one process (the busier rank), "
              f"median over rounds {np.median(ratio):.2f} (rounds: {' '.join(f'{q:.2f}' for q in ratio)})")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
